"""The shared-memory all-reduce's argument check: empty buffers, staging growth, and calls swapped against messages.

Every case makes one rank (or every rank) call differently and checks that every rank raises
CollectiveMismatchError in that very call, within seconds, on each backend that takes the
shared-memory path on one node (shm; auto and hier when every rank shares the node).
"""

import os
import time

import numpy as np
import pytest

from npddp.comm import CollectiveMismatchError, create
from tests.helpers.marks import marked_backend

#: Backends whose all-reduce goes through node shared memory when every rank shares the node.
SHARED = ("shm", "hier", "auto")
#: Seconds a mismatch may take to be found (the communicators' timeout is 30 s).
PROMPT_S = 10


def _node_comm(name, world):
    """``name`` over a fresh group of the world, or None where its ranks do not share one node's memory."""
    if os.environ.get("NPDDP_RANKS_PER_NODE") or os.environ.get("NPDDP_AUTO_SHM") == "0":
        return None
    comm = create(name, world.fresh(), timeout=30)
    return comm if comm.shared_memory else None


def _allreduce(comm, count, dtype=np.float32, op="sum", blocking=True):
    buf = np.ones(count, dtype=dtype)
    return comm.allreduce(buf, op) if blocking else comm.iallreduce(buf, op).wait()


#: case -> (the field the error names, the call as rank ``odd`` makes it). Each rank makes ``call(comm, odd,
#: blocking)``; ``odd``: whether it is the last rank.
CASES = {
    "every rank empty, the last another dtype": (
        "dtype", lambda comm, odd, b: _allreduce(comm, 0, np.float64 if odd else np.float32, blocking=b)),
    "every rank empty, the last another op": (
        "op", lambda comm, odd, b: _allreduce(comm, 0, op="max" if odd else "sum", blocking=b)),
    "the last rank empty": ("count", lambda comm, odd, b: _allreduce(comm, 0 if odd else 5, blocking=b)),
    "the last rank not empty": ("count", lambda comm, odd, b: _allreduce(comm, 5 if odd else 0, blocking=b)),
    "the last rank empty against the large path": (
        "count", lambda comm, odd, b: _allreduce(comm, 0 if odd else 40000, blocking=b)),
    "the last rank's count grows the staging area": (
        "count", lambda comm, odd, b: _allreduce(comm, 300000 if odd else 30, blocking=b)),
    "every rank grows the staging area, the last to another count": (
        "count", lambda comm, odd, b: _allreduce(comm, 300000 if odd else 200000, blocking=b)),
}


def _expect_mismatch(comm, field, run) -> str:
    """'' when ``run()`` raises CollectiveMismatchError naming ``field`` within PROMPT_S, else what went wrong."""
    started = time.monotonic()
    try:
        run()
    except CollectiveMismatchError as exc:
        took = time.monotonic() - started
        if f"differing fields: {field}" not in str(exc):
            return f"an error that does not name {field}: {exc}"
        return f"the mismatch took {took:.1f} s" if took > PROMPT_S else ""
    except Exception as exc:  # noqa: BLE001 - reported with the case's name
        return f"{type(exc).__name__}: {exc}"
    return f"no error on rank {comm.rank}"


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("blocking", [True, False], ids=["allreduce", "iallreduce"])
@pytest.mark.parametrize("backend", [marked_backend(b, f"{b}-backend") for b in SHARED])
def test_an_empty_or_growing_call_against_another_raises_on_every_rank_in_that_call(backend, blocking, world,
                                                                                    assert_all_ranks):
    problems = []
    for name, (field, call) in CASES.items():
        comm = _node_comm(backend, world)
        if comm is None:
            pytest.skip(f"{backend}: the ranks do not share one node's memory here")
        odd = comm.rank == comm.size - 1
        problem = _expect_mismatch(comm, field, lambda: call(comm, odd, blocking))
        if problem:
            problems.append(f"{name}: {problem}")
        else:   # and the communicator is closed
            try:
                comm.barrier()
                problems.append(f"{name}: the communicator still ran a barrier after the mismatch")
            except RuntimeError:
                pass
    assert_all_ranks(not problems, "; ".join(problems[:3]), world)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("backend", [marked_backend(b, f"{b}-backend") for b in SHARED])
def test_matching_empty_calls_still_complete(backend, world, assert_all_ranks):
    comm = _node_comm(backend, world)
    if comm is None:
        pytest.skip(f"{backend}: the ranks do not share one node's memory here")
    out = np.ones(0, dtype=np.int32)
    comm.allreduce(np.zeros(0, dtype=np.int32), "max", out=out)
    comm.iallreduce(np.zeros((3, 0), dtype=np.float16), "prod").wait()
    got = _allreduce(comm, 7)
    assert_all_ranks(np.array_equal(got, np.full(7, comm.size, np.float32)), f"{got}", world)


def _swap(first, second):
    """The last rank makes ``second`` then ``first``, the others ``first`` then ``second``."""
    def run(comm, odd, known):
        if known:   # every shape once, alike: the swapped calls then go plain under their signatures' indices
            first(comm)
            second(comm)
        for step in ((second, first) if odd else (first, second)):
            step(comm)
    return run


_SMALL = lambda comm: comm.allreduce(np.ones(5, dtype=np.float16))  # noqa: E731
_LARGE = lambda comm: comm.allreduce(np.ones(40000, dtype=np.float32))  # noqa: E731
#: case -> the calls, one rank swapping two of them: an all-reduce on the shared-memory path against messages
#: (or, on shm, its barrier, which is a node barrier too).
SWAPS = {
    "all-reduce and barrier": _swap(_SMALL, lambda comm: comm.barrier()),
    "large all-reduce and barrier": _swap(_LARGE, lambda comm: comm.barrier()),
    "all-reduce and reduce-scatter": _swap(_SMALL, lambda comm: comm.reduce_scatter(np.ones(45, dtype=np.int32))),
    "all-reduce and broadcast": _swap(_SMALL, lambda comm: comm.broadcast(np.ones(3), root=0)),
    "all-reduce and all-gather": _swap(_LARGE, lambda comm: comm.allgather(np.ones(3, dtype=np.int64))),
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("known", [False, True], ids=["new-shapes", "known-shapes"])
@pytest.mark.parametrize("backend", [marked_backend(b, f"{b}-backend") for b in SHARED])
def test_an_all_reduce_swapped_with_a_call_of_messages_raises_on_every_rank(backend, known, world, assert_all_ranks):
    """The all-reduce waits at the node barrier while its peers wait for its messages: the rank at the barrier sees a
    peer's message numbered as its call (or, shm's barrier, the size word) and raises; the others hear its abort."""
    problems = []
    for name, run in SWAPS.items():
        comm = _node_comm(backend, world)
        if comm is None:
            pytest.skip(f"{backend}: the ranks do not share one node's memory here")
        odd = comm.rank == comm.size - 1
        problem = _expect_mismatch(comm, "", lambda: run(comm, odd, known))
        if problem:
            problems.append(f"{name}: {problem}")
    assert_all_ranks(not problems, "; ".join(problems[:3]), world)
