"""DDP's default bucket reduction is the backends' fused average: one ``op="avg"`` call per bucket, no pass after it."""

import numpy as np
import pytest

from npddp.comm import create
from npddp.parallel import hooks
from npddp.parallel.ddp import DistributedDataParallel
from npddp.nn import mlp


class OpSpy:
    """A communicator wrapper that records the op of every all-reduce."""

    def __init__(self, inner, ops: list):
        self.inner, self.ops = inner, ops

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def allreduce(self, buf, op="sum", out=None):
        self.ops.append(op)
        return self.inner.allreduce(buf, op, out)

    def iallreduce(self, buf, op="sum"):
        self.ops.append(op)
        return self.inner.iallreduce(buf, op)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("backend", ["mpi", "auto", "ring"])
@pytest.mark.parametrize("sync, compression, op", [("overlap", "allreduce", "avg"), ("flat", "allreduce", "avg"),
                                                    ("bucketed", "fp16", "sum")])
def test_buckets_are_averaged_by_the_backend(backend, sync, compression, op, world, assert_all_ranks):
    """The default hook makes one avg call per bucket; fp16 pre-divides and sums (PyTorch's order)."""
    comm = create(backend, world.fresh())
    model = mlp(6, [5], 3, dtype=np.float64, seed=1)
    ops: list = []
    spy = OpSpy(comm, ops)
    ddp = DistributedDataParallel(model, spy, sync=sync, bucket_cap_mb=1e-4)
    if compression == "fp16":
        ddp.register_comm_hook(spy, hooks.fp16_compress_hook)
    grads = [np.random.default_rng(comm.rank).standard_normal(b.buffer.size) for b in ddp.buckets]
    expected = [comm.allreduce(g.copy()) / comm.size for g in grads]   # the average, computed apart
    ops.clear()
    for b, g in zip(ddp.buckets, grads):
        b.buffer[...] = g
    for b in ddp.buckets:
        ddp._start(b)
    for b in ddp.buckets:
        ddp._finish(b)
    tol = 1e-3 if compression == "fp16" else 1e-12
    ok = ops == [op] * len(ddp.buckets) and all(np.allclose(b.buffer, e, rtol=0, atol=tol)
                                                   for b, e in zip(ddp.buckets, expected))
    assert_all_ranks(ok, f"ops {ops}; buckets {len(ddp.buckets)}", world)
