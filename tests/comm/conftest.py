"""Fixtures for the communicator tests: every backend over a one-rank group (serial run) and the world.

The world is MPI's ``COMM_WORLD`` under ``mpirun`` and the TCP world under ``python -m npddp.run``,
so every test here runs over both transports. Helpers reach tests as fixtures: ``comm`` (a
backend over ``group``), ``values`` (exact per-rank inputs and their reduction), ``counting``
(a group whose every message call is counted, and which offers nothing but point-to-point calls).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from npddp.comm import BACKENDS, create

from tests.helpers.marks import marked_backend
from tests.helpers.ranks import RUN_BACKENDS, TCP_MODE, world_raw
#: Backends built from point-to-point messages only.
P2P_BACKENDS = tuple(b for b in BACKENDS if b != "mpi")

#: The only methods of an mpi4py communicator a point-to-point backend may call (``Split``: hier's
#: one setup call, making its group across nodes; never on the data path; ``Iprobe``: a checked call
#: that waits long looks at what its peers sent).
P2P_METHODS = frozenset({"Get_rank", "Get_size", "Send", "Recv", "Sendrecv", "Isend", "Irecv", "Iprobe", "Split"})

_REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


# Ids must not be the bare word "mpi": pytest-mpi skips any test with that keyword unless --with-mpi.
@pytest.fixture(params=[marked_backend(name, f"{name}-backend") for name in RUN_BACKENDS])
def backend(request):
    """Backend name, one of ``npddp.comm.BACKENDS`` (not ``mpi`` over TCP)."""
    return request.param


def one_rank_group():
    """A group of this rank alone: MPI's COMM_SELF, or a TCP world of one."""
    if TCP_MODE:
        from npddp.comm.transports.tcp import TCPWorld
        return TCPWorld(0, 1, [None], ["self"]).transport()
    from mpi4py import MPI
    return MPI.COMM_SELF


@pytest.fixture(params=[pytest.param("self", id="self"), pytest.param("world", id="world", marks=pytest.mark.mpi)])
def group(request):
    """A one-rank group in the serial run; the world (marked mpi) in the distributed runs."""
    return one_rank_group() if request.param == "self" else world_raw()


@pytest.fixture
def comm(backend, group):
    """A fresh communicator of ``backend`` over ``group``."""
    return create(backend, group)


class Values:
    """Exact inputs: small integers, so no sum, product or order of reduction can round or overflow."""

    @staticmethod
    def rank(n: int, rank: int, dtype, op: str) -> np.ndarray:
        """Rank ``rank``'s input of ``n`` elements for ``op``; prod uses {1, 2} so 2**size stays exact."""
        i = np.arange(n, dtype=np.int64)
        if op == "prod":
            v = 1 + (i + rank) % 2
        elif op == "sum":
            v = i % 7 + 2 * rank - 3
        else:
            v = (3 * i + 5 * rank) % 11 - 5
        return v.astype(dtype)

    @classmethod
    def expected(cls, n: int, size: int, dtype, op: str) -> np.ndarray:
        """The reduction of every rank's input, computed exactly in int64."""
        stacked = np.stack([cls.rank(n, r, np.int64, op) for r in range(size)])  # (size, n)
        return _REDUCE[op](stacked, axis=0).astype(dtype)


@pytest.fixture
def values():
    """The :class:`Values` helper."""
    return Values


class P2POnly:
    """Wraps an mpi4py communicator; only ``P2P_METHODS`` may be used, and each use is counted."""

    def __init__(self, mpi_comm):
        self._comm = mpi_comm
        self.calls: Counter = Counter()

    def __getattr__(self, name):
        if name not in P2P_METHODS:
            raise AttributeError(f"{name} is not a point-to-point method; allowed: {sorted(P2P_METHODS)}")
        self.calls[name] += 1
        return getattr(self._comm, name)

    def messages(self) -> int:
        """Number of message calls so far (everything except Get_rank/Get_size)."""
        return sum(n for name, n in self.calls.items() if not name.startswith("Get_"))


class CountingTransport:
    """Wraps a transport (TCP): the same messages, each ``isend``/``irecv`` counted."""

    def __init__(self, transport):
        self._t = transport
        self.name, self.rank, self.size = transport.name, transport.rank, transport.size
        self.calls: Counter = Counter()

    def isend(self, buf, dest, tag):
        self.calls["isend"] += 1
        return self._t.isend(buf, dest, tag)

    def irecv(self, buf, source, tag):
        self.calls["irecv"] += 1
        return self._t.irecv(buf, source, tag)

    def split(self, colors):
        """The wrapped transport's split, itself counted."""
        return CountingTransport(self._t.split(colors))

    def messages(self) -> int:
        """Number of message calls so far."""
        return sum(self.calls.values())


@pytest.fixture
def counting():
    """``counting(group)``: the group behind a wrapper that counts message calls (and, over MPI, allows no other)."""
    return lambda raw: CountingTransport(raw) if TCP_MODE else P2POnly(raw)


def new_held(world, before: int) -> int:
    """Bytes TCP's early-frame buffers grew by since ``before`` (0 without TCP, or when they shrank).

    They shrink when a buffer kept before is being read into at the moment of measuring; that buffer
    was allocated before tracing began, so it frees no traced memory and must not lower the allowance.
    """
    return max(0, world.held_bytes() - before) if world is not None else 0
