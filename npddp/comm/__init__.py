"""Communicators: the protocol, and backends chosen by name with :func:`create`."""

from __future__ import annotations

from ._common import DTYPES, OPS
from .base import Communicator, Work

BACKENDS = ("mpi", "ring", "naive")

__all__ = ["BACKENDS", "DTYPES", "OPS", "Communicator", "Work", "create"]


def create(name: str, mpi_comm=None) -> Communicator:
    """Build the backend called ``name`` over ``mpi_comm`` (default ``MPI.COMM_WORLD``)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; valid backends: {', '.join(BACKENDS)}")
    if mpi_comm is None:
        from mpi4py import MPI
        mpi_comm = MPI.COMM_WORLD
    if name == "mpi":
        from .mpi import MPICommunicator
        return MPICommunicator(mpi_comm)
    if name == "ring":
        from .ring import RingCommunicator
        return RingCommunicator(mpi_comm)
    from .naive import NaiveCommunicator
    return NaiveCommunicator(mpi_comm)
