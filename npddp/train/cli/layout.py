"""The training CLI's model-parallel layout: ``--tp``, ``--pp``, ``--micro-batches``, ``--pp-schedule`` checked.

Over the data replicas of a split run, DDP with any ``--comm-hook``, ``--zero 1`` and
``--local-sgd`` work as they do without a split; ``--zero 2`` and ``3`` are refused.

Everything here looks at the flags and the world size only (no messages), so every rank reaches
the same verdict before anything is sent; :func:`dry_check` builds the model once more with a
stand-in tensor group to find sizes the split cannot take.
"""

from __future__ import annotations

from types import SimpleNamespace

from npddp.parallel.model.mesh import Mesh
from npddp.parallel.model.schedules import ideal_bubble
from npddp.train.config import Config, ConfigError

#: The models --tp/--pp split.
SPLIT_MODELS = ("mlp", "gpt")


def is_split(cfg: Config) -> bool:
    """True when the run splits the model (--tp or --pp above 1)."""
    return cfg.tp * cfg.pp > 1


def micro_batches(cfg: Config) -> int:
    """Micro-batches per step: --micro-batches, or --pp when it is 0."""
    return cfg.micro_batches or cfg.pp


def check_layout(cfg: Config, world_size: int) -> int:
    """The number of data replicas; ConfigError on a layout or combination the split cannot run."""
    for name in ("tp", "pp"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"--{name} must be an integer >= 1, got {value}")
    if cfg.micro_batches < 0:
        raise ConfigError(f"--micro-batches must be an integer >= 0 (0: --pp), got {cfg.micro_batches}")
    try:
        mesh = Mesh(world_size, tp=cfg.tp, pp=cfg.pp)
    except ValueError:
        divisors = ", ".join(str(d) for d in range(1, world_size + 1) if world_size % d == 0)
        raise ConfigError(f"--tp {cfg.tp} x --pp {cfg.pp} = {cfg.tp * cfg.pp} does not divide the world size "
                          f"{world_size}; tp x pp must be one of {divisors}"
                          + ("; on --resume they come from the checkpoint unless given" if cfg.resume else "")) from None
    if not is_split(cfg):
        if cfg.micro_batches and not cfg.resume:
            raise ConfigError(f"--micro-batches {cfg.micro_batches} applies with --tp or --pp above 1")
        return world_size
    what = f"--tp {cfg.tp} --pp {cfg.pp}"
    if cfg.model not in SPLIT_MODELS:
        raise ConfigError(f"{what} splits --model {' or '.join(SPLIT_MODELS)}, not {cfg.model}")
    if cfg.zero >= 2:
        raise ConfigError(f"--zero {cfg.zero} with {what} is not supported: the stages' gradients are reduced by "
                          "DDP over the data replicas; --zero 1 (optimizer state sharded over them) works")
    return mesh.dp


def check_micro_batches(cfg: Config, rows: int) -> None:
    """ConfigError when a split run's micro-batches do not fit the ``rows`` of a replica's step."""
    if is_split(cfg) and not 1 <= micro_batches(cfg) <= rows:
        raise ConfigError(f"--micro-batches {micro_batches(cfg)} must be in [1, {rows}] (the rows per step of "
                          f"a data replica: --batch-size {cfg.batch_size} / {cfg.batch_size // rows} replicas)")


def layout_line(cfg: Config, world_size: int) -> str:
    """The header's line, e.g. ``parallel: dp 2 x pp 2 x tp 2; pipeline 1f1b, 4 micro-batches, bubble 0.20``."""
    mesh, m = Mesh(world_size, tp=cfg.tp, pp=cfg.pp), micro_batches(cfg)
    text = f"parallel: dp {mesh.dp} x pp {mesh.pp} x tp {mesh.tp}; "
    if mesh.pp == 1:
        return text + f"no pipeline, {m} micro-batch{'es' * (m > 1)} (gradient accumulation)"
    return text + f"pipeline {cfg.pp_schedule}, {m} micro-batches, bubble {ideal_bubble(mesh.pp, m):.2f}"


def dry_check(build, cfg: Config) -> str | None:
    """Why ``build()`` (a fresh full model) cannot be split by --tp/--pp, or None; nothing is sent."""
    from npddp.parallel.model import PipelineStage, tensor_parallel

    model = build()
    try:
        if cfg.tp > 1:
            model = tensor_parallel(model, SimpleNamespace(name="check", size=cfg.tp, rank=0))
        PipelineStage(model, cfg.pp, cfg.pp - 1)
    except ValueError as exc:
        return f"--tp {cfg.tp} --pp {cfg.pp}: {exc}"
    return None
