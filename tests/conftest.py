"""Fixtures shared by the whole suite: the MPI world, and checks that keep all ranks in step.

MPI tests make every collective call on all ranks before asserting. These checks gather what
each rank saw with mpi4py's own buffer collectives, so a failure seen on one rank fails every
rank at the same point instead of leaving the others waiting in the next collective.
mpi4py is imported only when a fixture is used, so serial tests need no MPI.
"""

from __future__ import annotations

import numpy as np
import pytest


def _world(mpi_comm):
    """``mpi_comm``, or COMM_WORLD when None."""
    if mpi_comm is None:
        from mpi4py import MPI
        mpi_comm = MPI.COMM_WORLD
    return mpi_comm


def check_all_ranks(ok: bool, message: str = "", mpi_comm=None) -> None:
    """Fail on every rank unless ``ok`` holds on every rank; the error names the failing ranks."""
    comm = _world(mpi_comm)
    flags = np.empty(comm.Get_size(), dtype=np.int32)  # (size,)
    comm.Allgather(np.array([1 if ok else 0], dtype=np.int32), flags)
    bad = np.flatnonzero(flags == 0).tolist()
    assert not bad, f"failed on ranks {bad}" + (f"; on rank {comm.Get_rank()}: {message}" if not ok else "")


def check_ranks_agree(array: np.ndarray, mpi_comm=None) -> np.ndarray:
    """All-gather ``array`` and fail on every rank unless all copies have the same dtype, shape and bits.

    Returns the gathered bytes, shape ``(size, array.nbytes)``.
    """
    comm = _world(mpi_comm)
    size = comm.Get_size()
    meta = np.frombuffer(f"{array.dtype.str}{array.shape}".encode()[:64].ljust(64), dtype=np.uint8)
    metas = np.empty((size, 64), dtype=np.uint8)  # (size, 64)
    comm.Allgather(meta, metas)
    differ = [r for r in range(size) if not np.array_equal(metas[r], metas[0])]
    assert not differ, f"ranks {differ} hold a different dtype/shape than rank 0: " + \
        ", ".join(bytes(metas[r]).decode().strip() for r in range(size))
    local = np.ascontiguousarray(array).reshape(-1).view(np.uint8)  # (nbytes,)
    gathered = np.empty((size, local.size), dtype=np.uint8)  # (size, nbytes)
    comm.Allgather(local, gathered)
    differ = [r for r in range(size) if not np.array_equal(gathered[r], gathered[0])]
    assert not differ, f"ranks {differ} hold different bits than rank 0 ({array.dtype}, shape {array.shape})"
    return gathered


@pytest.fixture
def comm_world():
    """mpi4py's ``MPI.COMM_WORLD``."""
    from mpi4py import MPI
    return MPI.COMM_WORLD


@pytest.fixture
def assert_all_ranks():
    """``assert_all_ranks(ok, message="", mpi_comm=None)``: fail everywhere unless ``ok`` on every rank."""
    return check_all_ranks


@pytest.fixture
def assert_ranks_agree():
    """``assert_ranks_agree(array, mpi_comm=None)``: fail everywhere unless every rank holds the same bits."""
    return check_ranks_agree


@pytest.fixture
def agreed_tmpdir():
    """A fresh directory made by rank 0 of COMM_WORLD, its path broadcast to every rank as bytes."""
    import tempfile
    from pathlib import Path

    comm = _world(None)
    buf = np.zeros(4096, dtype=np.uint8)
    if comm.Get_rank() == 0:
        raw = tempfile.mkdtemp(prefix="npddp-test-").encode()
        buf[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    comm.Bcast(buf, root=0)
    return Path(bytes(buf).rstrip(b"\0").decode())
