"""The training CLI's ``--zero`` glue: the engine and optimizer of a ZeRO stage, and its per-rank memory line.

``--zero 1`` is DDP with a :class:`~npddp.parallel.zero.ZeroRedundancyOptimizer`; ``--zero 2``
and ``3`` a :class:`~npddp.parallel.zero.ZeroDataParallel` with a
:class:`~npddp.parallel.zero.ShardedOptimizer`. Either optimizer is wrapped in
:class:`~npddp.checkpoint.stateful.CheckpointedOptimizer`, whose ``state_dict()`` consolidates on rank 0 (every rank calls
it when a checkpoint is collected or restored), so checkpoints keep the whole-model layout of
``--zero 0`` and a run may resume with another stage or world size. The CLI writes sharded
checkpoints instead (:mod:`npddp.checkpoint.shardwrite`); restoring still takes the whole state.
"""

from __future__ import annotations

from functools import partial

from npddp.checkpoint.stateful import CheckpointedOptimizer
from npddp.optim import make_optimizer
from npddp.parallel.zero import ShardedInit, ShardedOptimizer, ZeroDataParallel, ZeroRedundancyOptimizer
from npddp.train.console.printer import format_bytes


def _defaults(cfg) -> tuple:
    """The optimizer factory and its keyword defaults from the config."""
    return partial(make_optimizer, cfg.optimizer), {"lr": cfg.lr, "momentum": cfg.momentum,
                                                     "weight_decay": cfg.weight_decay}


def shard_optimizer(cfg, engine, comm) -> CheckpointedOptimizer:
    """``--zero 1``: the optimizer of DDP's parameters, its state sharded over the ranks."""
    factory, defaults = _defaults(cfg)
    return CheckpointedOptimizer(ZeroRedundancyOptimizer(engine.parameters(), factory, comm, **defaults), comm)


def construction(cfg, comm) -> ShardedInit | None:
    """``--zero 3``: the context to build the model in, each rank keeping its part only; None otherwise."""
    return ShardedInit(comm) if cfg.zero == 3 else None


def build(cfg, model, comm, tracer, init: ShardedInit | None = None):
    """``(engine, optimizer)`` for ``cfg.zero`` in 2..3: sharded gradients (and parameters); ``init``: what
    :func:`construction` gave, the model built inside it."""
    factory, defaults = _defaults(cfg)
    engine = ZeroDataParallel(model, comm, stage=cfg.zero, bucket_cap_mb=cfg.bucket_mb, tracer=tracer, init=init)
    return engine, CheckpointedOptimizer(ShardedOptimizer(engine, factory, **defaults), comm)


def bytes_per_rank(stage: int, engine, optimizer) -> dict:
    """Bytes this rank keeps between steps for parameters, gradients and optimizer state."""
    if stage >= 2:
        held = engine.bytes_per_rank()
    else:
        full = sum(p.data.nbytes for p in engine.parameters())
        held = {"params": full, "grads": full}
    if isinstance(optimizer, CheckpointedOptimizer):
        state = optimizer.sharded.local_state_bytes()
    else:
        state = sum(a.nbytes for arrays in optimizer.state.values() for a in arrays)
    return {**held, "optimizer": state}


def memory_line(stage: int, engine, optimizer, replicas: int = 2) -> str:
    """The header line: ``zero: stage 2; per rank: params 1.2 MiB, grads ..., optimizer ...``; with one data
    replica the stage shards nothing, and the line says so."""
    held = bytes_per_rank(stage, engine, optimizer)
    what = {0: "DDP, nothing sharded", 1: "optimizer state sharded", 2: "optimizer state and gradients sharded",
            3: "optimizer state, gradients and parameters sharded"}[stage]
    if stage and replicas == 1:
        what = "one data replica: nothing to shard across"
    return (f"zero: stage {stage} ({what}); held per rank between steps: params {format_bytes(held['params'])}, "
            f"grads {format_bytes(held['grads'])}, optimizer {format_bytes(held['optimizer'])}")
