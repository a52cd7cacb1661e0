"""The built-in comm hooks against PyTorch's on the same buckets (torch on CPU; no GPU, no launcher).

One rank: PyTorch's own ``fp16_compress_hook`` and ``powerSGD_hook`` run in a gloo process group
of one, given the same buckets and (PowerSGD) the same initial Q; several steps exercise the
plain warm-up, error feedback and warm start, rank 1..3 (Gram-Schmidt and QR), a 1-D bias, a
matrix that would not shrink and a 4-D weight. Several ranks (``mpi``): each rank's hook result
equals PyTorch ops applied to every rank's bucket (the published algorithm, written with torch),
so the averaging across ranks is checked too; fp16 exactly at two ranks.
"""

import numpy as np
import pytest

from npddp.comm import create
from npddp.parallel.hooks import GradBucket, allreduce_hook, fp16_compress_hook, fp16_compress_wrapper
from npddp.parallel.powersgd import PowerSGDState, powersgd_hook

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

#: Parameter shapes of the test bucket: a 4-D weight, a matrix that shrinks, a bias, one that would not.
SHAPES = [(6, 3, 2, 2), (20, 16), (10, 7), (10,), (3, 4)]


class Param:
    """Just what GradBucket reads of a parameter."""

    def __init__(self, shape, dtype):
        self.data = np.zeros(shape, dtype=dtype)


class TorchBucket:
    """PyTorch's GradBucket interface over a flat tensor."""

    def __init__(self, index, buffer, shapes, is_last=True):
        self._index, self._buffer, self._shapes, self._last = index, buffer, shapes, is_last

    def buffer(self):
        return self._buffer

    def set_buffer(self, buffer):
        self._buffer = buffer

    def index(self):
        return self._index

    def is_last(self):
        return self._last

    def gradients(self):
        out, offset = [], 0
        for shape in self._shapes:
            n = int(np.prod(shape))
            out.append(self._buffer[offset:offset + n].view(shape))
            offset += n
        return out


@pytest.fixture(scope="module")
def torch_group():
    """A gloo process group of one rank in this process (PyTorch's hooks need one)."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def one_rank_comm():
    from tests.helpers.groups import one_rank_group
    return create("ring", one_rank_group())


def numel():
    return sum(int(np.prod(s)) for s in SHAPES)


def pq_sizes(rank):
    """Elements of all Ps and of all Qs of the bucket (compressed matrices only, as both hooks decide)."""
    ps = qs = 0
    for s in SHAPES:
        n, m = s[0], int(np.prod(s[1:])) if len(s) > 1 else 1
        r = min(n, m, rank)
        if (n + m) * r * 2 < n * m:
            ps, qs = ps + n * r, qs + m * r
    return ps, qs


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # 3e4 x N(0, 1) overflows float16: inf, as in torch
def test_fp16_hook_equals_pytorchs_on_one_rank(torch_group):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    comm = one_rank_comm()
    rng = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        for scale in (1e-3, 1.0, 3e4):
            g = (rng.standard_normal(numel()) * scale).astype(dtype)
            ours = fp16_compress_hook(comm, GradBucket(0, g.copy(), [Param(s, dtype) for s in SHAPES], True)).wait()
            theirs = default_hooks.fp16_compress_hook(None, TorchBucket(0, torch.from_numpy(g.copy()), SHAPES)).wait()
            assert ours.dtype == dtype and np.array_equal(ours, theirs.numpy()), (dtype, scale)
    wrapped = fp16_compress_wrapper(allreduce_hook)(comm, GradBucket(0, g.copy(), [Param(s, g.dtype) for s in SHAPES], True))
    assert np.array_equal(wrapped.wait(), g.astype(np.float16).astype(g.dtype))


@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_powersgd_equals_pytorchs_hook_with_the_same_initial_q(torch_group, rank, dtype):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as P
    comm = one_rank_comm()
    params = [Param(s, dtype) for s in SHAPES]
    ours = PowerSGDState(comm, rank=rank, start_iter=2)
    theirs = P.PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2)
    rng = np.random.default_rng(rank)
    p_size, q_size = pq_sizes(rank)
    q0 = rng.standard_normal(q_size).astype(dtype)
    tol = 1e-6 if dtype == "float64" else 2e-4
    for step in range(6):
        if step == 2:   # the first compressed step: both start from the same Q (then warm start)
            ours.p_memory[0], ours.q_memory[0] = np.empty(p_size, dtype), q0.copy()
            theirs.p_memory_dict[0], theirs.q_memory_dict[0] = torch.empty(p_size, dtype=getattr(torch, dtype)), \
                torch.from_numpy(q0.copy())
        g = rng.standard_normal(numel()).astype(dtype)
        got = powersgd_hook(ours, GradBucket(0, g.copy(), params, True)).wait().copy()
        want = P.powerSGD_hook(theirs, TorchBucket(0, torch.from_numpy(g.copy()), SHAPES)).wait().numpy()
        rel = np.max(np.abs(got - want)) / np.max(np.abs(want))
        assert rel < tol, (step, rel)
        if step >= 2:
            assert not np.allclose(got, g), "a compressed step must change the gradient"
            err = theirs.error_dict[0].numpy()
            assert np.max(np.abs(ours.errors[0] - err)) / np.max(np.abs(err)) < tol
            assert np.max(np.abs(ours.q_memory[0] - theirs.q_memory_dict[0].numpy())) < tol * 10
    assert ours.iter == theirs.iter == 6


def torch_powersgd_step(grads, qs, rank, errors):
    """One compressed PowerSGD step over every rank's bucket with torch ops: the published algorithm.

    ``grads``: per rank, the list of gradient tensors; ``qs``: per compressed matrix, its Q
    (shared); ``errors``: per rank, its flat error (or None). Returns per rank the flat result,
    the new errors and the new Qs.
    """
    size = len(grads)
    flats = [torch.cat([g.reshape(-1) for g in gs]) + (0 if e is None else e) for gs, e in zip(grads, errors)]
    mats = [[] for _ in range(size)]
    for r in range(size):
        offset = 0
        for s in SHAPES:
            n = int(np.prod(s))
            mats[r].append(flats[r][offset:offset + n].reshape(s[0], -1))
            offset += n
    out = [[None] * len(SHAPES) for _ in range(size)]
    new_qs, k = [], 0
    for i, s in enumerate(SHAPES):
        n, m = mats[0][i].shape
        r_i = min(n, m, rank)
        if not (n + m) * r_i * 2 < n * m:
            mean = sum(mats[r][i] for r in range(size)) / size
            for r in range(size):
                out[r][i] = mean
            continue
        q, _ = torch.linalg.qr(qs[k]) if r_i > 2 else (_gram_schmidt(qs[k].clone()), None)
        p = sum(mats[r][i] @ q for r in range(size))
        p = torch.linalg.qr(p)[0] if r_i > 2 else _gram_schmidt(p)
        q_new = sum(mats[r][i].T @ p for r in range(size)) / size
        for r in range(size):
            out[r][i] = p @ q_new.T
        new_qs.append(q_new)
        k += 1
    results = [torch.cat([o.reshape(-1) for o in out[r]]) for r in range(size)]
    return results, [flats[r] - results[r] for r in range(size)], new_qs


def _gram_schmidt(m):
    for i in range(m.shape[1]):
        m[:, i] /= torch.linalg.norm(m[:, i])
        for j in range(i + 1, m.shape[1]):
            m[:, j] -= (m[:, i] @ m[:, j]) * m[:, i]
    return m


@pytest.mark.mpi
@pytest.mark.parametrize("rank", [1, 3])
def test_powersgd_over_ranks_equals_the_algorithm_in_torch(world, assert_all_ranks, rank):
    comm = create("ring", world.raw)
    dtype = "float64"
    params = [Param(s, dtype) for s in SHAPES]
    state = PowerSGDState(comm, rank=rank, start_iter=2)
    rng = np.random.default_rng(7)                              # the same stream on every rank
    p_size, q_size = pq_sizes(rank)
    q0 = rng.standard_normal(q_size)
    all_grads = [rng.standard_normal((comm.size, numel())) for _ in range(5)]   # step -> (size, n)
    qs, errors, worst = None, [None] * comm.size, 0.0
    for step, grads in enumerate(all_grads):
        if step == 2:
            state.p_memory[0], state.q_memory[0] = np.empty(p_size), q0.copy()
            qs, offset = [], 0
            for s in SHAPES:
                n, m = s[0], int(np.prod(s[1:])) if len(s) > 1 else 1
                r_i = min(n, m, rank)
                if (n + m) * r_i * 2 < n * m:
                    qs.append(torch.from_numpy(q0[offset:offset + m * r_i].reshape(m, r_i).copy()))
                    offset += m * r_i
        got = powersgd_hook(state, GradBucket(0, grads[comm.rank].copy(), params, True)).wait()
        if step < 2:
            want = grads.mean(axis=0)
        else:
            per_rank = [[torch.from_numpy(grads[r].copy())] for r in range(comm.size)]
            results, errors, qs = torch_powersgd_step(per_rank, qs, rank, errors)
            want = results[comm.rank].numpy()
        worst = max(worst, float(np.max(np.abs(got - want)) / np.max(np.abs(want))))
    assert_all_ranks(worst < 1e-6, f"relative difference {worst:.2e}")


@pytest.mark.mpi
def test_fp16_over_ranks_equals_torch_half_arithmetic(world, assert_all_ranks):
    comm = create("ring", world.raw)
    rng = np.random.default_rng(3)
    grads = rng.standard_normal((comm.size, 1000)).astype(np.float32) * 10
    got = fp16_compress_hook(comm, GradBucket(0, grads[comm.rank].copy(), [Param((1000,), np.float32)], True)).wait()
    halves = [torch.from_numpy(g.copy()).to(torch.float16).div_(comm.size) for g in grads]
    total = halves[0].clone()
    for h in halves[1:]:
        total += h
    want = total.to(torch.float32).numpy()
    if comm.size == 2:   # two terms: no order to differ in, so the same bits
        ok, why = np.array_equal(got, want), "fp16 result differs from torch's"
    else:                # the ring adds in another order: within the rounding of the partial sums
        bound = (comm.size - 1) * 2.0 ** -10 * sum(np.abs(h.numpy().astype(np.float32)) for h in halves)
        err = np.abs(got - want)
        ok, why = bool(np.all(err <= bound)), f"max error {err.max():.3g} beyond the rounding bound"
    assert_all_ranks(ok, why)
