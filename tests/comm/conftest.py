"""Fixtures for the communicator tests: every backend over COMM_SELF (serial run) and COMM_WORLD (MPI runs).

Helpers reach tests as fixtures: ``comm`` (a backend over ``mpi_comm``), ``values`` (exact
per-rank inputs and their reduction), ``p2p_only`` (a wrapper exposing only point-to-point calls).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from npddp.comm import BACKENDS, create

#: Backends built from point-to-point calls only.
P2P_BACKENDS = ("ring", "naive")

#: The only communicator methods a point-to-point backend may call.
P2P_METHODS = frozenset({"Get_rank", "Get_size", "Send", "Recv", "Sendrecv", "Isend", "Irecv"})

_REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


# Ids must not be the bare word "mpi": pytest-mpi skips any test with that keyword unless --with-mpi.
@pytest.fixture(params=BACKENDS, ids=lambda name: f"{name}-backend")
def backend(request):
    """Backend name, one of ``npddp.comm.BACKENDS``."""
    return request.param


@pytest.fixture(params=[pytest.param("self", id="self"), pytest.param("world", id="world", marks=pytest.mark.mpi)])
def mpi_comm(request):
    """``MPI.COMM_SELF`` in the serial run, ``MPI.COMM_WORLD`` (marked mpi) in the MPI runs."""
    from mpi4py import MPI
    return MPI.COMM_SELF if request.param == "self" else MPI.COMM_WORLD


@pytest.fixture
def comm(backend, mpi_comm):
    """A fresh communicator of ``backend`` over ``mpi_comm``."""
    return create(backend, mpi_comm)


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


@pytest.fixture
def p2p_only():
    """The :class:`P2POnly` wrapper class."""
    return P2POnly
