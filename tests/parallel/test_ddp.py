"""DistributedDataParallel: equivalence with one large-batch process, sync strategies, no_sync,
comm hooks (compression), local SGD through the averager, model checks, statistics.

Run under ``mpirun -n K python -m pytest --with-mpi``; every test also runs on one rank.
"""

import contextlib

import numpy as np
import pytest
from mpi4py import MPI

from npddp.comm import create
from npddp.parallel import hook_registry, hooks
from npddp.parallel.averaging import PeriodicModelAverager
from npddp.parallel.ddp import SYNCS, DistributedDataParallel
from npddp.nn import CrossEntropyLoss, Linear, Sequential, mlp
from npddp.optim import SGD, AdamW

from tests.helpers.fakes import IallreduceSpy, Idle, stale_then_backward

from tests.helpers.ranks import check_ranks_agree

BACKENDS = ("mpi", "ring", "shm")  # shm: gradient buckets in shared memory (comm.empty)
GLOBAL_BATCH = 24  # divisible by 1, 2, 3 and 4 ranks
IN, HIDDEN, OUT = 6, (7, 5), 3
STEPS = 20


def make_data(seed=0, batch=GLOBAL_BATCH, steps=STEPS):
    """The same global batches on every rank: (steps, B, IN) inputs and (steps, B) labels."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((steps, batch, IN)), rng.integers(0, OUT, size=(steps, batch))


def make_model(seed=1, hidden=HIDDEN):
    return mlp(IN, hidden, OUT, dtype=np.float64, seed=seed)


def make_optimizer(name, params):
    if name == "sgd":
        return SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-3)
    return AdamW(params, lr=0.01, weight_decay=1e-2)


def flat_params(params):
    return np.concatenate([p.data.ravel() for p in params])


def assert_same_on_all_ranks(comm, array):
    """All ranks hold the same bits, checked over the test harness's own group, not the backend under test."""
    check_ranks_agree(array)


def local_slice(comm, batch=GLOBAL_BATCH):
    per_rank = batch // comm.size
    return slice(comm.rank * per_rank, (comm.rank + 1) * per_rank)


def train_reference(opt_name, steps=STEPS):
    """One process, full batch: the parameters DDP must reproduce."""
    X, y = make_data()
    model, loss = make_model(), CrossEntropyLoss()
    opt = make_optimizer(opt_name, model.parameters())
    for t in range(steps):
        model.zero_grad()
        loss.forward(model.forward(X[t]), y[t])
        model.backward(loss.backward())
        opt.step()
    return flat_params(model.parameters())


def train_ddp(comm, opt_name, sync, steps=STEPS, check_every_step=True, hook=None, local_sgd=0, **ddp_kwargs):
    """``hook``: (name, options) of a built-in comm hook; ``local_sgd``: the averager's period (0: none)."""
    X, y = make_data()
    model, loss = make_model(), CrossEntropyLoss()
    ddp = DistributedDataParallel(model, comm, sync=sync, bucket_cap_mb=ddp_kwargs.pop("bucket_cap_mb", 2e-4),
                                  **ddp_kwargs)
    if hook is not None:
        ddp.register_comm_hook(*hook_registry.build(hook[0], comm, **hook[1]))
    averager = PeriodicModelAverager(comm, local_sgd) if local_sgd else None
    opt = make_optimizer(opt_name, ddp.parameters())
    part = local_slice(comm)
    for t in range(steps):
        ddp.zero_grad()
        loss.forward(ddp(X[t, part]), y[t, part])
        with ddp.no_sync() if averager is not None else contextlib.nullcontext():
            ddp.backward(loss.backward())
        ddp.step(opt)
        if averager is not None:
            averager.average_parameters(ddp.parameters())
            ddp.averager = averager
        if check_every_step:
            assert_same_on_all_ranks(comm, flat_params(ddp.parameters()))
    return ddp, flat_params(ddp.parameters())


@pytest.mark.mpi
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_matches_single_process_large_batch(backend, opt_name):
    comm = create(backend, MPI.COMM_WORLD)
    expected = train_reference(opt_name)
    results = {}
    for sync in SYNCS:
        _, results[sync] = train_ddp(comm, opt_name, sync)
    for sync, got in results.items():
        err = np.max(np.abs(got - expected))
        assert err <= 1e-10, f"{backend}/{sync}/{opt_name}: max abs diff {err:.3e} from one process"
        diff = np.max(np.abs(got - results["per_param"]))
        assert diff <= 1e-12, f"{backend}/{sync} differs from per_param by {diff:.3e}"


@pytest.mark.mpi
@pytest.mark.parametrize("backend", BACKENDS)
def test_no_sync_two_micro_batches_equal_one_step_on_union(backend):
    comm = create(backend, MPI.COMM_WORLD)
    X, y = make_data(steps=1)
    part = local_slice(comm)
    half = (part.stop - part.start) // 2
    loss = CrossEntropyLoss()
    # one step on the union: each rank's whole local slice
    union = DistributedDataParallel(make_model(), comm, sync="overlap", bucket_cap_mb=2e-4)
    loss.forward(union(X[0, part]), y[0, part])
    union.backward(loss.backward())
    # two micro-batches, the first without sync; halving dL/dout makes the sum a mean
    accum = DistributedDataParallel(make_model(), comm, sync="overlap", bucket_cap_mb=2e-4)
    first, second = slice(part.start, part.start + half), slice(part.start + half, part.stop)
    with accum.no_sync():
        loss.forward(accum(X[0, first]), y[0, first])
        accum.backward(loss.backward() / 2)
    assert accum.stats.comm_calls == 0
    loss.forward(accum(X[0, second]), y[0, second])
    accum.backward(loss.backward() / 2)
    got = np.concatenate([p.grad.ravel() for p in accum.parameters()])
    want = np.concatenate([p.grad.ravel() for p in union.parameters()])
    assert np.max(np.abs(got - want)) <= 1e-12
    assert_same_on_all_ranks(comm, got)


@pytest.mark.mpi
def test_grads_are_views_into_buckets_and_statistics():
    comm = create("mpi", MPI.COMM_WORLD)
    for sync in SYNCS:
        model = make_model()
        for i, p in enumerate(model.parameters()):       # gradients already accumulated before wrapping
            p.grad[...] = np.arange(p.grad.size).reshape(p.grad.shape) + i
        originals = [p.grad for p in model.parameters()]
        ddp = DistributedDataParallel(model, comm, sync=sync, bucket_cap_mb=2e-4)
        params = ddp.parameters()
        for p, original in zip(params, originals):
            assert any(np.shares_memory(p.grad, b.buffer) for b in ddp.buckets)
            # rebound once to a bucket view that carries the values over; the old array is no longer used
            assert p.grad is not original and not np.shares_memory(p.grad, original)
            assert np.array_equal(p.grad, original)
        ddp.zero_grad()
        # buckets hold parameters in reverse order, each once
        order = [id(p) for b in ddp.buckets for p in b.params]
        assert order == [id(p) for p in reversed(params)]
        X, y = make_data(steps=1)
        loss = CrossEntropyLoss()
        loss.forward(ddp(X[0, local_slice(comm)]), y[0, local_slice(comm)])
        ddp.backward(loss.backward())
        expected_calls = {"per_param": len(params), "flat": 1}.get(sync, len(ddp.buckets))
        if comm.size == 1:
            expected_calls = 0
        assert ddp.stats.comm_calls == expected_calls, sync
        total_bytes = sum(p.grad.nbytes for p in params)
        assert ddp.stats.comm_bytes == (total_bytes if comm.size > 1 else 0)
        assert all(b.work is None and b.pending == len(b.params) for b in ddp.buckets)


@pytest.mark.mpi(min_size=2)
def test_overlap_starts_reducing_during_backward():
    events = []
    comm = IallreduceSpy(create("ring", MPI.COMM_WORLD), events)
    model = make_model(hidden=(16, 16, 16))
    ddp = DistributedDataParallel(model, comm, sync="overlap", bucket_cap_mb=2e-4)
    assert len(ddp.buckets) >= 3
    model.register_grad_hook(lambda layer: events.append(("layer", layer)))
    X = np.ones((4, IN))
    ddp.backward(np.ones_like(ddp(X)))
    events = [kind for kind, _ in events]
    assert events.count("iallreduce") == len(ddp.buckets)
    first_reduce, last_layer = events.index("iallreduce"), len(events) - 1 - events[::-1].index("layer")
    assert first_reduce < last_layer, events


@pytest.mark.mpi
@pytest.mark.parametrize("backend", BACKENDS)
def test_compression_and_local_sgd(backend):
    comm = create(backend, MPI.COMM_WORLD)
    _, exact = train_ddp(comm, "sgd", "bucketed", steps=5)
    # fp16 stays close to the exact run; top-k with ratio 1 sends everything and is exact
    _, half = train_ddp(comm, "sgd", "overlap", steps=5, hook=("fp16", {}))
    assert np.max(np.abs(half - exact)) < 5e-3
    _, dense_topk = train_ddp(comm, "sgd", "bucketed", steps=5, hook=("topk", {"topk_ratio": 1.0}))
    assert np.max(np.abs(dense_topk - exact)) <= 1e-12
    _, sparse = train_ddp(comm, "sgd", "bucketed", steps=5, hook=("topk", {"topk_ratio": 0.1}))
    assert_same_on_all_ranks(comm, sparse)
    start = flat_params(make_model().parameters())
    moved, wanted = sparse - start, exact - start
    cosine = moved @ wanted / (np.linalg.norm(moved) * np.linalg.norm(wanted))
    # 10% of each bucket per step: the update differs from the exact one but points the same way
    # (one rank sends nothing, so nothing is compressed)
    assert (np.max(np.abs(sparse - exact)) > 1e-6) == (comm.size > 1) and cosine > 0.5, cosine
    # local SGD every K steps: identical after a multiple of K
    ddp, local = train_ddp(comm, "adamw", "flat", steps=6, check_every_step=False, local_sgd=3)
    assert_same_on_all_ranks(comm, local)
    assert ddp.stats.comm_calls == 0 and ddp.averager.calls == len(ddp.parameters()) * (comm.size > 1)


@pytest.mark.mpi
def test_topk_error_feedback_keeps_what_it_did_not_send():
    """Over steps, what was applied plus the residual equals the sum of the true averaged gradients."""
    comm = create("mpi", MPI.COMM_WORLD)
    model = make_model()
    ddp = DistributedDataParallel(model, comm, sync="flat")
    state = hooks.TopKState(comm, 0.2)
    ddp.register_comm_hook(state, hooks.topk_hook)
    rng = np.random.default_rng(comm.rank)
    applied = np.zeros(ddp.buckets[0].buffer.size)
    true_sum = np.zeros_like(applied)
    for _ in range(4):
        g = rng.standard_normal(applied.size)
        ddp.buckets[0].buffer[...] = g          # the whole bucket, as a backward after zero_grad writes it
        true_sum += comm.allreduce(g.copy())
        ddp._start(ddp.buckets[0])
        ddp._finish(ddp.buckets[0])
        applied += ddp.buckets[0].buffer
    residual = comm.allreduce(state.errors[0].copy())
    assert np.allclose(applied * comm.size + residual, true_sum, atol=1e-12)


@pytest.mark.mpi
def test_local_sgd_every_step_equals_gradient_averaging_for_plain_sgd():
    comm = create("mpi", MPI.COMM_WORLD)
    X, y = make_data(steps=4)
    part = local_slice(comm)
    finals = []
    for local_sgd in (0, 1):
        model, loss = make_model(), CrossEntropyLoss()
        ddp = DistributedDataParallel(model, comm, sync="flat")
        averager = PeriodicModelAverager(comm, period=1) if local_sgd else None
        opt = SGD(ddp.parameters(), lr=0.1)
        for t in range(4):
            ddp.zero_grad()
            loss.forward(ddp(X[t, part]), y[t, part])
            with ddp.no_sync() if averager is not None else contextlib.nullcontext():
                ddp.backward(loss.backward())
            ddp.step(opt)
            if averager is not None:
                averager.average_parameters(ddp.parameters())
        finals.append(flat_params(ddp.parameters()))
    assert np.max(np.abs(finals[0] - finals[1])) <= 1e-12


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("backend", BACKENDS)
def test_mismatched_model_is_a_clear_error_on_every_rank(backend):
    comm = create(backend, MPI.COMM_WORLD)
    bad_rank = comm.size - 1
    model = make_model(hidden=(7, 4) if comm.rank == bad_rank else HIDDEN)
    with pytest.raises(ValueError) as info:
        DistributedDataParallel(model, comm)
    message = str(info.value)
    assert f"rank {bad_rank}" in message and "parameter #2" in message and "(4, 7)" in message, message
    # the communicator is still usable afterwards on every rank
    assert comm.allreduce(np.ones(3))[0] == comm.size


@pytest.mark.mpi
def test_reduce_metrics_sums_over_ranks():
    comm = create("ring", MPI.COMM_WORLD)
    ddp = DistributedDataParallel(make_model(), comm)
    totals = ddp.reduce_metrics([comm.rank + 1.0, 2.0])
    assert totals.tolist() == [comm.size * (comm.size + 1) / 2, 2.0 * comm.size]


def test_bad_arguments_name_the_value_and_valid_range():
    comm = create("mpi", MPI.COMM_SELF)
    cases = [
        (dict(sync="ring"), "per_param, flat, bucketed, overlap"),
        (dict(bucket_cap_mb=0), "bucket_cap_mb"),
    ]
    for kwargs, text in cases:
        with pytest.raises(ValueError) as info:
            DistributedDataParallel(make_model(), comm, **kwargs)
        assert text in str(info.value), (kwargs, str(info.value))
    for make, text in [(lambda: hook_registry.build("int8", comm), "allreduce, fp16, topk, powersgd"),
                       (lambda: hooks.TopKState(comm, 0.0), "(0, 1]"),
                       (lambda: PeriodicModelAverager(comm, period=0), "period must be an int >= 1"),
                       (lambda: PeriodicModelAverager(comm, 2, warmup_steps=-1), "warmup_steps")]:
        with pytest.raises(ValueError, match=text.replace("(", r"\(").replace("]", r"\]")):
            make()
    with pytest.raises(TypeError, match="hook must be a function"):
        DistributedDataParallel(make_model(), comm).register_comm_hook(comm, "fp16")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("via", ["model", "wrapper"])
@pytest.mark.parametrize("sync", SYNCS)
def test_a_parameter_no_layer_wrote_since_zero_grad_is_sent_as_zeros(sync, via):
    """Rank 0 alone writes Idle's gradient: every rank ends with its 1 averaged with the others' zeros."""
    comm = create("mpi", MPI.COMM_WORLD)
    model = Sequential(Linear(IN, OUT, dtype=np.float64, rng=np.random.default_rng(0)), Idle(comm.rank == 0))
    ddp = DistributedDataParallel(model, comm, sync=sync, bucket_cap_mb=2e-4)
    stale_then_backward(ddp, model, np.full((2, IN), comm.rank + 1.0), via)
    np.testing.assert_allclose(model.layers[1].scale.grad, np.full(3, 1.0 / comm.size), rtol=1e-15)
    np.testing.assert_allclose(model.layers[0].bias.grad, np.full(OUT, 2.0))    # ones over 2 rows, averaged
