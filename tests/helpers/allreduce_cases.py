"""The all-reduce tests every algorithm must pass: exact values, any shape, bitwise agreement, outstanding handles.

A test module collects them by importing them beside its own ``backend`` fixture: test_comm_allreduce on every
built-in backend, test_custom_algorithm on the example's ``custom_ring``.
"""

import time

import numpy as np
import pytest

from npddp.comm import DTYPES, OPS, create

from tests.helpers.collectives import run_case, sizes
from tests.helpers.groups import one_rank_group


@pytest.mark.cluster   # runs again across emulated nodes (tests/run_all.sh: cluster-*)
def test_allreduce_exact(comm, group, values, assert_all_ranks, assert_ranks_agree_on_all):
    problems, results = [], []
    for n in sizes(comm.size):
        for dtype in DTYPES:
            for op in OPS:
                for inplace in (True, False):
                    got, found = run_case(comm, values, n, dtype, op, inplace)
                    problems += found
                    results.append(got)
    assert_ranks_agree_on_all(results, group)
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


def test_allreduce_any_shape(comm, group, values, assert_all_ranks, assert_ranks_agree_on_all):
    problems, results = [], []
    for shape in [(), (0,), (3, 0), (2, 3), (4, 1, 5), (comm.size + 1, 3)]:
        for inplace in (True, False):
            got, found = run_case(comm, values, int(np.prod(shape)), "float64", "sum", inplace, shape)
            problems += found
            results.append(got)
    assert_ranks_agree_on_all(results, group)
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


def test_float_cancellation_agrees_bitwise(comm, group, assert_all_ranks, assert_ranks_agree_on_all):
    """Terms of +-1e6 that cancel: rounding depends on order, but every rank must hold the same bits."""
    i = np.arange(4099)
    problems, results = [], []
    for dtype in ("float32", "float64"):
        terms = [np.where((i + r) % 2 == 0, 1e6, -1e6) * (1 + i % 3) + 0.1 * (r + 1) + 1e-3 * i
                 for r in range(comm.size)]
        exact = np.sum([t.astype(dtype).astype(np.float64) for t in terms], axis=0)
        for inplace in (True, False):
            x = terms[comm.rank].astype(dtype)
            got = comm.allreduce(x, "sum") if inplace else comm.allreduce(x, "sum", out=np.empty_like(x))
            tol = 8 * comm.size * 3e6 * np.finfo(dtype).eps
            if not np.allclose(got, exact, rtol=0, atol=tol):
                problems.append(f"{dtype}: max error {np.max(np.abs(got - exact))} > {tol}")
            results.append(got)
    assert_ranks_agree_on_all(results, group)
    assert_all_ranks(not problems, "; ".join(problems), group)


def poll_until_done(works, seconds=60.0):
    """Call test() on every handle until all report completion (or the deadline passes)."""
    deadline = time.monotonic() + seconds
    while not all([w.test() for w in works]) and time.monotonic() < deadline:
        pass


def outstanding(comm, values):
    """Several buffers of different size, dtype and op, with their expected results."""
    specs = [(1009, "float32", "sum"), (0, "int64", "max"), (comm.size + 1, "float64", "prod"),
             (5000, "int32", "min"), (1, "float16", "sum"), (2**16 + 1, "int64", "sum")]
    bufs = [values.rank(n, comm.rank, dtype, op) for n, dtype, op in specs]
    expected = [values.expected(n, comm.size, dtype, op) for n, dtype, op in specs]
    return specs, bufs, expected


def test_iallreduce_polled_then_waited_in_order(comm, group, values, assert_all_ranks, assert_ranks_agree_on_all):
    specs, bufs, expected = outstanding(comm, values)
    works = [comm.iallreduce(b, op) for b, (_, _, op) in zip(bufs, specs)]
    poll_until_done(works)
    all_done = all([w.test() for w in works])
    results = [w.wait() for w in works]
    again = [w.wait() for w in works]
    problems = [] if all_done else ["test() never reported completion"]
    for spec, b, r, r2, e in zip(specs, bufs, results, again, expected):
        if r is not b or r2 is not b or not np.array_equal(b, e):
            problems.append(f"{spec}: got {b[:4]}, expected {e[:4]}")
    assert_ranks_agree_on_all(bufs, group)
    assert_all_ranks(not problems, "; ".join(problems), group)


def test_iallreduce_waited_in_rank_dependent_order(comm, group, values, assert_all_ranks):
    """Odd ranks wait newest first, even ranks oldest first: handles must not depend on wait order."""
    specs, bufs, expected = outstanding(comm, values)
    works = [comm.iallreduce(b, op) for b, (_, _, op) in zip(bufs, specs)]
    for w in (works[::-1] if comm.rank % 2 else works):
        w.wait()
    bad = [spec for spec, b, e in zip(specs, bufs, expected) if not np.array_equal(b, e)]
    assert_all_ranks(not bad, f"wrong results for {bad}", group)


def test_iallreduce_interleaved_with_blocking_collectives(comm, group, values, assert_all_ranks):
    k, root = comm.size, comm.size - 1
    a = values.rank(3001, comm.rank, "float64", "sum")
    work = comm.iallreduce(a, "sum")
    b = comm.allreduce(values.rank(77, comm.rank, "int64", "max"), "max")
    c = np.arange(50.0) if comm.rank == root else np.zeros(50)
    comm.broadcast(c, root=root)
    comm.barrier()
    g = comm.allgather(np.array([comm.rank], dtype=np.int32))
    work.wait()
    ok = (np.array_equal(a, values.expected(3001, k, "float64", "sum"))
          and np.array_equal(b, values.expected(77, k, "int64", "max"))
          and np.array_equal(c, np.arange(50.0)) and np.array_equal(g.ravel(), np.arange(k)))
    assert_all_ranks(ok, "an outstanding iallreduce disturbed (or was disturbed by) blocking collectives", group)


def test_iallreduce_one_rank_completes_at_once(backend, values):
    comm = create(backend, one_rank_group())
    for n in (0, 1, 10):
        x = values.rank(n, 0, "float32", "sum")
        before = x.copy()
        work = comm.iallreduce(x, "sum")
        assert work.test() and work.wait() is x and np.array_equal(x, before)


def test_iallreduce_started_while_only_some_ranks_wait_on_an_earlier_one(backend, group, values, assert_all_ranks):
    """Rank 0 waits on the first handle before starting the second; the others start both first.

    Both calls are large and their buffers private; the second is larger, so shared-memory
    backends grow their staging area again (an exchange among the node's ranks) while rank 0
    still waits on the first, which needs the others' part: no one may hang.
    """
    comm = create(backend, group, timeout=30)
    n1, n2 = 100_003, 300_007
    first, second = values.rank(n1, comm.rank, "float64", "sum"), values.rank(n2, comm.rank, "float32", "max")
    one = comm.iallreduce(first, "sum")
    if comm.rank == 0:
        one.wait()
    two = comm.iallreduce(second, "max")
    one.wait()
    two.wait()
    ok = (np.array_equal(first, values.expected(n1, comm.size, "float64", "sum"))
          and np.array_equal(second, values.expected(n2, comm.size, "float32", "max")))
    assert_all_ranks(ok, "wrong results", group)
