"""DistributedSampler: hand-worked index lists, a reference built from the spec, PyTorch's own
sampler as an oracle (when torch is installed), and errors."""

import functools
import math

import numpy as np
import pytest

from npddp.data import DistributedSampler
from npddp.data.randperm import torch_randperm


def rank_lists(n, reps, **kw):
    """Every rank's indices as Python lists."""
    return [DistributedSampler(n, reps, r, **kw).indices().tolist() for r in range(reps)]


@functools.lru_cache(maxsize=None)
def _permutation(n, seed):
    return tuple(torch_randperm(n, seed).tolist())


def reference(n, reps, rank, shuffle, seed, epoch, drop_last):
    """The spec written out with Python lists: pad by repeating from the start, or cut."""
    if drop_last and n % reps != 0:
        num_samples = math.ceil((n - reps) / reps)
    else:
        num_samples = math.ceil(n / reps)
    total = num_samples * reps
    order = list(_permutation(n, seed + epoch)) if shuffle else list(range(n))
    if not drop_last:
        pad = total - len(order)
        if pad <= len(order):
            order += order[:pad]
        else:
            order += (order * math.ceil(pad / len(order)))[:pad]
    else:
        order = order[:total]
    assert len(order) == total
    return order[rank:total:reps], num_samples


# --- hand-worked examples -------------------------------------------------------------------

@pytest.mark.parametrize("n, reps, drop_last, expected", [
    (10, 4, False, [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]),
    (10, 4, True, [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (7, 3, False, [[0, 3, 6], [1, 4, 0], [2, 5, 1]]),
    (7, 3, True, [[0, 3], [1, 4], [2, 5]]),
    (8, 4, False, [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (8, 4, True, [[0, 4], [1, 5], [2, 6], [3, 7]]),
    # fewer rows than ranks: padding repeats the list several times over
    (3, 8, False, [[0], [1], [2], [0], [1], [2], [0], [1]]),
    (2, 5, False, [[0], [1], [0], [1], [0]]),
    (1, 3, False, [[0], [0], [0]]),
    (3, 4, True, [[], [], [], []]),
    (0, 3, False, [[], [], []]),
    (0, 3, True, [[], [], []]),
    (5, 1, False, [[0, 1, 2, 3, 4]]),
])
def test_hand_worked_unshuffled(n, reps, drop_last, expected):
    assert rank_lists(n, reps, shuffle=False, drop_last=drop_last) == expected
    for r, exp in enumerate(expected):
        s = DistributedSampler(n, reps, r, shuffle=False, drop_last=drop_last)
        assert len(s) == len(exp)
        assert list(s) == exp


def test_hand_worked_shuffled():
    """len=5, N=2: rank r takes the padded permutation at positions r, r+2, r+4."""
    perm = [1, 3, 0, 4, 2]                      # torch.randperm(5) after manual_seed(3 + 2)
    padded = perm + perm[:1]
    samplers = [DistributedSampler(5, 2, r, seed=3) for r in range(2)]
    for s in samplers:
        s.set_epoch(2)
    got = [s.indices().tolist() for s in samplers]
    assert got == [padded[0::2], padded[1::2]]
    dropped = [DistributedSampler(5, 2, r, seed=3, drop_last=True) for r in range(2)]
    for s in dropped:
        s.set_epoch(2)
    assert [s.indices().tolist() for s in dropped] == [perm[0:4:2], perm[1:4:2]]


# --- properties over many configurations ----------------------------------------------------

LENGTHS = list(range(0, 14)) + [17, 31, 64, 100, 257]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_matches_spec_and_covers(drop_last, shuffle):
    for n in LENGTHS:
        for reps in range(1, 8):
            for seed, epoch in ((0, 0), (7, 3)):
                samplers = [DistributedSampler(n, reps, r, shuffle=shuffle, seed=seed,
                                               drop_last=drop_last) for r in range(reps)]
                for s in samplers:
                    s.set_epoch(epoch)
                got = [s.indices() for s in samplers]
                ctx = f"n={n} N={reps} seed={seed} epoch={epoch}"
                for r, idx in enumerate(got):
                    exp, num_samples = reference(n, reps, r, shuffle, seed, epoch, drop_last)
                    assert idx.dtype == np.int64, ctx
                    assert idx.tolist() == exp, f"{ctx} rank={r}"
                    assert len(samplers[r]) == num_samples == len(idx), ctx
                    assert samplers[r].total_size == num_samples * reps, ctx
                flat = np.concatenate(got)
                counts = np.bincount(flat, minlength=n)
                if drop_last:  # no row twice, and exactly total_size rows read
                    assert counts.max(initial=0) <= 1, ctx
                    assert flat.size == reps * (n // reps), ctx
                else:          # every row read; padding spreads evenly over the rows
                    assert counts.min(initial=1) >= 1, ctx
                    assert flat.size == reps * -(-n // reps), ctx
                    if n:
                        assert counts.max() <= -(-flat.size // n), ctx
                if n % reps == 0 or drop_last:
                    assert np.unique(flat).size == flat.size, f"ranks overlap: {ctx}"


def test_same_epoch_same_order_new_epoch_new_order():
    for n in (10, 50, 1000):
        for reps in (1, 2, 3, 4):
            a = [DistributedSampler(n, reps, r, seed=5) for r in range(reps)]
            b = [DistributedSampler(n, reps, r, seed=5) for r in range(reps)]
            orders = []
            for epoch in range(4):
                for s in a + b:
                    s.set_epoch(epoch)
                assert all(np.array_equal(s.order(), a[0].order()) for s in a + b)
                for sa, sb in zip(a, b):
                    assert np.array_equal(sa.indices(), sb.indices())
                    assert np.array_equal(sa.indices(), sa.indices())  # repeatable
                orders.append(a[0].order())
            for i in range(4):
                for j in range(i):
                    assert not np.array_equal(orders[i], orders[j]), (n, reps, i, j)


def test_order_depends_on_seed_plus_epoch():
    s1 = DistributedSampler(100, 2, 0, seed=4)
    s2 = DistributedSampler(100, 2, 0, seed=1)
    s1.set_epoch(1)
    s2.set_epoch(4)  # same seed + epoch
    assert np.array_equal(s1.indices(), s2.indices())
    s3 = DistributedSampler(100, 2, 0, seed=2)
    s3.set_epoch(1)
    assert not np.array_equal(s1.indices(), s3.indices())
    assert s1.order()[:12].tolist() == [11, 22, 39, 23, 42, 30, 78, 81, 64, 20, 29, 79]   # torch, seed 5
    s4 = DistributedSampler(10, 1, 0, seed=0)
    assert s4.order().tolist() == [4, 1, 7, 5, 3, 9, 0, 8, 6, 2]                         # torch, seed 0


def test_unshuffled_ignores_epoch():
    s = DistributedSampler(11, 3, 1, shuffle=False)
    first = s.indices()
    s.set_epoch(9)
    assert np.array_equal(s.indices(), first)
    assert first.tolist() == [1, 4, 7, 10]


def test_iter_yields_python_ints():
    s = DistributedSampler(9, 2, 1, seed=3)
    items = list(s)
    assert all(type(i) is int for i in items)
    assert items == s.indices().tolist()


def test_indices_is_a_fresh_array():
    s = DistributedSampler(10, 2, 0, shuffle=False)
    idx = s.indices()
    idx[:] = -1
    assert s.indices().tolist() == [0, 2, 4, 6, 8]


def test_state_dict_round_trip():
    s = DistributedSampler(40, 3, 2, seed=11)
    s.set_epoch(6)
    state = s.state_dict()
    assert state == {"epoch": 6, "seed": 11}
    fresh = DistributedSampler(40, 3, 2, seed=0)
    fresh.load_state_dict(state)
    assert (fresh.epoch, fresh.seed) == (6, 11)
    assert np.array_equal(fresh.indices(), s.indices())
    with pytest.raises(KeyError, match="epoch"):
        fresh.load_state_dict({"seed": 1})
    with pytest.raises(ValueError, match="-2"):
        fresh.load_state_dict({"epoch": -2, "seed": 1})
    assert (fresh.epoch, fresh.seed) == (6, 11)  # unchanged by the failed loads


def test_numpy_ints_accepted():
    s = DistributedSampler(np.int64(10), np.int32(4), np.int64(3), seed=np.uint8(2))
    s.set_epoch(np.int64(1))
    assert len(s) == 3 and s.epoch == 1 and type(s.dataset_len) is int


# --- errors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, pattern", [
    (dict(dataset=10, num_replicas=4, rank=4), ValueError, r"0 <= rank < num_replicas=4.*got 4"),
    (dict(dataset=10, num_replicas=4, rank=-1), ValueError, r"0 <= rank < num_replicas=4.*got -1"),
    (dict(dataset=10, num_replicas=0, rank=0), ValueError, r"num_replicas must be >= 1, got 0"),
    (dict(dataset=10, num_replicas=-3, rank=0), ValueError, r"num_replicas must be >= 1, got -3"),
    (dict(dataset=-1, num_replicas=2, rank=0), ValueError, r"dataset_len must be >= 0, got -1"),
    (dict(dataset=10.0, num_replicas=2, rank=0), TypeError, r"dataset must be a sized object.*or an int, got float 10.0"),
    (dict(dataset="10", num_replicas=2, rank=0), TypeError, r"dataset must be a sized object.*str '10'"),
    (dict(dataset=True, num_replicas=2, rank=0), TypeError, r"dataset must be a sized object.*bool"),
    (dict(dataset=10, num_replicas=2.0, rank=0), TypeError, r"num_replicas must be an int"),
    (dict(dataset=10, num_replicas=2, rank=None), TypeError, r"rank must be an int.*None"),
    (dict(dataset=10, num_replicas=2, rank=0, seed=-1), ValueError, r"seed must be >= 0, got -1"),
    (dict(dataset=10, num_replicas=2, rank=0, seed=1.5), TypeError, r"seed must be an int"),
])
def test_constructor_errors(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        DistributedSampler(**kwargs)


def test_sized_dataset_gives_the_row_count():
    """PyTorch's call, DistributedSampler(dataset, num_replicas, rank): len() of the dataset gives the rows."""
    rows = np.zeros((10, 3), dtype=np.float32)
    for dataset in (rows, list(range(10)), range(10)):
        assert rank_lists_of(dataset, 4) == rank_lists(10, 4)
    assert DistributedSampler(dataset=rows, num_replicas=4, rank=1, shuffle=False).dataset_len == 10


def rank_lists_of(dataset, reps):
    """Every rank's indices for a sized ``dataset``, as Python lists."""
    return [DistributedSampler(dataset, reps, r).indices().tolist() for r in range(reps)]


@pytest.mark.parametrize("bad", [np.zeros((1024, 64)), np.arange(5000.0)])
def test_errors_never_print_a_whole_array(bad):
    """An array where a number belongs is named by shape, not printed in full."""
    for call in (lambda: DistributedSampler(10, bad, 0), lambda: DistributedSampler(10, 2, bad),
                 lambda: DistributedSampler(10, 2, 0, seed=bad), lambda: DistributedSampler(10, 2, 0).set_epoch(bad)):
        with pytest.raises(TypeError) as info:
            call()
        text = str(info.value)
        assert f"ndarray of shape {bad.shape} float64" in text and len(text) < 200, text


def test_set_epoch_errors():
    s = DistributedSampler(10, 2, 0)
    with pytest.raises(ValueError, match=r"epoch must be >= 0, got -1"):
        s.set_epoch(-1)
    with pytest.raises(TypeError, match=r"epoch must be an int.*1.5"):
        s.set_epoch(1.5)
    assert s.epoch == 0


# --- PyTorch itself as the oracle -------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 64, 97, 1000, 4099])
def test_torch_randperm_is_reproduced_exactly(n):
    torch = pytest.importorskip("torch")
    for seed in (0, 1, 5, 2**31 - 1, 2**32 + 7, 123456789012):
        g = torch.Generator()
        g.manual_seed(seed)
        assert torch_randperm(n, seed).tolist() == torch.randperm(n, generator=g).tolist(), (n, seed)


@pytest.mark.parametrize("n, reps", [(10, 3), (97, 4), (5, 8), (64, 2), (1, 3), (0, 2)])
@pytest.mark.parametrize("shuffle, drop_last", [(True, False), (True, True), (False, False), (False, True)])
def test_indices_equal_torch_distributed_samplers(n, reps, shuffle, drop_last):
    """Every rank, several epochs and seeds: the same index lists as torch.utils.data.DistributedSampler."""
    pytest.importorskip("torch")
    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    data = list(range(n))
    for seed in (0, 3):
        for epoch in (0, 1, 5):
            for rank in range(reps):
                ours = DistributedSampler(n, reps, rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
                theirs = TorchSampler(data, num_replicas=reps, rank=rank, shuffle=shuffle, seed=seed,
                                      drop_last=drop_last)
                ours.set_epoch(epoch)
                theirs.set_epoch(epoch)
                assert ours.indices().tolist() == list(theirs), (seed, epoch, rank)
                assert len(ours) == len(theirs)
