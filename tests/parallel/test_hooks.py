"""npddp.parallel.hooks on one process: what the fp16 wrapper hands the communicator, step after step."""

import numpy as np

from npddp.parallel import hooks
from npddp.parallel.hooks import GradBucket


class Recorder:
    """A two-rank stand-in that records each buffer it is given and sums it with a copy of itself."""

    size = 2

    def __init__(self):
        self.buffers = []

    def iallreduce(self, buf, op="sum"):
        self.buffers.append(buf)
        buf *= 2
        return Done(buf)


class Done:
    def __init__(self, buf):
        self.buf = buf

    def test(self):
        return True

    def wait(self):
        return self.buf


class Param:
    def __init__(self, n):
        self.data = np.zeros(n, dtype=np.float32)


def test_fp16_reuses_one_half_copy_per_bucket_and_keeps_the_result_exact_for_halves():
    comm = Recorder()
    buffers = [np.zeros(n, dtype=np.float32) for n in (1000, 1000, 37)]
    for step in range(3):
        for i, buf in enumerate(buffers):
            buf[...] = np.arange(buf.size) % 300 * (step + 1) + i   # integers below 1024: exact in float16 halved
            expected = buf.copy()
            got = hooks.fp16_compress_hook(comm, GradBucket(i, buf, [Param(buf.size)], i == 2)).wait()
            assert got is buf and np.array_equal(buf, expected), (step, i)
    halves = [b.__array_interface__["data"][0] for b in comm.buffers]
    assert all(b.dtype == np.float16 for b in comm.buffers)
    for i in range(3):  # the same bucket gets the same float16 buffer every step; different buckets, different ones
        assert halves[i] == halves[i + 3] == halves[i + 6]
    assert len(set(halves[:3])) == 3


def test_fp16_forgets_buffers_that_come_and_go_instead_of_growing_without_bound():
    wrapped = hooks.fp16_compress_wrapper(hooks.allreduce_prescaled)
    comm = Recorder()
    for i in range(hooks._MAX_HALVES * 2 + 3):
        buf = np.full(8, 2.0, dtype=np.float32)
        assert np.array_equal(wrapped(comm, GradBucket(0, buf, [Param(8)], True)).wait(), np.full(8, 2.0))
    closure = {c.cell_contents.__class__ for c in wrapped.__closure__}
    halves = next(c.cell_contents for c in wrapped.__closure__ if isinstance(c.cell_contents, dict))
    assert dict in closure and len(halves) <= hooks._MAX_HALVES
