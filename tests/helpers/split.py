"""The models, data and one-process reference of the tensor- and pipeline-parallel tests (tests/parallel/model):
train on the world as a (dp, pp, tp) mesh, then compare each shard with its slice of one process's result."""

import numpy as np

from npddp.nn import CrossEntropyLoss, Dropout, Linear, ReLU, Sequential, gpt
from npddp.optim import SGD, AdamW
from npddp.parallel.model import Mesh, Pipeline, PipelineStage, mesh_groups, shard_indices, tensor_parallel
from tests.helpers.ranks import world_raw

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


def train_split(world, kind: str, tp: int, pp: int, micro_batches: int, schedule: str, opt_name: str, backend: str,
                sequence: bool = False):
    """Train on the world as a (dp, pp, tp) mesh (``sequence``: sequence-parallel too); (this rank's parameters by
    full name, their shard indices)."""
    mesh = Mesh(world.size, tp=tp, pp=pp)
    groups = mesh_groups(mesh, world_raw(), backend)
    here = mesh.coords(groups.rank)
    model = make_model(kind)
    if tp > 1:
        model = tensor_parallel(model, groups.tensor, sequence=sequence)
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
