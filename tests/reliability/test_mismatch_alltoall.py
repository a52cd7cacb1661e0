"""The default argument check of alltoall and alltoallv: a rank that passes another dtype, block size or kind of
call, or counts that disagree with a peer's, gets CollectiveMismatchError on every rank, never a result."""

import time

import numpy as np
import pytest

from npddp.comm import CollectiveMismatchError, create
from npddp.comm import signature as sg
from npddp.comm.engine.signed import SMALL_BYTES

from tests.helpers.ranks import RUN_BACKENDS


def _v(comm, dtype="float32", skew=0, blocking=True):
    """An alltoallv of 3 + i + j elements from rank i to rank j; the last rank expects ``skew`` more from rank 0."""
    k, rank = comm.size, comm.rank
    send = np.array([3 + rank + j for j in range(k)])
    recv = np.array([3 + i + rank for i in range(k)])
    if rank == k - 1:
        recv[0] += skew
    buf = np.ones(int(send.sum()), dtype=dtype)
    return comm.alltoallv(buf, send, recv) if blocking else comm.ialltoallv(buf, send, recv).wait()


def _a(comm, block=5, dtype="float32", blocking=True):
    buf = np.ones((comm.size, block), dtype=dtype)
    return comm.alltoall(buf) if blocking else comm.ialltoall(buf).wait()


#: name -> (the field the error names, the call of ranks 0..size-2, the call of the last rank)
CASES = {
    "alltoall dtype": ("dtype", _a, lambda comm: _a(comm, dtype="int32")),
    "alltoall block size": ("count", _a, lambda comm: _a(comm, block=6)),
    "alltoall small against large": ("count", _a, lambda comm: _a(comm, block=SMALL_BYTES)),
    "alltoall empty against not": ("count", _a, lambda comm: _a(comm, block=0)),
    "alltoall against allgather": ("kind", _a, lambda comm: comm.allgather(np.ones(5, np.float32))),
    "alltoallv dtype": ("dtype", _v, lambda comm: _v(comm, dtype="float64")),
    "alltoallv counts": ("count", _v, lambda comm: _v(comm, skew=1)),
    "ialltoallv counts": ("count", lambda comm: _v(comm, blocking=False), lambda comm: _v(comm, skew=-2,
                                                                                          blocking=False)),
    "alltoallv against alltoall": ("kind", _v, _a),
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("known", [False, True], ids=["new-shapes", "known-shapes"])
@pytest.mark.parametrize("backend", RUN_BACKENDS, ids=lambda b: f"{b}-backend")
def test_every_rank_raises_naming_the_field_and_the_communicator_closes(backend, known, world, assert_all_ranks,
                                                                        monkeypatch):
    """``known``: every rank first makes both calls alike, so the mismatched one goes under its signature's index."""
    monkeypatch.delenv("NPDDP_CHECK_ARGS", raising=False)
    monkeypatch.delenv("NPDDP_DEBUG", raising=False)
    problems = []
    for name, (field, usual, other) in CASES.items():
        comm = create(backend, world.fresh(), timeout=30)
        odd = comm.rank == comm.size - 1
        if known and "counts" not in name:
            usual(comm)
            other(comm)
        started, error = time.monotonic(), None
        try:
            (other if odd else usual)(comm)
        except CollectiveMismatchError as exc:
            error = str(exc)
        took = time.monotonic() - started
        if error is None:
            problems.append(f"{name}: no CollectiveMismatchError on rank {comm.rank}")
            continue
        if f"differing fields: {field}" not in error or took > 10:
            problems.append(f"{name}: after {took:.1f} s, an error that does not name {field}: {error}")
        if "counts" in name and "rank 0 sends" not in error:
            problems.append(f"{name}: the error does not name who sends what: {error}")
        try:
            comm.allreduce(np.ones(3))
            problems.append(f"{name}: the communicator still ran a call after the mismatch")
        except RuntimeError as exc:
            if "closed" not in str(exc) and "unusable" not in str(exc):
                problems.append(f"{name}: unclear error after the mismatch: {exc}")
    assert_all_ranks(not problems, "; ".join(problems[:4]), world)


def test_the_counts_table_finds_the_first_pair_that_disagrees():
    send = np.array([[1, 2, 0], [4, 5, 6], [0, 8, 9]])   # send[i, j]: what rank i sends rank j
    table = np.concatenate([send, send.T], axis=1)       # every rank expects what is sent: agreed
    assert sg.counts_disagreement(table) is None
    table[2, 3 + 1] = 7                                   # rank 2 expects 7 from rank 1, which sends 6
    table[1, 3 + 0] = 3                                   # rank 1 expects 3 from rank 0, which sends 2
    assert sg.counts_disagreement(table) == (0, 1)
    text = sg.counts_message(4, table, (0, 1))
    assert text.startswith("collective #4 mismatch: ") and "rank 0 sends 2 elements to rank 1" in text
    assert "rank 1 expects 3 from rank 0" in text and text.endswith("differing fields: count")
