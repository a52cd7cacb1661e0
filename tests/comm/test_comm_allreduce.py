"""All-reduce and iallreduce on every backend, over COMM_SELF and COMM_WORLD.

Exact values for every size, dtype, op and layout; results bit-identical on all ranks;
non-blocking handles polled, waited in any order and interleaved with blocking collectives.
"""

import numpy as np
import pytest

from npddp.comm import create

from tests.helpers.allreduce_cases import (  # noqa: F401  the cases every algorithm passes, collected here
    poll_until_done, test_allreduce_any_shape, test_allreduce_exact, test_float_cancellation_agrees_bitwise,
    test_iallreduce_interleaved_with_blocking_collectives, test_iallreduce_one_rank_completes_at_once,
    test_iallreduce_polled_then_waited_in_order, test_iallreduce_started_while_only_some_ranks_wait_on_an_earlier_one,
    test_iallreduce_waited_in_rank_dependent_order)
from tests.helpers.collectives import run_case


def test_allreduce_large(comm, group, values, assert_all_ranks, assert_ranks_agree_on_all):
    problems, results = [], []
    for dtype, op, inplace in (("float32", "sum", True), ("float32", "max", False), ("int64", "sum", False),
                               ("int64", "max", True)):
        got, found = run_case(comm, values, 2**20 + 3, dtype, op, inplace)
        problems += found
        results.append(got)
    assert_ranks_agree_on_all(results, group)
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


def test_allreduce_64mb(comm, group, assert_all_ranks):
    x = np.full(16 << 20, comm.rank + 1, dtype=np.float32)  # 64 MB
    comm.allreduce(x, "sum")
    want = comm.size * (comm.size + 1) // 2
    wrong = int(np.count_nonzero(x != want))
    assert_all_ranks(wrong == 0, f"{wrong} of {x.size} elements differ from {want}", group)


@pytest.mark.slow
def test_ring_segments_and_windows(group, values, assert_all_ranks, assert_ranks_agree_on_all):
    """Tiny segments force many units per ring step; every window size must give exact results."""
    comm = create("ring", group)
    problems, results = [], []
    for chunk_bytes in (8, 100):
        for window in (1, 3):
            comm.chunk_bytes, comm.window = chunk_bytes, window
            for n in (0, 1, comm.size + 1, 1009):
                for dtype in ("float16", "int64"):
                    for op in ("sum", "prod"):
                        got, found = run_case(comm, values, n, dtype, op, inplace=n % 2 == 0)
                        problems += [f"chunk_bytes={chunk_bytes} window={window} {p}" for p in found]
                        results.append(got)
            bufs = [values.rank(n, comm.rank, "float32", "sum") for n in (1009, 37, 0, 3)]
            works = [comm.iallreduce(b, "sum") for b in bufs]
            poll_until_done(works)
            for b, work in zip(bufs, works):
                if work.wait() is not b or not np.array_equal(b, values.expected(b.size, comm.size, "float32", "sum")):
                    problems.append(f"chunk_bytes={chunk_bytes} window={window} iallreduce n={b.size}")
    assert_ranks_agree_on_all(results, group)
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


@pytest.mark.slow
def test_a_thousand_small_allreduces_in_a_row(comm, group, assert_all_ranks):
    calls = 1_000
    x, out = np.zeros(2, dtype=np.int64), np.empty(2, dtype=np.int64)
    totals = np.zeros(2, dtype=np.int64)
    for step in range(calls):
        x[0], x[1] = step + comm.rank, -comm.rank
        totals += comm.allreduce(x, "sum", out=out)
    k, pairs = comm.size, comm.size * (comm.size - 1) // 2
    expected = [k * (calls * (calls - 1) // 2) + calls * pairs, -calls * pairs]
    assert_all_ranks(totals.tolist() == expected, f"totals {totals.tolist()} != {expected}", group)


