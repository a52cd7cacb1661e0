"""ZeRO stages 1, 2 and 3 end with DDP's parameters (MLP, tied-weight GPT, float64 and float32), ranks bit-identical.

Run under ``mpirun -n K`` (K = 2, 3, 4) or ``python -m npddp.run --nproc K``: every rank trains
on its slice of the same global batches; the serial run covers one rank. The epoch tests train
as ``python -m npddp.train`` does: a padding sampler, a partial last batch, every ``--optimizer``.
"""

from functools import partial

import numpy as np
import pytest

from npddp.comm import create
from npddp.data import BatchLoader, DistributedSampler
from npddp.nn import CrossEntropyLoss, Linear, Sequential, gpt
from npddp.optim import OPTIMIZERS, SGD, make_optimizer
from npddp.parallel.ddp import DistributedDataParallel
from npddp.parallel.zero import ShardedInit, ShardedOptimizer, ZeroDataParallel

from tests.helpers.fakes import Idle
from tests.helpers.ranks import RUN_BACKENDS, world_raw
from tests.helpers.zero import (TOLERANCE, BUCKET_MB, engine_and_optimizer, CLASSES, CONTEXT, FEATURES, GLOBAL_BATCH, STEPS, VOCAB, make_data, make_model,
                                train, values)

ROWS, PER_RANK, EPOCHS = 25, 4, 2   # 25 rows: padded at N = 2, 3, 4, and every epoch ends on a partial batch
CLI_SETTINGS = {"lr": 0.02, "momentum": 0.9, "weight_decay": 0.1}   # what the CLI passes make_optimizer


@pytest.fixture(params=[b for b in ("mpi", "ring") if b in RUN_BACKENDS])
def world_comm(request):
    return create(request.param, world_raw())


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["mlp", "gpt"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_every_stage_equals_ddp(world_comm, kind, dtype, assert_all_ranks, assert_ranks_agree):
    comm, problems, results = world_comm, [], []
    opt_name = "adamw" if kind == "gpt" else "sgd"
    m0, e0, _ = train(comm, kind, dtype, 0, opt_name)
    want = values(m0, e0)
    for stage in (1, 2, 3):
        model, engine, _ = train(comm, kind, dtype, stage, opt_name)
        got = values(model, engine)
        results.append(got)
        err = float(np.linalg.norm(got - want) / np.linalg.norm(want))   # relative, in the 2-norm
        if not err <= TOLERANCE[dtype]:
            problems.append(f"stage {stage}: relative difference {err:.3g} from DDP")
    for got in results:
        assert_ranks_agree(got)
    assert_all_ranks(not problems, f"{kind} {dtype} {comm.name} N={comm.size}: " + "; ".join(problems))


@pytest.mark.mpi
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_consolidated_state_is_the_plain_optimizers(world_comm, stage, assert_all_ranks):
    """consolidate_state_dict(to) then state_dict() on ``to`` give DDP's optimizer state; elsewhere a clear error."""
    comm, problems = world_comm, []
    _, _, plain = train(comm, "gpt", "float64", 0, "adamw", steps=2)
    model, engine, opt = train(comm, "gpt", "float64", stage, "adamw", steps=2)
    try:
        opt.state_dict()
        problems.append("state_dict before consolidation did not raise")
    except RuntimeError as exc:
        if "consolidate_state_dict" not in str(exc):
            problems.append(f"unclear error: {exc}")
    to = comm.size - 1
    opt.consolidate_state_dict(to=to)
    if comm.rank == to:
        got, want = opt.state_dict(), plain.state_dict()
        if set(got) != set(want):
            problems.append(f"keys differ: {sorted(set(got) ^ set(want))[:4]}")
        for k in set(got) & set(want):
            a, b = np.asarray(got[k], dtype=np.float64), np.asarray(want[k], dtype=np.float64)
            if a.shape != b.shape or not np.allclose(a, b, rtol=1e-10, atol=1e-14):
                problems.append(f"{k} differs")
    elif comm.size > 1:
        try:
            opt.state_dict()
            problems.append("state_dict on a rank other than `to` did not raise")
        except RuntimeError:
            pass
    assert_all_ranks(not problems, "; ".join(problems[:4]))


@pytest.mark.mpi
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_load_state_dict_round_trip(world_comm, stage, assert_all_ranks):
    """A consolidated state broadcast to every rank and loaded reproduces the same next step."""
    comm = world_comm
    model, engine, opt = train(comm, "mlp", "float64", stage, "adamw", steps=2)
    opt.consolidate_state_dict(to=0)
    template = opt.state_dict() if comm.rank == 0 else DistributedStateTemplate(model, opt)
    state = {}
    for k in sorted(template):
        v = template[k]
        if isinstance(v, np.ndarray) and v.ndim:
            buf = np.ascontiguousarray(v, dtype=np.float64).copy()
            comm.broadcast(buf, root=0)
            state[k] = buf
        else:
            box = np.array([float(v)], dtype=np.float64)
            comm.broadcast(box, root=0)
            state[k] = np.int64(box[0]) if k == "step" else float(box[0])
    before = {k: [a.copy() for a in v] for k, v in opt.optim.state.items()}
    for arrays in opt.optim.state.values():
        for a in arrays:
            a[...] = -1.0                                           # the load must restore every element
    opt.load_state_dict(state)
    same = all(np.array_equal(a, b) for k in before for a, b in zip(before[k], opt.optim.state[k]))
    assert_all_ranks(same and opt.step_count == 2, f"stage {stage}: reloaded state differs")


def DistributedStateTemplate(model, opt):
    """The keys and shapes of a whole-model AdamW state dict (values unused: rank 0's are broadcast)."""
    d = {"step": 0, "lr": 0.0, "beta1": 0.0, "beta2": 0.0, "eps": 0.0, "weight_decay": 0.0}
    for b in ("exp_avg", "exp_avg_sq"):
        for i, p in enumerate(model.parameters()):
            d[f"{b}.{i}"] = np.zeros(p.data.shape)
    return d


@pytest.mark.mpi
@pytest.mark.parametrize("stage", [0, 2, 3])
def test_cnn_and_no_sync_accumulation_equal_ddp(world_comm, stage, assert_all_ranks, assert_ranks_agree):
    """A CNN; two half-batches, the first under no_sync, give the step of the whole batch (float64)."""
    comm, loss = world_comm, CrossEntropyLoss()
    X, Y = make_data("cnn", "float64")
    parts = np.array_split(np.arange(GLOBAL_BATCH), comm.size)[comm.rank]
    halves = np.array_split(parts, 2)

    def run(accumulate: bool, st: int):
        model = make_model("cnn", "float64")
        if st >= 2:
            engine = ZeroDataParallel(model, comm, stage=st, bucket_cap_mb=BUCKET_MB)
            opt = ShardedOptimizer(engine, SGD, lr=0.1, momentum=0.9)
        else:
            engine = DistributedDataParallel(model, comm, bucket_cap_mb=BUCKET_MB)
            opt = SGD(engine.parameters(), lr=0.1, momentum=0.9)
        for t in range(STEPS):
            engine.zero_grad()
            if accumulate:   # the sum of two half-batch mean losses, each weighted by its share
                with engine.no_sync():
                    loss.forward(engine(X[t, halves[0]]), Y[t, halves[0]])
                    engine.backward(loss.backward() * (len(halves[0]) / len(parts)))
                loss.forward(engine(X[t, halves[1]]), Y[t, halves[1]])
                engine.backward(loss.backward() * (len(halves[1]) / len(parts)))
            else:
                loss.forward(engine(X[t, parts]), Y[t, parts])
                engine.backward(loss.backward())
            engine.step(opt)
        return values(model, engine)

    want = run(False, 0)
    got = run(True, stage)
    direct = run(False, stage)
    assert_ranks_agree(got)
    err = max(float(np.linalg.norm(a - want) / np.linalg.norm(want)) for a in (got, direct))
    assert_all_ranks(err < 1e-12, f"stage {stage} N={comm.size}: relative difference {err:.3g} from DDP")


@pytest.mark.mpi(min_size=2)
def test_zero2_holds_no_full_gradients_between_steps():
    """Stage 2 over N ranks: between steps every p.grad is a read-only zero array occupying no memory; the
    buffers a backward used are back in the pool (at most its few), and the header's bytes count the shards only."""
    comm = create("ring", world_raw())
    model, engine, _ = train(comm, "gpt", "float64", 2, "adamw", steps=2)
    for p in model.parameters():
        assert p.grad.strides == (0,) * p.grad.ndim and not p.grad.flags.writeable and not p.grad.any()
    assert all(g.grads is None for g in engine.buckets)
    pool = engine.buckets[0].pool
    assert len(pool._free) <= pool.keep
    assert engine.bytes_per_rank()["grads"] == sum(g.shard_size * 8 for g in engine.buckets)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("via", ["model", "wrapper"])
def test_zero2_sends_zeros_for_a_parameter_no_layer_wrote_since_zero_grad(via):
    """A gradient buffer reused from the pool (last backward's values in it) sends zeros for a parameter no layer wrote."""
    comm = create("ring", world_raw())
    shards = []
    for reused in (False, True):
        idle = Idle(writes=reused)
        model = Sequential(Linear(FEATURES, CLASSES, dtype=np.float64, rng=np.random.default_rng(0)), idle)
        engine = ZeroDataParallel(model, comm, stage=2, bucket_cap_mb=BUCKET_MB)
        x = np.full((2, FEATURES), comm.rank + 1.0)
        if reused:                                  # the pool now keeps buffers holding these gradients
            engine.backward(np.ones_like(engine(x)) * 5.0)
            idle.writes = False
            (model if via == "model" else engine).zero_grad()
        engine.backward(np.ones_like(engine(x)))
        shards.append(np.concatenate([g.shard.grad for g in engine.buckets]))
    np.testing.assert_array_equal(shards[0], shards[1])


def train_epochs(comm, stage: int, opt_name: str) -> np.ndarray:
    """EPOCHS epochs of the training CLI's loop at ``stage`` (0: DDP), float64 MLP; the final full parameters."""
    model, loss = make_model("mlp", "float64"), CrossEntropyLoss()
    engine, opt = engine_and_optimizer(model, comm, stage, partial(make_optimizer, opt_name), **CLI_SETTINGS)
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((ROWS, FEATURES)), rng.integers(0, CLASSES, size=ROWS)
    loader = BatchLoader(X, y, DistributedSampler(ROWS, comm.size, comm.rank, shuffle=True, seed=0),
                         batch_size=PER_RANK, reuse_buffers=True)
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        for xb, yb in loader.batches():
            engine.zero_grad()
            loss.forward(engine(xb), yb)
            engine.backward(loss.backward())
            engine.step(opt)
    return values(model, engine)


def test_the_epoch_data_pads_and_ends_on_a_partial_batch():
    """At N = 2, 3, 4 the sampler pads the rows and each rank's last batch of an epoch is partial."""
    for n in (2, 3, 4):
        per_rank = len(DistributedSampler(ROWS, n, 0))
        assert ROWS % n and per_rank % PER_RANK, (n, per_rank)


@pytest.mark.mpi
@pytest.mark.parametrize("opt_name", OPTIMIZERS)
def test_every_stage_equals_ddp_across_epochs(world_comm, opt_name, assert_all_ranks, assert_ranks_agree):
    """Two epochs: bit for bit over a hand-written backend, to rounding over MPI (its Reduce_scatter may add
    the ranks in another order than its Allreduce)."""
    comm, problems, results = world_comm, [], []
    want = train_epochs(comm, 0, opt_name)
    for stage in (1, 2, 3):
        got = train_epochs(comm, stage, opt_name)
        results.append(got)
        err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
        if comm.name != "mpi" and got.tobytes() != want.tobytes():
            problems.append(f"stage {stage}: not bit-identical to DDP (relative difference {err:.3g})")
        elif not err <= 1e-10:
            problems.append(f"stage {stage}: relative difference {err:.3g} from DDP")
    for got in results + [want]:
        assert_ranks_agree(got)
    assert_all_ranks(not problems, f"{opt_name} {comm.name} N={comm.size}: " + "; ".join(problems))


def _gpt_small_groups(comm, init=None):
    """The test GPT as ZeRO-3 with small groups (built inside ``init`` when given)."""
    if init is None:
        return ZeroDataParallel(make_model("gpt", "float64"), comm, stage=3, bucket_cap_mb=BUCKET_MB)
    with init:
        model = make_model("gpt", "float64")
    return ZeroDataParallel(model, comm, stage=3, bucket_cap_mb=BUCKET_MB, init=init)


@pytest.mark.mpi(min_size=2)
def test_zero3_sharded_construction_equals_the_whole_build_bit_for_bit():
    """Built inside ShardedInit, every rank's shards are those of the model built whole; trained, they stay equal."""
    comm = create("ring", world_raw())
    whole, sharded = _gpt_small_groups(comm), _gpt_small_groups(comm, ShardedInit(comm))
    for a, b in zip(whole.buckets, sharded.buckets):
        assert a.shard.data.tobytes() == b.shard.data.tobytes()
    with sharded.full_parameters():
        built = sharded.module.state_dict()
    plain = make_model("gpt", "float64").state_dict()
    assert list(built) == list(plain) and all(built[k].tobytes() == plain[k].tobytes() for k in plain)


@pytest.mark.mpi(min_size=2)
def test_zero3_sharded_construction_never_holds_the_whole_model(assert_all_ranks):
    """A rank's traced memory while the model is built stays near 1/N of it (plus one parameter being drawn), and
    while the engine regroups it near its shards of values and gradients: the whole model never exists on a rank."""
    import tracemalloc
    comm = create("ring", world_raw())
    build = partial(gpt, VOCAB, CONTEXT, d_model=64, num_layers=6, num_heads=2, d_ff=128, dtype=np.float64, seed=3)
    whole = build().num_bytes()
    init = ShardedInit(comm)
    tracemalloc.start()
    try:
        with init:
            model = build()
        _, built = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        engine = ZeroDataParallel(model, comm, stage=3, bucket_cap_mb=0.05, init=init)
        _, regrouped = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    params = engine.module.parameters()
    assert init.held_bytes() == 0 and all(p.data.strides == (0,) * p.data.ndim for p in params)
    drawn = 3 * max(p.data.nbytes for p in params) + 64 * 1024    # a parameter drawn (float64, scaled, cast)
    shards = sum(g.shard_size * 8 for g in engine.buckets)         # values; their gradients as much again
    assert_all_ranks(built < whole / comm.size + drawn and built < 0.75 * whole and regrouped < 2 * shards + drawn,
                     f"peak {built} bytes while building, {regrouped} while regrouping; whole model {whole}")


@pytest.mark.mpi(min_size=2)
def test_zero3_prefetches_the_next_group_while_the_current_one_computes():
    """When a module runs forward or backward, the next group its pass needs is already gathered or in flight."""
    comm = create("ring", world_raw())
    engine = _gpt_small_groups(comm)
    seen = []
    for i, (module, _) in enumerate(engine._owners):   # registered after the engine's: they run once it has gathered
        for step, add in ((+1, module.register_forward_pre_hook), (-1, module.register_backward_pre_hook)):
            ahead = engine._next_groups(i, step)
            add(lambda m, a, ahead=ahead: seen.append(all(g.live or g.gather_work is not None for g in ahead)))
    X, Y = make_data("gpt", "float64")
    loss = CrossEntropyLoss()
    loss.forward(engine(X[0, :2]), Y[0, :2])
    engine.backward(loss.backward())
    assert len(seen) == 2 * len(engine._owners) and all(seen)
    assert sum(bool(engine._next_groups(i, +1)) for i in range(len(engine._owners))) > 3
