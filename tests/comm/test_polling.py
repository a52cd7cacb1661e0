"""A loop of ``Work.test()`` ends where ``wait()`` would: done, the mismatch a peer found, or the timeout.

The docs' ``while not work.test()`` must neither spin past a peer's abort nor past the deadline,
must move the calls started before the polled one (shared memory's node barriers count in call
order), and behaves alike when the progress thread drives the handles.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from npddp.comm import CollectiveMismatchError, create
from tests.helpers.ranks import RUN_BACKENDS

#: Communicators left with an abandoned call, kept to the end of the run: a freed context goes to the next
#: communicator made (MPICH reuses them), which would then match the abandoned call's late message.
KEPT: list = []
#: Seconds a poll loop here may run before the test calls it a hang (well past the communicators' timeouts).
CAP_S = 20.0


def _poll(start) -> tuple[str, float]:
    """Start a call (``start()``: its handle; a mismatch may raise there already), then loop on its ``test()``:
    ``("done" | the error's class and text | "hang", seconds)``."""
    started = time.monotonic()
    try:
        work = start()
        while not work.test():
            if time.monotonic() - started > CAP_S:
                return "hang", time.monotonic() - started
        return "done", time.monotonic() - started
    except (CollectiveMismatchError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}", time.monotonic() - started


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("progress", ["caller", "thread"])
@pytest.mark.parametrize("backend", ["naive", "rd", "ring"])
def test_a_loop_of_test_raises_the_mismatch_a_peer_found(backend, progress, world, assert_all_ranks):
    comm = create(backend, world.fresh(), timeout=10, progress=progress, check_args=True)
    x = np.ones(12 if comm.rank == comm.size - 1 else 10, dtype=np.float32)   # the last rank's count differs
    outcome, took = _poll(lambda: comm.iallreduce(x))
    ok = outcome.startswith("CollectiveMismatchError") and took < 8
    assert_all_ranks(ok, f"{backend} ({progress}): rank {comm.rank} after {took:.1f} s: {outcome}", world)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("backend, progress", [(b, p) for b, p in [("rd", "caller"), ("rd", "thread"), ("mpi", "caller")]
                                               if b in RUN_BACKENDS])   # mpi: not over TCP
@pytest.mark.parametrize("check_args", [True, False])
@pytest.mark.parametrize("kind", ["iallreduce", "iallgather"])
def test_a_loop_of_test_times_out_naming_its_call(kind, check_args, backend, progress, world, assert_all_ranks):
    """Rank 0 alone starts the call; its loop raises the TimeoutError at the deadline, naming the call (MPI's own
    collectives too: their handles read the clock as npddp's do)."""
    comm = create(backend, world.fresh(), timeout=1, progress=progress, check_args=check_args)
    KEPT.append(comm)   # never freed on any rank: rank 0's abandoned call may still send (#44's open context reuse)
    ok, what = True, "no call"
    if comm.rank == 0:
        x = np.ones(10, dtype=np.float32)
        work = comm.iallreduce(x) if kind == "iallreduce" else comm.iallgather(x)
        outcome, took = _poll(lambda: work)
        waited = ""
        try:
            work.wait()
        except (TimeoutError, RuntimeError) as exc:
            waited = f"{type(exc).__name__}: {exc}"
        ok = outcome.startswith("TimeoutError") and kind in outcome and took < 8 and kind in waited
        what = f"after {took:.1f} s: {outcome}; wait(): {waited}"
    assert_all_ranks(ok, f"{backend} {kind} ({progress}, check_args={check_args}): rank {comm.rank}: {what}", world)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("progress", ["caller", "thread"])
def test_a_loop_of_test_on_a_later_call_moves_the_earlier_one(backend, progress, world, values, assert_all_ranks):
    """Two calls open; polling the second alone completes it (shm and auto on one node: after the first)."""
    try:
        comm = create(backend, world.fresh(), timeout=10, progress=progress)
    except ValueError as exc:   # shm across (pretended) nodes
        pytest.skip(str(exc))
    first, second = values.rank(5000, comm.rank, "float32", "sum"), values.rank(7, comm.rank, "int64", "max")
    earlier = comm.iallgather(first)
    later = comm.iallreduce(second, "max")
    outcome, took = _poll(lambda: later)
    earlier.wait()
    ok = outcome == "done" and np.array_equal(second, values.expected(7, comm.size, "int64", "max"))
    assert_all_ranks(ok, f"{backend} ({progress}): rank {comm.rank} after {took:.1f} s: {outcome}", world)
