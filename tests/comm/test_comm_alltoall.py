"""alltoall and alltoallv (and their non-blocking forms) on every backend: exact blocks, every dtype and size."""

import numpy as np
import pytest

from npddp.comm import DTYPES, create
from npddp.comm.algorithms import registry
from npddp.comm.engine.cost import MODEL
from tests.helpers.groups import one_rank_group


def block_of(source: int, dest: int, n: int, dtype) -> np.ndarray:
    """What rank ``source`` sends rank ``dest``: ``n`` small integers no dtype rounds, unique per pair."""
    return ((np.arange(n) * 7 + 31 * source + 5 * dest) % 1000).astype(dtype)


def counts_matrix(size: int, seed: int) -> np.ndarray:
    """``counts[i, j]``: elements rank i sends rank j; zeros and sizes around 8 KiB (the signed first message's
    bound) included, the same on every rank."""
    rng = np.random.default_rng(seed)
    counts = rng.choice([0, 0, 1, 3, 1000, 2100, 5000], size=(size, size))
    if seed % 3 == 0:
        counts[:, 0] = 0   # rank 0 receives nothing
    if seed % 3 == 1:
        counts[0] = 0      # rank 0 sends nothing
    return counts


def test_alltoall_exact_for_every_dtype_and_block(comm, group, assert_all_ranks, assert_ranks_agree_on_all):
    """Rank j's out[r] is rank r's buf[j]; blocks from empty to several chunks, 2-d blocks; the blocking call, the
    non-blocking one waited, and out= returned."""
    k, rank, problems, results = comm.size, comm.rank, [], []
    for block in [(0,), (1,), (k + 1,), (2, 3), (1009,), (3000,)]:
        n = int(np.prod(block))
        for dtype in DTYPES:
            buf = np.stack([block_of(rank, d, n, dtype).reshape(block) for d in range(k)])   # (k, *block)
            buf.flags.writeable = False
            want = np.stack([block_of(s, rank, n, dtype).reshape(block) for s in range(k)])
            got = comm.alltoall(buf)
            out = np.full((k, *block), -1, dtype=dtype)
            work = comm.ialltoall(buf, out=out)
            late = work.wait()
            if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
                problems.append(f"alltoall block={block} {dtype}: got {got.ravel()[:4]}, expected {want.ravel()[:4]}")
            if late is not out or not np.array_equal(out, want):
                problems.append(f"ialltoall block={block} {dtype}: wrong out")
            results.append(got[:, :1].copy() if n else got)
    assert_ranks_agree_on_all([np.array([len(results)])], group)
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


@pytest.mark.parametrize("seed", range(4))
def test_alltoallv_exact_for_every_dtype_and_counts(comm, group, seed, assert_all_ranks):
    """Rank j's block r of out is rank r's block j of buf, for counts with zeros (whole rows and columns), odd sizes
    and blocks past the signed first message's bound; counts as lists, tuples and arrays; out= returned."""
    k, rank, problems = comm.size, comm.rank, []
    counts = counts_matrix(k, seed)
    for dtype in DTYPES:
        send, recv = counts[rank], counts[:, rank]
        buf = np.concatenate([block_of(rank, d, int(send[d]), dtype) for d in range(k)])
        buf.flags.writeable = False
        want = np.concatenate([block_of(s, rank, int(recv[s]), dtype) for s in range(k)])
        got = comm.alltoallv(buf, send.tolist(), tuple(int(n) for n in recv))
        out = np.full(int(recv.sum()), -1, dtype=dtype)
        late = comm.ialltoallv(buf, send, recv.astype(np.int32), out=out).wait()
        if got.dtype != want.dtype or not np.array_equal(got, want):
            problems.append(f"alltoallv seed={seed} {dtype}: got {got[:4]}, expected {want[:4]}")
        if late is not out or not np.array_equal(out, want):
            problems.append(f"ialltoallv seed={seed} {dtype}: wrong out")
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


def test_alltoallv_of_no_elements_anywhere_and_2d_input(comm, group, assert_all_ranks):
    """Every count zero returns an empty array; a 2-d input is read flat."""
    k, rank = comm.size, comm.rank
    zero = np.zeros(k, dtype=np.int64)
    empty = comm.alltoallv(np.zeros(0, np.float32), zero, zero)
    send = np.full(k, 2)
    got = comm.alltoallv(np.arange(2 * k, dtype=np.int64).reshape(k, 2) + 100 * rank, send, send)
    want = np.concatenate([np.arange(2 * rank, 2 * rank + 2) + 100 * s for s in range(k)])
    ok = empty.shape == (0,) and empty.dtype == np.float32 and np.array_equal(got, want)
    assert_all_ranks(ok, f"rank {rank}: empty {empty.shape}, 2-d got {got}", group)


def test_many_outstanding_waited_in_reverse(comm, group, assert_all_ranks):
    """ialltoall, ialltoallv and iallreduce in flight at once, waited in reverse order, give the blocking results."""
    k, rank, works = comm.size, comm.rank, []
    counts = counts_matrix(k, 5)
    for n in (1, 2000):
        buf = np.stack([block_of(rank, d, n, "float64") for d in range(k)])
        works.append((comm.ialltoall(buf), np.stack([block_of(s, rank, n, "float64") for s in range(k)])))
        vbuf = np.concatenate([block_of(rank, d, int(counts[rank, d]), "int32") for d in range(k)])
        works.append((comm.ialltoallv(vbuf, counts[rank], counts[:, rank]),
                      np.concatenate([block_of(s, rank, int(counts[s, rank]), "int32") for s in range(k)])))
        works.append((comm.iallreduce(np.full(n, rank + 1.0)), np.full(n, k * (k + 1) / 2)))
    bad = [i for i, (work, want) in reversed(list(enumerate(works))) if not np.array_equal(work.wait(), want)]
    assert_all_ranks(not bad, f"rank {rank}: handles {bad} wrong", group)


def test_bad_arguments_raise_naming_the_value_before_any_message(comm, group, assert_all_ranks):
    """TypeError/ValueError naming the bad value and the valid range; the next call still pairs up."""
    k, rank = comm.size, comm.rank
    good = np.ones((k, 2), np.float32)
    ones = np.full(k, 2)
    skewed = ones.copy()   # the same sum, but this rank's block to itself 3 sent and 2 received
    skewed[rank] += 1
    skewed[(rank + 1) % k] -= 1
    cases = [
        (lambda: comm.alltoall(np.ones((k + 1, 2), np.float32)), ValueError, f"size={k}"),
        (lambda: comm.alltoall(np.ones((k, 2), np.uint8)), TypeError, "uint8"),
        (lambda: comm.alltoall(good, out=np.ones((k, 3), np.float32)), ValueError, "expected shape"),
        (lambda: comm.alltoall(good, out=good), ValueError, "overlaps"),
        (lambda: comm.alltoallv(good, [2] * (k + 1), ones), ValueError, f"one per rank: {k}"),
        (lambda: comm.alltoallv(good, ones, [-1] * k), ValueError, "negative"),
        (lambda: comm.alltoallv(good, [2.0] * k, ones), TypeError, "2.0"),
        (lambda: comm.alltoallv(good, ones + 1, ones), ValueError, "sum(sendcounts) == buf.size"),
        (lambda: comm.alltoallv(good, ones, ones, out=np.ones(2 * k + 1, np.float32)), ValueError,
         f"({2 * k},)"),
        (lambda: comm.alltoallv(good, skewed, ones), ValueError, f"sendcounts[{rank}]=3"),
        (lambda: comm.alltoallv(good, "abc", ones), TypeError, "str"),
    ]
    problems = []
    for i, (call, kind, word) in enumerate(cases):
        if k == 1 and i == 9:
            continue   # one rank: sendcounts[0] is the whole buffer, which is fine
        try:
            call()
            problems.append(f"case {i}: no error")
        except kind as exc:
            if word not in str(exc):
                problems.append(f"case {i}: {exc!r} does not name {word!r}")
    after = comm.alltoall(np.arange(k, dtype=np.int64).reshape(k, 1) + 10 * rank)
    if not np.array_equal(after.ravel(), np.arange(k) * 10 + rank):
        problems.append(f"the call after gave {after.ravel()}")
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


@pytest.mark.parametrize("algorithm", [*registry.names("alltoall", builtin=True), "auto"])
def test_every_alltoall_algorithm_exact_blocking_and_not(algorithm, group, assert_all_ranks):
    """Each registered all-to-all algorithm, chosen by name on a hand-written backend: exact blocks for equal blocks
    (Bruck's packed rounds included) and per-pair counts, blocking and non-blocking; a split child keeps the choice."""
    comm = create("ring", group, algorithms={"alltoall": algorithm})
    k, rank, problems = comm.size, comm.rank, []
    for n in (1, 3, 1000, 5000):
        for dtype in ("float16", "int64"):
            buf = np.stack([block_of(rank, d, n, dtype) for d in range(k)])
            want = np.stack([block_of(s, rank, n, dtype) for s in range(k)])
            if not (np.array_equal(comm.alltoall(buf), want) and np.array_equal(comm.ialltoall(buf).wait(), want)):
                problems.append(f"alltoall n={n} {dtype}")
    counts = counts_matrix(k, 2)
    vbuf = np.concatenate([block_of(rank, d, int(counts[rank, d]), "float32") for d in range(k)])
    vwant = np.concatenate([block_of(s, rank, int(counts[s, rank]), "float32") for s in range(k)])
    if not np.array_equal(comm.alltoallv(vbuf, counts[rank], counts[:, rank]), vwant):
        problems.append("alltoallv")
    child = comm.split(0, key=-rank)
    if child.choice.chosen["alltoall"] != algorithm:
        problems.append(f"the split child runs {child.choice.chosen['alltoall']}")
    assert_all_ranks(not problems, f"{algorithm}: " + "; ".join(problems[:4]), group)


def test_an_unknown_alltoall_algorithm_is_refused_naming_the_valid_ones():
    with pytest.raises(ValueError, match="bruck"):
        create("ring", one_rank_group(), algorithms={"alltoall": "nope"})
    assert create("ring", one_rank_group()).choice.chosen["alltoall"] == "pairwise"
    assert create("auto", one_rank_group()).choice.chosen["alltoall"] == "auto"


def test_auto_prices_bruck_for_small_blocks_and_pairwise_for_large_ones():
    """By the cost model: at N = 8 Bruck's 3 steps beat N - 1 = 7 for 1 KiB, its extra bytes lose at 16 MiB."""
    alpha, beta, gamma = MODEL["mpi"]
    small = {n: registry.algorithm(n, "alltoall").cost(1024, 8, 1 << 20).time(alpha, beta, gamma)
             for n in ("bruck", "pairwise")}
    large = {n: registry.algorithm(n, "alltoall").cost(16 << 20, 8, 1 << 20).time(alpha, beta, gamma)
             for n in ("bruck", "pairwise")}
    assert small["bruck"] < small["pairwise"] and large["pairwise"] < large["bruck"], (small, large)
