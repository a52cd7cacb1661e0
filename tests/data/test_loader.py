"""Batch iteration: order, sizes, offsets, reused buffers and errors."""

import numpy as np
import pytest

from npddp.data import BatchLoader, DistributedSampler, iterate_batches, num_batches


def make_arrays(n, x_tail=(3,), y_tail=()):
    """X whose rows are tagged by row number, and y = row number (shaped as asked)."""
    X = np.arange(n * int(np.prod(x_tail)), dtype=np.float32).reshape((n,) + x_tail)
    y = np.arange(n * int(np.prod(y_tail)), dtype=np.int64).reshape((n,) + y_tail)
    return X, y


@pytest.mark.parametrize("reuse_buffers", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_follow_indices(drop_last, reuse_buffers):
    rng = np.random.default_rng(0)
    for n in (1, 5, 16, 23):
        X, y = make_arrays(n, x_tail=(2, 3), y_tail=(2,))
        for m in (0, 1, 7, 16, 40):
            idx = rng.integers(0, n, size=m)
            for bs in (1, 3, 4, 16, 50):
                total = num_batches(m, bs, drop_last)
                assert total == (m // bs if drop_last else -(-m // bs))
                for start in sorted({s for s in (0, 1, total // 2, total) if s <= total}):
                    got = [(xb.copy(), yb.copy(), xb.shape[0])
                           for xb, yb in iterate_batches(X, y, idx, bs, drop_last=drop_last,
                                                         start_batch=start,
                                                         reuse_buffers=reuse_buffers)]
                    ctx = f"n={n} m={m} bs={bs} start={start}"
                    assert len(got) == total - start, ctx
                    sizes = [g[2] for g in got]
                    expect_sizes = [min(bs, m - b * bs) for b in range(start, total)]
                    assert sizes == expect_sizes, ctx
                    if drop_last:
                        assert all(s == bs for s in sizes), ctx
                    used = idx[start * bs:start * bs + sum(sizes)]
                    if got:
                        assert np.array_equal(np.concatenate([g[0] for g in got]), X[used]), ctx
                        assert np.array_equal(np.concatenate([g[1] for g in got]), y[used]), ctx
                        assert all(g[0].dtype == X.dtype and g[1].dtype == y.dtype for g in got)


def test_last_partial_batch():
    X, y = make_arrays(10)
    sizes = [len(yb) for _, yb in iterate_batches(X, y, np.arange(10), 4)]
    assert sizes == [4, 4, 2]
    assert [yb.tolist() for _, yb in iterate_batches(X, y, np.arange(10), 4)][-1] == [8, 9]
    assert [len(yb) for _, yb in iterate_batches(X, y, np.arange(10), 4, drop_last=True)] == [4, 4]


def test_reused_buffers_are_reused():
    X, y = make_arrays(12)
    seen = []
    for xb, yb in iterate_batches(X, y, np.arange(12)[::-1], 5, reuse_buffers=True):
        seen.append((xb, yb, yb.tolist()))
    assert [s[2] for s in seen] == [[11, 10, 9, 8, 7], [6, 5, 4, 3, 2], [1, 0]]
    assert np.shares_memory(seen[0][0], seen[1][0]) and np.shares_memory(seen[0][1], seen[2][1])
    fresh = list(iterate_batches(X, y, np.arange(12), 5))
    assert not np.shares_memory(fresh[0][0], fresh[1][0])


def test_loader_with_sampler():
    X, y = make_arrays(37)
    for reps in (1, 2, 3, 4):
        for bs in (1, 4, 8):
            for drop_last in (False, True):
                loaders = [BatchLoader(X, y, DistributedSampler(37, reps, r, seed=2), bs,
                                       drop_last=drop_last) for r in range(reps)]
                for epoch in (0, 1):
                    for ld in loaders:
                        ld.set_epoch(epoch)
                    for ld in loaders:
                        batches = list(ld)
                        assert len(batches) == len(ld) == num_batches(len(ld.sampler), bs, drop_last)
                        labels = np.concatenate([yb for _, yb in batches]) if batches else []
                        n_used = len(ld) * bs if drop_last else len(ld.sampler)
                        assert np.array_equal(labels, ld.sampler.indices()[:n_used])
                        for k in range(len(ld) + 1):  # resume at every offset
                            tail = [yb for _, yb in ld.batches(start_batch=k)]
                            assert len(tail) == len(batches) - k
                            assert all(np.array_equal(a, b[1]) for a, b in zip(tail, batches[k:]))
                # every row seen at least once per epoch across ranks, without drop_last
                if not drop_last:
                    seen = np.concatenate([np.concatenate([yb for _, yb in ld]) for ld in loaders])
                    assert set(seen.tolist()) == set(range(37))


def test_new_epoch_new_batches():
    X, y = make_arrays(64)
    ld = BatchLoader(X, y, DistributedSampler(64, 2, 1, seed=0), 8)
    first = np.concatenate([yb for _, yb in ld])
    ld.set_epoch(1)
    second = np.concatenate([yb for _, yb in ld])
    assert not np.array_equal(first, second)
    assert ld.sampler.epoch == 1


def test_plain_lists_of_ints_as_indices():
    X, y = make_arrays(6)
    out = [yb.tolist() for _, yb in iterate_batches(X, y, [5, 0, 3], 2)]
    assert out == [[5, 0], [3]]


@pytest.mark.parametrize("call, exc, pattern", [
    (lambda X, y: list(iterate_batches(X, y, [0, 1], 0)), ValueError, r"batch_size must be >= 1, got 0"),
    (lambda X, y: list(iterate_batches(X, y, [0, 1], 2.0)), TypeError, r"batch_size must be an int"),
    (lambda X, y: list(iterate_batches(X, y, [0, 10], 2)), ValueError, r"index 10 out of range.*\[0, 10\)"),
    (lambda X, y: list(iterate_batches(X, y, [-1, 0], 2)), ValueError, r"index -1 out of range"),
    (lambda X, y: list(iterate_batches(X, y, [0.0, 1.0], 2)), TypeError, r"1-D integer array"),
    (lambda X, y: list(iterate_batches(X, y, [[0, 1]], 2)), TypeError, r"1-D integer array"),
    (lambda X, y: list(iterate_batches(X, y[:9], [0], 2)), ValueError, r"same number of rows, got 10 and 9"),
    (lambda X, y: list(iterate_batches(X.tolist(), y, [0], 2)), TypeError, r"X must be a numpy.ndarray"),
    (lambda X, y: list(iterate_batches(X, y, range(10), 3, start_batch=5)), ValueError,
     r"0 <= start_batch <= 4.*got 5"),
    (lambda X, y: list(iterate_batches(X, y, range(10), 3, start_batch=-1)), ValueError,
     r"0 <= start_batch <= 4.*got -1"),
    (lambda X, y: list(iterate_batches(X, y, range(10), 3, drop_last=True, start_batch=4)), ValueError,
     r"0 <= start_batch <= 3.*got 4"),
    (lambda X, y: num_batches(-1, 2), ValueError, r"num_indices must be >= 0, got -1"),
    (lambda X, y: BatchLoader(X, y, [0, 1], 2), TypeError, r"sampler must have indices\(\)"),
    (lambda X, y: BatchLoader(X, y, DistributedSampler(10, 1, 0), -4), ValueError,
     r"batch_size must be >= 1, got -4"),
])
def test_errors(call, exc, pattern):
    X, y = make_arrays(10)
    with pytest.raises(exc, match=pattern):
        call(X, y)


def test_errors_raised_before_first_batch():
    """Bad arguments fail at the call, not lazily on the first next()."""
    X, y = make_arrays(10)
    with pytest.raises(ValueError):
        iterate_batches(X, y, range(10), 3, start_batch=9)
