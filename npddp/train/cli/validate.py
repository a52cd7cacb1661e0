"""Validation of a training :class:`~npddp.train.config.Config`: ranges, combinations, data names, paths, faults.

Every check looks at the Config and the world size only (no files read, no messages), so every
rank reaches the same verdict; each failure is one :class:`ConfigError` naming the bad value
and what is valid.
"""

from __future__ import annotations

import math
import os

from npddp.comm.communicators.choice import parse_algorithms
from npddp.data.datasets import TOKEN_PREFIXES
from npddp.util.threads import parse_threads
from npddp.train.config import DATA_SUFFIXES, DATASETS, H5_SUFFIXES, Config, ConfigError, flag
from npddp.train.cli.layout import check_layout, check_micro_batches
from npddp.train.faults import parse_fault

#: Backends that run their own schedules for every collective: --algorithms does not apply to them.
OWN_SCHEDULES = ("mpi", "naive", "hier")


def _positive(cfg: Config, name: str, allow_zero: bool = False) -> None:
    value = getattr(cfg, name)
    ok = value >= 0 if allow_zero else value > 0
    if not (ok and math.isfinite(value)):
        what = "an integer >= 0" if isinstance(value, int) and allow_zero else \
            "a positive integer" if isinstance(value, int) else "a positive number"
        raise ConfigError(f"{flag(name)} must be {what}, got {value}")


def check_config(cfg: Config, world_size: int) -> None:
    """Raise ConfigError on the first setting that is invalid for ``world_size`` ranks.

    Looks at nothing but ``cfg`` and ``world_size`` (no files, no messages), so every rank
    reaches the same verdict.
    """
    for name in ("epochs", "batch_size", "lr", "bucket_mb", "log_every", "context_length"):
        _positive(cfg, name)
    for name in ("local_sgd", "seed", "max_steps", "checkpoint_every", "train_samples", "val_samples",
                 "vocab_size"):
        _positive(cfg, name, allow_zero=True)
    try:
        parse_threads(cfg.threads)
    except ValueError:
        raise ConfigError(f"--threads must be auto or a positive integer, got {cfg.threads!r}") from None
    for name in ("x_key", "y_key"):
        if not getattr(cfg, name).strip():
            raise ConfigError(f"{flag(name)} must name an array, got an empty string")
    _check_ranges(cfg)
    if not cfg.resume:           # a checkpoint's settings were accepted when it was written
        _check_model_flags(cfg)
    replicas = check_layout(cfg, world_size)
    plain = replicas == world_size
    who = "ranks" if plain else "data replicas (world size / (--tp x --pp))"
    if cfg.batch_size < replicas:
        raise ConfigError(f"--batch-size {cfg.batch_size} is smaller than the world size {world_size}: "
                          "every rank needs at least one row per step" if plain else
                          f"--batch-size {cfg.batch_size} is smaller than the {replicas} {who}: "
                          "every replica needs at least one row per step")
    if cfg.batch_size % replicas:
        lower = cfg.batch_size - cfg.batch_size % replicas
        raise ConfigError(f"--batch-size {cfg.batch_size} does not split evenly over {replicas} "
                          f"{who}: use a multiple of {replicas}, e.g. {lower} or {lower + replicas}")
    check_micro_batches(cfg, cfg.batch_size // replicas)
    if cfg.timeout is not None:
        if not cfg.timeout > 0:
            raise ConfigError(f"--timeout must be a number of seconds > 0 (inf: wait forever), got {cfg.timeout}")
    if cfg.inject_fault is not None:
        parse_fault(cfg.inject_fault, world_size)
    if cfg.local_sgd and cfg.comm_hook != "allreduce":
        raise ConfigError(f"--local-sgd {cfg.local_sgd} averages parameters, so it cannot be combined "
                          f"with --comm-hook {cfg.comm_hook}")
    if cfg.powersgd_rank < 1:
        raise ConfigError(f"--powersgd-rank must be an integer >= 1, got {cfg.powersgd_rank}")
    if cfg.powersgd_start_iter < 2:
        raise ConfigError(f"--powersgd-start-iter must be an integer >= 2 (error feedback and warm start "
                          f"need plain steps first), got {cfg.powersgd_start_iter}")
    if check_algorithms(cfg) and cfg.backend in OWN_SCHEDULES:
        raise ConfigError(f"--algorithms {cfg.algorithms} applies to the hand-written backends that run the "
                          f"registry's algorithms; --backend {cfg.backend} runs its own schedules")
    _check_zero(cfg)
    _check_sequence_parallel(cfg)
    _check_moe(cfg)
    _check_dataset(cfg)
    _check_files(cfg)


def check_algorithms(cfg: Config) -> dict:
    """``--algorithms`` as {collective: name} (see :func:`npddp.comm.communicators.choice.parse_algorithms`)."""
    try:
        chosen = parse_algorithms(cfg.algorithms)
    except ValueError as exc:
        raise ConfigError(f"--algorithms: {exc}") from None
    return chosen


def _check_ranges(cfg: Config) -> None:
    """The settings that must lie in a range: momentum, weight decay, dropout, top-k ratio, layer widths."""
    if not (0.0 <= cfg.momentum < 1.0):
        raise ConfigError(f"--momentum must be in [0, 1), got {cfg.momentum}")
    if not (0.0 <= cfg.weight_decay < math.inf):
        raise ConfigError(f"--weight-decay must be a finite number >= 0, got {cfg.weight_decay}")
    if not (0.0 <= cfg.dropout < 1.0):
        raise ConfigError(f"--dropout must be in [0, 1), got {cfg.dropout}")
    if cfg.model == "gpt" and cfg.dropout:
        raise ConfigError(f"--dropout {cfg.dropout} applies to mlp and cnn; the gpt has no dropout layers")
    if not (0.0 < cfg.topk_ratio <= 1.0):
        raise ConfigError(f"--topk-ratio must be in (0, 1], got {cfg.topk_ratio}")
    for name in ("hidden", "channels"):
        bad = [v for v in getattr(cfg, name) if v < 1]
        if bad:
            raise ConfigError(f"{flag(name)} takes positive integers, got {bad[0]}")


#: Flags only some built-in models read, and those models.
MODEL_FLAGS = {"hidden": ("mlp", "cnn"), "channels": ("cnn",), "model_size": ("gpt",),
               "context_length": ("gpt",), "vocab_size": ("gpt",), "moe_experts": ("gpt",)}


def _check_model_flags(cfg: Config) -> None:
    """A flag set away from its default for a built-in model that does not read it is an error naming its model."""
    if cfg.model not in {m for models in MODEL_FLAGS.values() for m in models}:
        return                   # a registered model may read any setting
    defaults = Config()
    for name, models in MODEL_FLAGS.items():
        value = getattr(cfg, name)
        if cfg.model not in models and value != getattr(defaults, name):
            shown = " ".join(map(str, value)) if isinstance(value, list) else value
            raise ConfigError(f"{flag(name)} {shown} applies to --model {' or '.join(models)}; --model "
                              f"{cfg.model} does not read it")


def _check_moe(cfg: Config) -> None:
    """--moe-experts E >= 0; with E: --moe-top-k in [1, E], --moe-capacity > 0, --moe-aux >= 0, no --tp/--pp."""
    if cfg.moe_experts < 0:
        raise ConfigError(f"--moe-experts must be an integer >= 0 (0: no experts), got {cfg.moe_experts}")
    if not cfg.moe_experts:
        return
    if not 1 <= cfg.moe_top_k <= cfg.moe_experts:
        raise ConfigError(f"--moe-top-k must be in [1, {cfg.moe_experts}] (--moe-experts), got {cfg.moe_top_k}")
    if not (0.0 < cfg.moe_capacity < math.inf):
        raise ConfigError(f"--moe-capacity must be a finite number > 0, got {cfg.moe_capacity}")
    if not (0.0 <= cfg.moe_aux < math.inf):
        raise ConfigError(f"--moe-aux must be a finite number >= 0, got {cfg.moe_aux}")
    if cfg.tp > 1 or cfg.pp > 1:
        raise ConfigError(f"--moe-experts {cfg.moe_experts} runs with data parallelism only, not with "
                          f"--tp {cfg.tp} --pp {cfg.pp}: use --tp 1 --pp 1")


def _check_dataset(cfg: Config) -> None:
    """A known dataset name, a path with a data-file suffix, or a directory path; mnist needs --data-dir."""
    name = cfg.dataset_name()
    tokens = name == "synthetic-tokens" or name.startswith(TOKEN_PREFIXES)
    if name not in DATASETS and not name.lower().endswith(DATA_SUFFIXES) and "/" not in name \
            and os.sep not in name and not tokens:
        raise ConfigError(f"unknown --dataset {name!r}; valid: {', '.join(d for d in DATASETS if d != 'synthetic-tokens')}, "
                          f"a path ending in {', '.join(DATA_SUFFIXES)}, or a directory path (with a '/') "
                          f"holding {cfg.x_key}.npy and {cfg.y_key}.npy; for --model gpt: synthetic-tokens, "
                          "tokens:PATH or text:PATH")
    if tokens != (cfg.model == "gpt"):
        raise ConfigError(f"--dataset {name} holds token sequences, which only --model gpt takes" if tokens else
                          f"--model gpt needs token data: --dataset synthetic-tokens, tokens:PATH or "
                          f"text:PATH, not {name!r}")
    if name == "mnist" and not cfg.data_dir:
        raise ConfigError("--dataset mnist needs --data-dir DIR: the directory holding "
                          "train-images-idx3-ubyte and the other three IDX files")


def _check_files(cfg: Config) -> None:
    """Output paths end in .h5/.hdf5 and differ; flags that need --checkpoint have it."""
    for name in ("checkpoint", "metrics"):
        path = getattr(cfg, name)
        if path is not None and not path.lower().endswith(H5_SUFFIXES):
            raise ConfigError(f"{flag(name)} {path!r} must end in {' or '.join(H5_SUFFIXES)}")
    if cfg.checkpoint and cfg.metrics and os.path.abspath(cfg.checkpoint) == os.path.abspath(cfg.metrics):
        raise ConfigError(f"--checkpoint and --metrics name the same file {cfg.checkpoint!r}")
    for name in ("resume", "checkpoint_every"):
        if getattr(cfg, name) and cfg.checkpoint is None:
            raise ConfigError(f"{flag(name)} needs --checkpoint PATH.h5")


#: ZeRO stages --zero takes.
ZERO_STAGES = (0, 1, 2, 3)


def _check_sequence_parallel(cfg: Config) -> None:
    """--sequence-parallel needs a tensor-parallel GPT whose context length splits over --tp."""
    if not cfg.sequence_parallel:
        return
    if cfg.tp < 2:
        raise ConfigError(f"--sequence-parallel splits the sequence over the tensor group: it needs --tp 2 or more, "
                          f"got --tp {cfg.tp}")
    if cfg.model != "gpt":
        raise ConfigError(f"--sequence-parallel applies to --model gpt, not {cfg.model}")
    if cfg.context_length % cfg.tp:
        raise ConfigError(f"--sequence-parallel: --context-length {cfg.context_length} is not a multiple of --tp "
                          f"{cfg.tp}; use e.g. {cfg.context_length - cfg.context_length % cfg.tp or cfg.tp}")


def _check_zero(cfg: Config) -> None:
    """--zero is a stage, and the DDP options it is combined with make sense for it."""
    if cfg.zero not in ZERO_STAGES:
        raise ConfigError(f"--zero must be one of {', '.join(map(str, ZERO_STAGES))}, got {cfg.zero}")
    if cfg.zero and cfg.local_sgd:
        raise ConfigError(f"--local-sgd {cfg.local_sgd} keeps a different replica on every rank, which --zero "
                          f"{cfg.zero} cannot shard; use one or the other")
    if cfg.zero >= 2 and cfg.comm_hook != "allreduce":
        raise ConfigError(f"--comm-hook {cfg.comm_hook} works on whole buckets for an all-reduce; --zero "
                          f"{cfg.zero} reduce-scatters them (use --zero 1 or --comm-hook allreduce)")
    if cfg.zero >= 2 and cfg.sync != "overlap":
        raise ConfigError(f"--sync {cfg.sync} is a DDP strategy; --zero {cfg.zero} always reduce-scatters each "
                          "bucket as backward finishes it (use --sync overlap, the default, or --zero 0/1)")
