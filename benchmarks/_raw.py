"""MPI's own collectives as a program calls them: bare mpi4py calls over the sweep's buffers, outside npddp.

The sweep's ``raw`` row: ``comm.Allreduce``, ``Allgather``, ``Reduce_scatter_block``, ``Alltoall`` or
``Bcast`` on the same arrays as the ``mpi`` backend's row, with nothing between the calls (no argument
check, no deadline, no wrapper), so the ``mpi`` row's distance from it is what npddp adds to MPI. The
calls that return a new array in npddp (all-gather, reduce-scatter, all-to-all) write here into one
output array per shape and dtype, kept and reused, as a program's loop does. Not a backend: it has no
check and never times out.
"""

from __future__ import annotations

import numpy as np

from benchmarks.columns import RAW

#: npddp's op names -> the names of MPI's ops (looked up when a loop is made: importing this module loads no MPI)
_OPS = {"sum": "SUM", "prod": "PROD", "max": "MAX", "min": "MIN", "avg": "SUM"}


class RawMPI:
    """npddp's collective calls, each one bare MPI call on ``comm`` (``MPI_IN_PLACE`` where npddp works in place)."""

    name = RAW

    def __init__(self, comm):
        from mpi4py import MPI   # here, not at import: the sweep says in one line when mpi4py is missing

        self.comm, self.in_place = comm, MPI.IN_PLACE
        self.ops = {name: getattr(MPI, mpi_name) for name, mpi_name in _OPS.items()}
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._outputs: dict = {}   # (shape, dtype) -> the reused output array

    def _output(self, shape: tuple, dtype) -> np.ndarray:
        """The kept output array of ``shape`` and ``dtype`` (made on first use)."""
        key = (tuple(shape), np.dtype(dtype).str)
        if key not in self._outputs:
            self._outputs[key] = np.empty(shape, dtype=dtype)
        return self._outputs[key]

    def _scale(self, out: np.ndarray, op: str) -> np.ndarray:
        """``avg``: the sum divided by the ranks, in place."""
        if op == "avg":
            np.multiply(out, 1.0 / self.size, out=out)
        return out

    def allreduce(self, buf: np.ndarray, op: str = "sum", out: np.ndarray | None = None) -> np.ndarray:
        """MPI_Allreduce of ``buf`` into ``out`` (in place when None); ``avg`` sums, then scales."""
        if out is None or out is buf:
            self.comm.Allreduce(self.in_place, buf, op=self.ops[op])
            out = buf
        else:
            self.comm.Allreduce(buf, out, op=self.ops[op])
        return self._scale(out, op)

    def allgather(self, buf: np.ndarray) -> np.ndarray:
        """MPI_Allgather of ``buf`` into the kept array of shape ``(size, *buf.shape)``."""
        out = self._output((self.size, *buf.shape), buf.dtype)
        self.comm.Allgather(buf, out)
        return out

    def reduce_scatter(self, buf: np.ndarray, op: str = "sum") -> np.ndarray:
        """MPI_Reduce_scatter_block of the flat ``buf`` (``size`` equal blocks) into the kept block."""
        flat = buf.reshape(-1)
        out = self._output((flat.size // self.size,), buf.dtype)
        self.comm.Reduce_scatter_block(flat, out, op=self.ops[op])
        return self._scale(out, op)

    def alltoall(self, buf: np.ndarray) -> np.ndarray:
        """MPI_Alltoall of ``buf`` (shape ``(size, ...)``: row p goes to rank p) into the kept array of its shape."""
        out = self._output(buf.shape, buf.dtype)
        self.comm.Alltoall(buf, out)
        return out

    def broadcast(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        """MPI_Bcast of ``buf`` from ``root``, in place."""
        self.comm.Bcast(buf, root=root)
        return buf
