"""Serial tests of what the backends share: checks, block layout, scratch pool, collective tags."""

import re

import numpy as np
import pytest

from npddp.comm import BACKENDS, DTYPES, OPS, create
from npddp.comm import checks as c
from npddp.comm.engine.call import TagSequence
from npddp.comm.engine.scratch import ScratchPool
from npddp.comm.engine.abort import CONTROL_TAG


def test_block_bounds_match_array_split():
    for size in range(1, 10):
        for n in [*range(0, 40), 1009, 2**20 + 3]:
            bounds = c.block_bounds(n, size)
            assert bounds.shape == (size + 1,) and bounds[0] == 0 and bounds[-1] == n
            blocks = np.array_split(np.arange(n), size)
            for i, block in enumerate(blocks):
                assert np.array_equal(np.arange(bounds[i], bounds[i + 1]), block), (n, size, i)


def test_check_op():
    for op, ufunc in OPS.items():
        assert c.check_op(op) is ufunc
    for bad in ("mean", "SUM", "", None, 3, ["sum"], np.str_("avg"[:0]), np.ones(3, np.float32), np.zeros(1)):
        with pytest.raises(ValueError, match=re.escape(repr(bad))) as err:
            c.check_op(bad)
        assert all(op in str(err.value) for op in OPS)
        assert ("out=" in str(err.value)) == isinstance(bad, np.ndarray)


def test_check_buffer_accepts_supported():
    for dtype in DTYPES:
        for shape in [(), (0,), (3,), (2, 3)]:
            a = np.zeros(shape, dtype=dtype)
            assert c.check_buffer(a) is a
            a.flags.writeable = False
            assert c.check_buffer(a, writable=False) is a


@pytest.mark.parametrize("dtype", ["complex64", "bool", "uint8", "int8", "int16", "uint64", "object"])
def test_check_buffer_rejects_dtype(dtype):
    with pytest.raises(TypeError, match=np.dtype(dtype).name) as err:
        c.check_buffer(np.zeros(3, dtype=dtype))
    assert all(d in str(err.value) for d in DTYPES)


def test_check_buffer_rejects_layout_and_type():
    with pytest.raises(TypeError, match="list"):
        c.check_buffer([1.0, 2.0])
    with pytest.raises(ValueError, match="C-contiguous"):
        c.check_buffer(np.zeros(10)[::2])
    with pytest.raises(ValueError, match="C-contiguous"):
        c.check_buffer(np.zeros((3, 4)).T)
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        c.check_buffer(ro)


def test_check_out():
    a = np.zeros((2, 3), dtype=np.float32)
    out = np.empty_like(a)
    assert c.check_out(a, out) is out
    with pytest.raises(ValueError, match=re.escape("(3, 2)")):
        c.check_out(a, np.empty((3, 2), np.float32))
    with pytest.raises(ValueError, match="float64"):
        c.check_out(a, np.empty((2, 3), np.float64))
    with pytest.raises(ValueError, match="overlaps"):
        c.check_out(a, a.reshape(3, 2).reshape(2, 3))
    with pytest.raises(TypeError, match="unsupported dtype complex64"):
        c.check_out(a, np.empty((2, 3), np.complex64))


def test_check_rank_and_tag():
    assert c.check_rank(np.int64(2), 3) == 2 and type(c.check_rank(np.int64(2), 3)) is int
    for bad in (3, -1, 100):
        with pytest.raises(ValueError, match=rf"root={bad} .*0\.\.2"):
            c.check_rank(bad, 3)
    for bad in (1.0, "0", True, None):
        with pytest.raises(TypeError, match=type(bad).__name__):
            c.check_rank(bad, 3, "dest")
    assert c.check_tag(0) == 0 and c.check_tag(c.USER_TAG_LIMIT - 1) == c.USER_TAG_LIMIT - 1
    for bad in (-1, c.USER_TAG_LIMIT, 10**9):
        with pytest.raises(ValueError, match=rf"tag={bad} .*{c.USER_TAG_LIMIT - 1}"):
            c.check_tag(bad)
    with pytest.raises(TypeError, match="float"):
        c.check_tag(1.5)


def test_check_stacked():
    a = np.zeros((4, 2))
    assert c.check_stacked(a, 4) is a
    for bad, size in ((np.zeros((3, 2)), 4), (np.zeros(()), 1)):
        with pytest.raises(ValueError, match=re.escape(str(bad.shape))):
            c.check_stacked(bad, size)


def test_tag_sequence_stays_above_user_tags_and_wraps_short_of_the_abort_tag():
    tags, span = TagSequence(), c.COLLECTIVE_TAG_SPAN - 1   # the span's last tag carries the argument check's aborts
    seen = [tags.next() for _ in range(span + 3)]
    assert seen[0] == c.USER_TAG_LIMIT
    assert min(seen) == c.USER_TAG_LIMIT and max(seen) == c.USER_TAG_LIMIT + span - 1 == CONTROL_TAG - 1
    assert seen[span:] == seen[:3]
    assert len(set(seen[:span])) == span


def test_scratch_pool_reuses_and_grows():
    pool = ScratchPool()
    a = pool.acquire(100)
    assert len(a) >= 100 and (pool.nbuffers, pool.nbytes) == (1, len(a))
    pool.release(a)
    assert pool.acquire(50) is a  # a free buffer that fits is lent again
    b = pool.acquire(10)  # a is lent: a second buffer
    assert b is not a and pool.nbuffers == 2
    pool.release(a)
    pool.release(b)
    big = pool.acquire(1000)  # nothing fits: the largest free buffer is replaced
    assert len(big) >= 1000 and pool.nbuffers == 2 and pool.nbytes == len(big) + len(b)
    pool.release(big)
    for _ in range(10):
        pool.release(pool.acquire(1000))
        pool.release(pool.acquire(5))
    assert pool.nbuffers == 2 and pool.nbytes == len(big) + len(b)


def test_create_rejects_unknown_backend():
    for bad in ("nccl", "Ring", ""):
        with pytest.raises(ValueError, match=re.escape(repr(bad))) as err:
            create(bad)
        assert all(name in str(err.value) for name in BACKENDS)
