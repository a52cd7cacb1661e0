"""MPI's own all-reduce as a program calls it: a bare mpi4py loop over the sweep's buffers, outside npddp.

The sweep's ``raw`` row: ``comm.Allreduce`` on the same arrays as the ``mpi`` backend's row, with
nothing between the calls (no argument check, no deadline, no wrapper), so the ``mpi`` row's
distance from it is what npddp adds to MPI. Not a backend: it has no check and never times out.
"""

from __future__ import annotations

import numpy as np

from benchmarks.columns import RAW

#: npddp's op names -> the names of MPI's ops (looked up when a loop is made: importing this module loads no MPI)
_OPS = {"sum": "SUM", "prod": "PROD", "max": "MAX", "min": "MIN", "avg": "SUM"}


class RawMPI:
    """``allreduce(buf, op, out)`` as one ``MPI_Allreduce`` of ``comm`` (``MPI_IN_PLACE`` in place)."""

    name = RAW

    def __init__(self, comm):
        from mpi4py import MPI   # here, not at import: the sweep says in one line when mpi4py is missing

        self.comm, self.in_place = comm, MPI.IN_PLACE
        self.ops = {name: getattr(MPI, mpi_name) for name, mpi_name in _OPS.items()}
        self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def allreduce(self, buf: np.ndarray, op: str = "sum", out: np.ndarray | None = None) -> np.ndarray:
        """MPI_Allreduce of ``buf`` into ``out`` (in place when None); ``avg`` sums, then scales."""
        if out is None or out is buf:
            self.comm.Allreduce(self.in_place, buf, op=self.ops[op])
            out = buf
        else:
            self.comm.Allreduce(buf, out, op=self.ops[op])
        if op == "avg":
            np.multiply(out, 1.0 / self.size, out=out)
        return out
