"""``progress="thread"``: a background thread completes non-blocking all-reduces nobody polls."""

from __future__ import annotations

import time

import numpy as np
import pytest

from npddp.comm import create

from tests.helpers.groups import one_rank_group


def test_an_unknown_progress_mode_is_refused():
    with pytest.raises(ValueError, match="unknown progress 'fast'; valid: caller, thread"):
        create("ring", one_rank_group(), progress="fast")


@pytest.mark.mpi(min_size=2)
def test_the_thread_completes_work_the_caller_never_drives(backend, world, values, assert_all_ranks,
                                                          assert_ranks_agree):
    comm = create(backend, world.raw, progress="thread")
    specs = [(7, "float32", "sum"), (70_001, "int64", "max"), (300_000, "float64", "prod")]
    bufs = [values.rank(n, comm.rank, dt, op) for n, dt, op in specs]
    works = [comm.iallreduce(b, op) for b, (_, _, op) in zip(bufs, specs)]
    deadline = time.monotonic() + 60
    while not all([w.test() for w in works]) and time.monotonic() < deadline:  # test() here only looks
        time.sleep(0.001)
    done = all([w.test() for w in works])
    results = [w.wait() for w in works]
    blocking = comm.allreduce(values.rank(99, comm.rank, "int32", "min"), "min")  # blocking calls still work
    ok = done and all(r is b and np.array_equal(b, values.expected(n, comm.size, dt, op))
                      for r, b, (n, dt, op) in zip(results, bufs, specs))
    ok = ok and np.array_equal(blocking, values.expected(99, comm.size, "int32", "min"))
    assert_ranks_agree(bufs[2], world)
    assert_all_ranks(ok, f"{backend}: the progress thread did not complete every all-reduce exactly", world)
