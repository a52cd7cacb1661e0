"""Tensor parallelism (alone, and with data parallelism) ends at one process's parameters.

Run under ``mpirun -n K`` or ``python -m npddp.run --nproc K`` (K = 2, 3, 4): the world is laid
out as a (dp, pp, tp) mesh; every rank also trains the full model in one process on the whole
global batch and compares its shards with the matching slices. The serial tests check the
errors raised before anything is sent. ``train_split`` is shared with ``test_pipeline.py``.
"""

import numpy as np
import pytest

from npddp.nn import CrossEntropyLoss, Dropout, Linear, ReLU, Sequential, gpt
from npddp.optim import SGD, AdamW
from npddp.parallel.model import Mesh, Pipeline, PipelineStage, mesh_groups, shard_indices, tensor_parallel
from npddp.parallel.model.tensor import ColumnParallelLinear, RowParallelLinear

from tests.conftest import RUN_BACKENDS, world_raw

GLOBAL_BATCH, STEPS, FEATURES, CLASSES, VOCAB, CONTEXT = 12, 12, 5, 4, 11, 6
TOLERANCE = 1e-9


def make_model(kind: str):
    """A float64 model with dropout (MLP) or a tiny GPT, the same on every rank."""
    if kind == "gpt":
        return gpt(VOCAB, CONTEXT, d_model=8, num_layers=2, num_heads=2, d_ff=12, dtype=np.float64, seed=3)
    rng = np.random.default_rng(3)
    return Sequential(Linear(FEATURES, 12, dtype=np.float64, rng=rng, input_grad=False), ReLU(),
                      Dropout(0.25, seed=7),
                      Linear(12, 6, dtype=np.float64, rng=rng), ReLU(), Dropout(0.2, seed=8),
                      Linear(6, CLASSES, dtype=np.float64, rng=rng))


def make_data(kind: str):
    rng = np.random.default_rng(0)
    if kind == "gpt":
        tokens = rng.integers(0, VOCAB, size=(STEPS, GLOBAL_BATCH, CONTEXT + 1))
        return tokens[..., :-1], tokens[..., 1:]
    return rng.standard_normal((STEPS, GLOBAL_BATCH, FEATURES)), rng.integers(0, CLASSES, (STEPS, GLOBAL_BATCH))


def make_optimizer(name: str, params):
    if name == "adamw":
        return AdamW(params, lr=0.01, weight_decay=0.1)
    return SGD(params, lr=0.05, momentum=0.9, weight_decay=0.01)


def train_one_process(kind: str, opt_name: str) -> dict:
    """The full model trained in one process on the whole global batch: name -> values."""
    model, loss = make_model(kind), CrossEntropyLoss()
    opt = make_optimizer(opt_name, model.parameters())
    X, Y = make_data(kind)
    for t in range(STEPS):
        model.zero_grad()
        loss.forward(model.forward(X[t]), Y[t])
        model.backward(loss.backward())
        opt.step()
    return model.state_dict()


def train_split(world, kind: str, tp: int, pp: int, micro_batches: int, schedule: str, opt_name: str, backend: str):
    """Train on the world as a (dp, pp, tp) mesh; (this rank's parameters by full name, their shard indices)."""
    mesh = Mesh(world.size, tp=tp, pp=pp)
    groups = mesh_groups(mesh, world_raw(), backend)
    here = mesh.coords(groups.rank)
    model = make_model(kind)
    if tp > 1:
        model = tensor_parallel(model, groups.tensor)
    shards = shard_indices(model)
    stage = PipelineStage(model, pp, here.pp)
    engine = Pipeline(stage, groups.pipeline, CrossEntropyLoss(), micro_batches, schedule,
                      data=groups.data if mesh.dp > 1 else None)
    opt = make_optimizer(opt_name, engine.parameters())
    X, Y = make_data(kind)
    mine = np.array_split(np.arange(GLOBAL_BATCH), mesh.dp)[here.dp]
    for t in range(STEPS):
        engine.zero_grad()
        engine.train_step(X[t, mine], Y[t, mine], first_row=int(mine[0]), global_rows=GLOBAL_BATCH)
        engine.step(opt)
    names = stage.original_names()
    return {names[n]: p.data for n, p in stage.named_parameters()}, shards


def compare(kind: str, opt_name: str, got: dict, shards: dict) -> list[str]:
    """Problems: each local parameter against its slice of the one-process result."""
    want, problems = train_one_process(kind, opt_name), []
    for name, value in got.items():
        ref = want[name]
        if name in shards:
            axis, idx = shards[name]
            ref = np.take(ref, idx, axis=axis)
        if ref.shape != value.shape:
            problems.append(f"{name}: shape {value.shape}, want {ref.shape}")
            continue
        err = float(np.abs(value - ref).max() / max(np.abs(ref).max(), 1e-300))
        if not err <= TOLERANCE:
            problems.append(f"{name}: relative difference {err:.3g}")
    return problems


@pytest.fixture(params=[b for b in ("mpi", "ring") if b in RUN_BACKENDS])
def backend(request):
    return request.param


def fits(world, tp: int, pp: int) -> bool:
    return world.size % (tp * pp) == 0 and world.size > 1


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind,opt_name", [("mlp", "sgd"), ("gpt", "adamw")])
def test_tensor_parallel_equals_one_process(world, backend, kind, opt_name, assert_all_ranks):
    """TP 2 over the world's pairs (TP 2 x DP 2 at four ranks, TP 2 alone at two)."""
    if not fits(world, 2, 1) or world.size > 4:
        pytest.skip(f"TP 2 needs an even world of 2 or 4 ranks, not {world.size}")
    got, shards = train_split(world, kind, 2, 1, 2, "1f1b", opt_name, backend)
    problems = compare(kind, opt_name, got, shards)
    assert_all_ranks(not problems, f"{kind} TP 2 N={world.size}: " + "; ".join(problems[:4]))


@pytest.mark.mpi(min_size=2)
def test_tensor_parallel_layers_split_as_planned(world, backend, assert_all_ranks):
    """The MLP pairs column/row and keeps its odd last Linear whole; the GPT's names are the full model's."""
    if world.size % 2:
        pytest.skip("needs an even world")
    raw = world_raw()
    groups = mesh_groups(Mesh(world.size, tp=2), raw, backend)
    mlp = tensor_parallel(make_model("mlp"), groups.tensor)
    kinds = [type(m).__name__ for m in mlp.layers]
    g = make_model("gpt")
    names = [n for n, _ in g.named_parameters()]
    tp_gpt = tensor_parallel(g, groups.tensor)
    ok = (isinstance(mlp.layers[0], ColumnParallelLinear) and isinstance(mlp.layers[3], RowParallelLinear)
          and kinds[2] == "SplitDropout" and type(mlp.layers[6]) is Linear
          and [n for n, _ in tp_gpt.named_parameters()] == names)
    assert_all_ranks(ok, f"layers {kinds}")


class _Group:
    """A stand-in tensor group: the checks run before any message, so none is ever sent."""

    def __init__(self, size: int):
        self.rank, self.size, self.name = 0, size, "stand-in"

    def allreduce(self, buf, op="sum", out=None):
        raise AssertionError("a message was sent")


def test_heads_not_divisible_is_one_value_error_before_sending():
    model = gpt(VOCAB, CONTEXT, d_model=9, num_layers=1, num_heads=3, d_ff=12, dtype=np.float64)
    with pytest.raises(ValueError, match=r"num_heads 3 is not divisible by the tensor-parallel size 2"):
        tensor_parallel(model, _Group(2))
    assert model.blocks.layers[0].attn.__class__.__name__ == "CausalSelfAttention"   # nothing converted


def test_hidden_not_divisible_is_one_value_error():
    with pytest.raises(ValueError, match=r"^layer '0' \(Linear 5 -> 12\): out_features 12 is not divisible by the "
                                         r"tensor-parallel size 5"):
        tensor_parallel(make_model("mlp"), _Group(5))
    model = gpt(VOCAB, CONTEXT, d_model=8, num_layers=1, num_heads=4, d_ff=10, dtype=np.float64)
    with pytest.raises(ValueError, match=r"d_ff 10 is not divisible by the tensor-parallel size 4"):
        tensor_parallel(model, _Group(4))


def test_a_layer_that_cannot_split_is_named():
    from npddp.nn import Flatten
    with pytest.raises(ValueError, match=r"layer 0 is Flatten"):
        tensor_parallel(Sequential(Flatten(), Linear(4, 4), ReLU(), Linear(4, 2)), _Group(2))
