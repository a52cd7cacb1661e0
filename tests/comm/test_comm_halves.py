"""Non-blocking ireduce_scatter and iallgather (with out=) on every backend, against their blocking forms."""

import tracemalloc

import numpy as np
import pytest

from npddp.comm import DTYPES, OPS, create
from tests.helpers.groups import new_held


def sizes(k: int) -> list[int]:
    """0, 1, fewer than the ranks, not divisible by them, and a few chunks' worth."""
    return sorted({0, 1, max(k - 1, 0), k + 1, 2 * k + 1, 1009})


def test_ireduce_scatter_exact_and_as_blocking(comm, group, values, assert_all_ranks, assert_ranks_agree_on_all):
    """Exact block r of the reduction for every dtype, op and size; the blocking call's bits; out= returned."""
    k, problems, gathered = comm.size, [], []
    rng = np.random.default_rng(3 + comm.rank)
    for n in sizes(k):
        for dtype in DTYPES:
            for op in OPS:
                x = values.rank(n, comm.rank, dtype, op).reshape(1, n)
                x.flags.writeable = False
                out = np.full(len(np.array_split(np.arange(n), k)[comm.rank]), -7, dtype=dtype)
                got = comm.ireduce_scatter(x, op, out=out).wait()
                want = np.array_split(values.expected(n, k, dtype, op), k)[comm.rank]
                if got is not out or not np.array_equal(got, want):
                    problems.append(f"n={n} {dtype} {op}: got {got[:4]}, expected {want[:4]}")
        y = rng.standard_normal(n).astype(np.float32)  # rounded sums: the order of addition shows in the bits
        for op in ("sum", "avg"):
            if comm.ireduce_scatter(y, op).wait().tobytes() != comm.reduce_scatter(y, op).tobytes():
                problems.append(f"n={n} {op}: non-blocking bits differ from the blocking call's")
        for dtype in ("float16", "float32", "float64"):   # avg: the exact sum of small integers, divided once
            x = values.rank(n, comm.rank, dtype, "sum")
            want = (np.array_split(values.expected(n, k, "float64", "sum"), k)[comm.rank] / k).astype(dtype)
            if not np.allclose(comm.ireduce_scatter(x, "avg").wait(), want, rtol=1e-3 if dtype == "float16" else 1e-6):
                problems.append(f"n={n} {dtype} avg is not the sum / {k}")
        gathered.append(comm.iallgather(comm.ireduce_scatter(y).wait()[:1].copy() if n >= k else
                                        np.zeros(1, np.float32)).wait())
    assert_ranks_agree_on_all(gathered, group)
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


def test_iallgather_out_and_in_place(comm, group, assert_all_ranks, assert_ranks_agree_on_all):
    """Every rank's rows in order, into out= (also when the input is out[rank]); shapes 0-d to 2-d."""
    k, problems, results = comm.size, [], []
    for shape in [(), (0,), (1,), (k + 1,), (1009,), (2, 3)]:
        for dtype in DTYPES:
            mine = ((np.arange(int(np.prod(shape))) % 500) + 1000 * comm.rank).astype(dtype).reshape(shape)
            want = np.stack([((np.arange(int(np.prod(shape))) % 500) + 1000 * r).astype(dtype).reshape(shape)
                             for r in range(k)])
            out = np.full((k, *shape), -1, dtype=dtype)
            got = comm.iallgather(mine, out=out).wait()
            inplace = np.full((k, *shape), -1, dtype=dtype)
            inplace[comm.rank] = mine
            comm.iallgather(inplace[comm.rank:comm.rank + 1].reshape(shape), out=inplace).wait()
            for label, arr in (("out", got), ("in place", inplace)):
                if arr.shape != want.shape or not np.array_equal(arr, want):
                    problems.append(f"{label} shape={shape} {dtype}")
            if got is not out:
                problems.append("iallgather did not return out")
            results.append(got)
    assert_ranks_agree_on_all(results, group)
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


def test_many_outstanding_waited_in_any_order(comm, group, assert_all_ranks):
    """Several reduce-scatters, all-gathers and all-reduces in flight at once, waited in reverse order."""
    k, problems = comm.size, []
    xs = [np.arange(n, dtype=np.float64) + comm.rank for n in (5, 1009, 3 * k + 2)]
    works = []
    for x in xs:
        works.append(("rs", x, comm.ireduce_scatter(x)))
        works.append(("ag", x, comm.iallgather(x)))
        works.append(("ar", x, comm.iallreduce(x.copy())))
    for kind, x, work in reversed(works):
        got = work.wait()
        total = k * (np.arange(x.size, dtype=np.float64)) + k * (k - 1) / 2
        want = {"rs": np.array_split(total, k)[comm.rank], "ag": np.stack([x - comm.rank + r for r in range(k)]),
                "ar": total}[kind]
        if not np.array_equal(got, want):
            problems.append(f"{kind} n={x.size}")
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


@pytest.mark.parametrize("progress", ["caller", "thread"])
def test_steady_state_allocates_nothing(backend, group, progress, assert_all_ranks):
    """With out= and warm caches, a call allocates far less than its buffer (traced by tracemalloc)."""
    comm = create(backend, group, progress=progress)
    n = 1 << 16
    x = np.ones(n, dtype=np.float32)
    block = np.empty(len(np.array_split(np.arange(n), comm.size)[comm.rank]), dtype=np.float32)
    stacked = np.empty((comm.size, n), dtype=np.float32)
    for _ in range(2):  # warm-up: plans, scratch pool
        comm.ireduce_scatter(x, out=block).wait()
        comm.iallgather(x, out=stacked).wait()
    world = getattr(group, "world", None)  # TCP keeps buffers for frames that come before their receive
    held = world.held_bytes() if world is not None else 0
    tracemalloc.start()
    try:
        for _ in range(3):
            comm.ireduce_scatter(x, out=block).wait()
            comm.iallgather(x, out=stacked).wait()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # TCP: early frames of a peer that ran ahead, and one frame that may be mid-read (test_comm_p2p_only's rule)
    early = new_held(world, held) + (x.nbytes if world is not None else 0)
    assert_all_ranks(peak < x.nbytes // 8 + early and np.all(block == comm.size) and np.all(stacked == 1),
                     f"{backend}: peak {peak} bytes traced for {x.nbytes}-byte calls", group)


def test_bad_arguments_raise_before_any_message(comm, group, assert_all_ranks):
    """Each rank fails alone and the next collective still matches up: nothing was sent."""
    k, problems = comm.size, []
    x = np.zeros(2 * k + 1, dtype=np.float32)
    bad = [(lambda: comm.ireduce_scatter(x, "mean"), ValueError, "valid ops"),
           (lambda: comm.ireduce_scatter(x.astype(np.int32), "avg"), TypeError, "floating dtype"),
           (lambda: comm.ireduce_scatter(x.astype(np.int8)), TypeError, "valid dtypes"),
           (lambda: comm.ireduce_scatter(x, out=np.empty(99, np.float32)), ValueError, "expected shape"),
           (lambda: comm.ireduce_scatter(x, out=np.empty(3 if comm.rank == 0 else 2, np.float64)), ValueError,
            "dtype"),
           (lambda: comm.ireduce_scatter(x, out=x[:3 if comm.rank == 0 else 2]), ValueError, "overlaps"),
           (lambda: comm.iallgather(x, out=np.empty((k + 1, x.size), np.float32)), ValueError, "expected shape"),
           (lambda: comm.iallgather(x[::2]), ValueError, "C-contiguous"),
           (lambda: comm.iallgather([1.0]), TypeError, "numpy.ndarray")]
    stacked = np.empty((k, x.size), np.float32)
    bad.append((lambda: comm.iallgather(stacked[comm.rank, 1:].copy(), out=stacked), ValueError, "expected shape"))
    backing = np.empty(k * x.size + 1, np.float32)  # out and input overlap by all but one element
    bad.append((lambda: comm.iallgather(backing[:x.size], out=backing[1:].reshape(k, x.size)), ValueError,
                "overlaps"))
    for i, (call, error, words) in enumerate(bad):
        try:
            call()
            problems.append(f"case {i}: no error")
        except error as exc:
            if words not in str(exc):
                problems.append(f"case {i}: {exc}")
    got = comm.iallgather(np.array([comm.rank], np.int64)).wait()
    if got.ravel().tolist() != list(range(k)):
        problems.append(f"the next collective got {got.ravel().tolist()}")
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


@pytest.mark.parametrize("name", ["ring", "naive", "tree"])
def test_debug_wrapper_checks_and_forwards(name, group, assert_all_ranks):
    """NPDDP_DEBUG's wrapper fingerprints the new calls and returns the backend's own handle's result."""
    comm = create(name, group, debug=True)
    x = np.arange(7, dtype=np.int32) + comm.rank
    block = comm.ireduce_scatter(x, "max").wait()
    table = comm.iallgather(x[:2].copy()).wait()
    k = comm.size
    ok = (np.array_equal(block, np.array_split(np.arange(7) + k - 1, k)[comm.rank])
          and table.tolist() == [[r, r + 1] for r in range(k)] and comm.collectives == 2)
    assert_all_ranks(ok, f"{name}: block {block}, table {table.tolist()}", group)
