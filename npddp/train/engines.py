"""The training CLI's engine from its Config: DDP, a ZeRO stage or a split model, and the optimizer it steps.

Every engine keeps one contract (:class:`npddp.parallel.engine.Engine`), so the training loop
drives whichever :func:`build` returns the same way.
"""

from __future__ import annotations

from npddp.comm.communicators.choice import parse_algorithms
from npddp.optim import make_optimizer
from npddp.parallel import hook_registry as hooks
from npddp.parallel.ddp import DistributedDataParallel
from npddp.parallel.model.engine import MeshEngine
from npddp.train import sharding
from npddp.train.config import Config
from npddp.util import tracing

_EVAL_BATCH = 1024      # a split model's validation rows per forward pass (through the pipeline)
_EVAL_ELEMENTS = 1 << 24  # split GPT: validation sequences per forward pass hold at most this many logits


def build(cfg: Config, comm, model, dropouts, num_classes: int, init=None):
    """``(engine, optimizer)`` for ``cfg``: a split model's (--tp/--pp), a ZeRO stage's, or DDP with its comm hook;
    ``init``: the ShardedInit a ``--zero 3`` model was built in."""
    tracer = tracing.Tracer(cfg.trace, comm, cfg.trace_steps) if cfg.trace else None  # None: $NPDDP_TRACE
    if cfg.tp * cfg.pp > 1:
        engine = MeshEngine(comm, model, dropouts, tp=cfg.tp, pp=cfg.pp, backend=cfg.backend, timeout=cfg.timeout,
                            micro_batches=cfg.micro_batches or cfg.pp, schedule=cfg.pp_schedule, sync=cfg.sync,
                            bucket_cap_mb=cfg.bucket_mb, comm_hook=lambda group: _comm_hook(cfg, group),
                            eval_batch=_split_eval_batch(cfg, num_classes), tracer=tracer,
                            sequence_parallel=cfg.sequence_parallel,
                            algorithms=parse_algorithms(cfg.algorithms) or None)
        return engine, _optimizer(cfg, engine, engine.data)
    if cfg.zero >= 2:
        return sharding.build(cfg, model, comm, tracer, init)
    ddp = DistributedDataParallel(model, comm, sync=cfg.sync, bucket_cap_mb=cfg.bucket_mb, tracer=tracer)
    ddp.register_comm_hook(*_comm_hook(cfg, comm))
    return ddp, _optimizer(cfg, ddp, comm)


def _comm_hook(cfg: Config, group) -> tuple:
    """``(state, hook)`` of --comm-hook over ``group``."""
    return hooks.build(cfg.comm_hook, group, topk_ratio=cfg.topk_ratio, powersgd_rank=cfg.powersgd_rank,
                       powersgd_start_iter=cfg.powersgd_start_iter, seed=cfg.seed)


def _optimizer(cfg: Config, engine, group):
    """The optimizer of ``engine``'s parameters; with ``--zero 1`` its state sharded over ``group`` (ZeRO-1)."""
    if cfg.zero == 1:
        return sharding.shard_optimizer(cfg, engine, group)
    return make_optimizer(cfg.optimizer, engine.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                          weight_decay=cfg.weight_decay)


def _split_eval_batch(cfg: Config, num_classes: int) -> int:
    """A split model's validation rows per forward pass (GPT: sequences whose logits fit _EVAL_ELEMENTS)."""
    if cfg.model == "gpt":
        return max(1, _EVAL_ELEMENTS // (cfg.context_length * num_classes))
    return _EVAL_BATCH
