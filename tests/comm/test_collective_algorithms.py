"""Every registered all-gather and reduce-scatter algorithm, and ``auto``'s pick, against NumPy's answer.

Exact inputs (small integers) for every dtype and op; random floats for the pairwise reduce-scatter,
whose documented order (rank 0's contribution first, then rank 1's, ...) gives exact bits.
"""

import numpy as np
import pytest

from npddp.comm import DTYPES, OPS, create
from npddp.comm.algorithms import registry
from npddp.comm.communicators.choice import AUTO, DEFAULTS, cheapest

#: Every algorithm of the collectives chosen per call, and auto.
CHOICES = [(coll, name) for coll in DEFAULTS for name in (*registry.names(coll, builtin=True), AUTO)]


def _sizes(k: int) -> list[int]:
    return sorted({1, k - 1 or 1, k, k + 1, 2 * k + 1, 1009})


@pytest.mark.parametrize("collective, name", CHOICES)
def test_each_algorithm_gives_numpys_answer(collective, name, group, values, assert_all_ranks,
                                            assert_ranks_agree_on_all):
    comm = create("ring", group, algorithms={collective: name})
    comm.chunk_bytes = 64   # the ring's chunked path too
    k, problems, results = comm.size, [], []
    for n in _sizes(k):
        for dtype in DTYPES:
            if collective == "allgather":
                x = values.rank(n, comm.rank, dtype, "sum")
                want = np.stack([values.rank(n, r, dtype, "sum") for r in range(k)])
                for got in (comm.allgather(x), comm.iallgather(x).wait()):
                    if got.dtype != want.dtype or not np.array_equal(got, want):
                        problems.append(f"n={n} {dtype}: got {got.ravel()[:4]}, expected {want.ravel()[:4]}")
                    results.append(got)
                continue
            for op in OPS:
                x = values.rank(n, comm.rank, dtype, op)
                x.flags.writeable = False
                want = np.array_split(values.expected(n, k, dtype, op), k)[comm.rank]
                out = np.empty_like(want)
                for got in (comm.reduce_scatter(x, op), comm.ireduce_scatter(x, op, out=out).wait()):
                    if got.dtype != want.dtype or not np.array_equal(got, want):
                        problems.append(f"n={n} {dtype} {op}: got {got[:4]}, expected {want[:4]}")
    if results:
        assert_ranks_agree_on_all(results, group)
    assert_all_ranks(not problems, f"{collective} {name}: " + "; ".join(problems[:4]), group)


@pytest.mark.parametrize("op", ["sum", "prod", "avg"])
def test_pairwise_reduces_in_rank_order(op, group, assert_all_ranks):
    comm = create("rd", group, algorithms={"reduce_scatter": "pairwise"})
    k, problems = comm.size, []
    for n in _sizes(k):
        inputs = [np.random.default_rng(100 * r + n).standard_normal(n).astype(np.float32) for r in range(k)]
        want = inputs[0].copy()
        for row in inputs[1:]:
            (np.multiply if op == "prod" else np.add)(want, row, out=want)
        if op == "avg":
            want *= np.float32(1 / k)
        want = np.array_split(want, k)[comm.rank]
        got = comm.reduce_scatter(inputs[comm.rank], op)
        if got.tobytes() != want.tobytes():
            problems.append(f"n={n}: got {got[:3]}, expected {want[:3]} (bits)")
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


def test_a_split_group_keeps_the_choice(group, assert_all_ranks):
    comm = create("ring", group, algorithms={"allgather": "bruck", "reduce_scatter": "halving"})
    child = comm.split(0)
    ok = child.choice.chosen == comm.choice.chosen == {"allgather": "bruck", "reduce_scatter": "halving",
                                                       "alltoall": "pairwise"}
    got = child.allgather(np.full(3, child.rank, dtype=np.int64))
    ok = ok and np.array_equal(got, np.repeat(np.arange(child.size), 3).reshape(child.size, 3))
    assert_all_ranks(ok, f"child chose {child.choice.chosen}, gathered {got.tolist()}", group)


def test_auto_prices_every_eligible_algorithm():
    """The cost model's pick per size is one of the collective's auto-eligible algorithms, the same every call."""
    for collective in DEFAULTS:
        eligible = registry.names(collective, auto=True)
        for size in (2, 3, 4, 16):
            for nbytes in (8, 1 << 10, 1 << 16, 1 << 20, 1 << 26):
                for transport in ("mpi", "tcp"):
                    pick = cheapest(collective, nbytes, size, transport, 1 << 20)
                    assert pick in eligible and pick == cheapest(collective, nbytes, size, transport, 1 << 20)
    # latency-bound and bandwidth-bound ends differ: few steps when small, no extra copy when large
    assert cheapest("allgather", 1 << 10, 16, "mpi", 1 << 20) in ("bruck", "rd")
    assert cheapest("allgather", 1 << 26, 16, "mpi", 1 << 20) not in ("bruck",)


@pytest.mark.parametrize("algorithms, valid", [
    ({"allgather": "nope"}, "bruck, direct, rd, ring"), ({"reduce_scatter": "bruck"}, "halving, pairwise, ring"),
    ({"gather": "ring"}, "allgather, reduce_scatter")])
def test_an_unknown_choice_names_the_valid_ones(algorithms, valid):
    with pytest.raises(ValueError, match=valid):
        create("ring", algorithms=algorithms)


@pytest.mark.parametrize("backend", ["naive", "hier"])
def test_backends_with_their_own_schedules_refuse_a_choice(backend):
    with pytest.raises(ValueError, match=f"{backend} backend"):
        create(backend, algorithms={"allgather": "bruck"})
