"""ZeRO against DDP on tiny models: the models, data, optimizers and training steps both ZeRO test modules use."""

import numpy as np

from npddp.nn import CrossEntropyLoss, cnn, gpt, mlp
from npddp.optim import SGD, AdamW
from npddp.parallel.ddp import DistributedDataParallel
from npddp.parallel.zero import ShardedOptimizer, ZeroDataParallel, ZeroRedundancyOptimizer

GLOBAL_BATCH, STEPS = 12, 3
VOCAB, CONTEXT, FEATURES, CLASSES = 11, 6, 5, 3
#: Relative difference allowed between ZeRO and DDP parameters, per dtype.
TOLERANCE = {"float64": 1e-12, "float32": 1e-6}
BUCKET_MB = 2e-3                                   # a few parameters per group


def make_model(kind: str, dtype):
    """A small seeded model of ``kind`` (gpt, cnn, else mlp)."""
    if kind == "gpt":
        return gpt(VOCAB, CONTEXT, d_model=8, num_layers=2, num_heads=2, d_ff=12, dtype=dtype, seed=3)
    if kind == "cnn":
        return cnn((1, 4, 4), [2], [5], CLASSES, dtype=dtype, seed=3)
    return mlp(FEATURES, [7, 6], CLASSES, dtype=dtype, seed=3)


def make_data(kind: str, dtype):
    """``STEPS`` global batches (inputs, targets) for ``kind``, the same on every rank."""
    rng = np.random.default_rng(0)
    if kind == "gpt":
        tokens = rng.integers(0, VOCAB, size=(STEPS, GLOBAL_BATCH, CONTEXT + 1))
        return tokens[..., :-1], tokens[..., 1:]
    if kind == "cnn":
        return (rng.standard_normal((STEPS, GLOBAL_BATCH, 1, 4, 4)).astype(dtype),
                rng.integers(0, CLASSES, size=(STEPS, GLOBAL_BATCH)))
    return (rng.standard_normal((STEPS, GLOBAL_BATCH, FEATURES)).astype(dtype),
            rng.integers(0, CLASSES, size=(STEPS, GLOBAL_BATCH)))


def optimizer_class(name: str):
    """The optimizer class and settings for ``name`` (adamw, else SGD with momentum)."""
    if name == "adamw":
        return AdamW, {"lr": 0.01, "weight_decay": 0.1}
    return SGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01}


def engine_and_optimizer(model, comm, stage: int, make_optimizer, **settings):
    """DDP (stage 0) or ZeRO ``stage``'s engine over ``model``, and its optimizer built by ``make_optimizer``."""
    if stage >= 2:
        engine = ZeroDataParallel(model, comm, stage=stage, bucket_cap_mb=BUCKET_MB)
        return engine, ShardedOptimizer(engine, make_optimizer, **settings)
    engine = DistributedDataParallel(model, comm, bucket_cap_mb=BUCKET_MB)
    return engine, (ZeroRedundancyOptimizer(engine.parameters(), make_optimizer, comm, **settings) if stage == 1
                    else make_optimizer(engine.parameters(), **settings))


def train(comm, kind: str, dtype, stage: int, opt_name: str, steps: int = STEPS):
    """``steps`` steps of ``stage`` (0: DDP); the parameters afterwards (full values) and the engine's pieces."""
    model, loss = make_model(kind, dtype), CrossEntropyLoss()
    cls, defaults = optimizer_class(opt_name)
    engine, opt = engine_and_optimizer(model, comm, stage, cls, **defaults)
    X, Y = make_data(kind, dtype)
    parts = np.array_split(np.arange(GLOBAL_BATCH), comm.size)[comm.rank]
    for t in range(steps):
        engine.zero_grad()
        loss.forward(engine(X[t, parts]), Y[t, parts])
        engine.backward(loss.backward())
        engine.step(opt)
    return model, engine, opt


def values(model, engine) -> np.ndarray:
    """Every parameter's full value, flattened (gathered first where the engine shards them)."""
    full = getattr(engine, "full_parameters", None)
    if full is None:
        return np.concatenate([p.data.ravel() for p in model.parameters()])
    with full():
        return np.concatenate([p.data.ravel() for p in model.parameters()])
