"""Fixtures for the communicator tests: every backend over a one-rank group (serial run) and the world.

The world is MPI's ``COMM_WORLD`` under ``mpirun`` and the TCP world under ``python -m npddp.run``,
so every test here runs over both transports. Helpers reach tests as fixtures: ``comm`` (a
backend over ``group``), ``values`` (exact per-rank inputs and their reduction), ``counting``
(a group whose every message call is counted, and which offers nothing but point-to-point calls).
"""

from __future__ import annotations

import numpy as np
import pytest

from npddp.comm import create

from tests.helpers.groups import CountingTransport, P2POnly, one_rank_group
from tests.helpers.marks import marked_backend
from tests.helpers.ranks import RUN_BACKENDS, TCP_MODE, world_raw

_REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


# Ids must not be the bare word "mpi": pytest-mpi skips any test with that keyword unless --with-mpi.
@pytest.fixture(params=[marked_backend(name, f"{name}-backend") for name in RUN_BACKENDS])
def backend(request):
    """Backend name, one of ``npddp.comm.BACKENDS`` (not ``mpi`` over TCP)."""
    return request.param


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


@pytest.fixture
def counting():
    """``counting(group)``: the group behind a wrapper that counts message calls (and, over MPI, allows no other)."""
    return lambda raw: CountingTransport(raw) if TCP_MODE else P2POnly(raw)
