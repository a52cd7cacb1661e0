"""The ranks of a distributed test, over mpi4py or the TCP transport, and checks that keep them in step.

A distributed test (marked ``mpi``) runs on every rank of a group: under ``mpirun`` that is
mpi4py's ``COMM_WORLD``; under ``python -m npddp.run`` (the TCP transport, no MPI) it is the
TCP world built from the launcher's environment. :class:`Group` offers both the same few
calls the checks need. Tests make every collective call on all ranks before asserting; the
checks then gather what each rank saw through the group's own exchange (mpi4py's buffer
collectives, or plain messages of the transport, never the algorithms under test), so a
failure seen on one rank fails every rank at the same point instead of leaving the others waiting.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
import weakref
from pathlib import Path

import numpy as np

from npddp.comm import BACKENDS
from npddp.comm.transports.base import is_transport, resolve_transport

#: True when this test process is one rank of a ``python -m npddp.run`` job (TCP transport).
TCP_MODE = resolve_transport("auto") == "tcp"
#: Backends of this run: MPI's own collectives need the mpi transport.
RUN_BACKENDS = tuple(b for b in BACKENDS if not (TCP_MODE and b == "mpi"))
_CHECK_TAG = 1
_CHECK_TIMEOUT_S = 120.0


class Group:
    """The ranks of a test, over mpi4py or the TCP transport: rank, size, allgather, barrier, fresh."""

    def __init__(self, raw):
        self.raw = raw
        self.tcp = is_transport(raw) and raw.name == "tcp"
        if self.tcp:
            self.rank, self.size = raw.rank, raw.size
            self._checker = raw.world.transport(raw.ranks)  # a message context of the checks' own
        else:
            self.rank, self.size = raw.Get_rank(), raw.Get_size()

    def allgather(self, local: np.ndarray) -> np.ndarray:
        """Every rank's ``local`` (same dtype and shape everywhere), stacked: ``(size, *local.shape)``."""
        local = np.ascontiguousarray(local)
        out = np.empty((self.size, *local.shape), dtype=local.dtype)
        if not self.tcp:
            self.raw.Allgather(local, out)
            return out
        out[self.rank] = local
        t = self._checker
        others = [r for r in range(self.size) if r != self.rank]
        requests = [t.irecv(out[r], r, _CHECK_TAG) for r in others] + [t.isend(local, r, _CHECK_TAG) for r in others]
        deadline = time.monotonic() + _CHECK_TIMEOUT_S
        while not all([r.test() for r in requests]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"test check: rank {self.rank} waited {_CHECK_TIMEOUT_S:g} s for its peers")
            os.sched_yield()
        return out

    def barrier(self) -> None:
        """Return once every rank has arrived."""
        if self.tcp:
            self.allgather(np.zeros(1, dtype=np.uint8))
        else:
            self.raw.Barrier()

    def fresh(self):
        """A new group over the same ranks whose messages cannot meet this one's (MPI: a Dup, never freed)."""
        return self.raw.world.transport(self.raw.ranks) if self.tcp else self.raw.Dup()


_GROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def world_raw():
    """The world of this run: mpi4py's COMM_WORLD, or the TCP world under npddp.run."""
    if TCP_MODE:
        from npddp.comm.transports.world import world_from_env
        return world_from_env(300.0)
    from mpi4py import MPI
    return MPI.COMM_WORLD


def as_group(raw=None) -> Group:
    """The :class:`Group` of ``raw`` (an mpi4py communicator or a transport; None: the world)."""
    if isinstance(raw, Group):
        return raw
    raw = world_raw() if raw is None else raw
    if is_transport(raw):
        group = _GROUPS.get(raw)
        if group is None:
            group = _GROUPS[raw] = Group(raw)
        return group
    return Group(raw)


def check_all_ranks(ok: bool, message: str = "", group=None) -> None:
    """Fail on every rank unless ``ok`` holds on every rank; the error names the failing ranks."""
    g = as_group(group)
    flags = g.allgather(np.array([1 if ok else 0], dtype=np.int32))[:, 0]  # (size,)
    bad = np.flatnonzero(flags == 0).tolist()
    assert not bad, f"failed on ranks {bad}" + (f"; on rank {g.rank}: {message}" if not ok else "")


def check_ranks_agree(array: np.ndarray, group=None) -> np.ndarray:
    """All-gather ``array`` and fail on every rank unless all copies have the same dtype, shape and bits.

    Returns the gathered bytes, shape ``(size, array.nbytes)``.
    """
    g = as_group(group)
    meta = np.frombuffer(f"{array.dtype.str}{array.shape}".encode()[:64].ljust(64), dtype=np.uint8)
    metas = g.allgather(meta)  # (size, 64)
    differ = [r for r in range(g.size) if not np.array_equal(metas[r], metas[0])]
    assert not differ, f"ranks {differ} hold a different dtype/shape than rank 0: " + \
        ", ".join(bytes(metas[r]).decode().strip() for r in range(g.size))
    local = np.ascontiguousarray(array).reshape(-1).view(np.uint8)  # (nbytes,)
    gathered = g.allgather(local)  # (size, nbytes)
    differ = [r for r in range(g.size) if not np.array_equal(gathered[r], gathered[0])]
    assert not differ, f"ranks {differ} hold different bits than rank 0 ({array.dtype}, shape {array.shape})"
    return gathered


def check_ranks_agree_on_all(arrays, group=None) -> None:
    """:func:`check_ranks_agree` on many arrays at once: their dtypes, shapes and bits in one exchange."""
    arrays = [np.ascontiguousarray(a) for a in arrays]
    meta = np.frombuffer(";".join(f"{a.dtype.str}{a.shape}" for a in arrays).encode(), dtype=np.uint8)
    blob = np.concatenate([meta] + [a.reshape(-1).view(np.uint8) for a in arrays])  # (bytes,)
    check_ranks_agree(blob, group)


@contextlib.contextmanager
def agreed_directory(group=None):
    """A fresh directory made by rank 0 of ``group``, its path shared with every rank as bytes; removed by
    rank 0 once every rank is done with it."""
    g = as_group(group)
    buf = np.zeros(4096, dtype=np.uint8)
    if g.rank == 0:
        raw = tempfile.mkdtemp(prefix="npddp-test-").encode()
        buf[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    path = Path(bytes(g.allgather(buf)[0]).rstrip(b"\0").decode())
    try:
        yield path
    finally:
        g.barrier()
        if g.rank == 0:
            shutil.rmtree(path, ignore_errors=True)
