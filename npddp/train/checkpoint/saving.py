"""Checkpoints from a user's own script: the same HDF5 file ``python -m npddp.train`` writes.

    from npddp import save_checkpoint, load_checkpoint
    save_checkpoint("run.h5", ddp, opt, config={"model": "mlp", "hidden": [256]},
                    input_shape=(64,), num_classes=10, epoch=3)      # every rank; rank 0 writes
    position = load_checkpoint("run.h5", ddp, opt)                  # every rank; {"step": ..., ...}

The file is written and read back by :func:`npddp.checkpoint.save` and :func:`npddp.checkpoint.load`, so ``python -m npddp.evaluate``, ``python -m npddp.generate``
and ``python -m npddp.train --checkpoint run.h5 --resume`` take it like one of their own.

What the file cannot learn from the objects, the script says: ``config`` holds the training
CLI's settings (``Config`` field names) that rebuild the model -- ``model`` and its shape
(``hidden``, ``channels``, ``model_size``, ``dropout``, ``dtype``, ``seed``) -- and, for a
resume by the CLI, the data (``dataset``, ``batch_size``, ...); ``input_shape`` and
``num_classes`` are one input row's shape and the classes (the vocabulary for a GPT). The
optimizer, its hyperparameters, the backend, ``sync``, ``bucket_mb`` and the ZeRO stage are taken
from the objects. :func:`save_checkpoint` rebuilds the model from ``config`` and refuses (before
anything is sent) when its parameters differ from the script's.
"""

from __future__ import annotations

import json
import os

import numpy as np

from npddp.nn import Dropout
from npddp.optim import SGD, AdamW
from npddp.parallel.zero import ShardedOptimizer, ZeroDataParallel, ZeroRedundancyOptimizer
from npddp import checkpoint
from npddp.checkpoint import fileformat
from npddp.checkpoint.stateful import CheckpointedOptimizer, ModelState, RunInfo, TrainState
from npddp.process.agree import agree, share_text
from npddp.train.console.banner import transport_of
from npddp.train.config import Config
from npddp.train.console.metrics import TOTALS
from npddp.train.models import build_model
from npddp.util.runinfo import environment

#: The optimizer classes a checkpoint names, and the names the CLI's ``--optimizer`` gives them.
_OPTIMIZER_NAMES = {SGD: "sgd", AdamW: "adamw"}


def _plain_optimizer(optimizer, comm):
    """(the optimizer as a checkpoint sees it: whole-model state, its CLI name); ZeRO's consolidate on rank 0."""
    sharded = isinstance(optimizer, (ShardedOptimizer, ZeroRedundancyOptimizer))
    inner = optimizer.optim if sharded else optimizer
    if type(inner) not in _OPTIMIZER_NAMES:
        raise TypeError(f"optimizer must be SGD or AdamW (npddp.optim), or ZeRO's over one of them, "
                        f"got {type(optimizer).__name__}")
    return (CheckpointedOptimizer(optimizer, comm) if sharded else optimizer), _OPTIMIZER_NAMES[type(inner)]


def _settings(config, ddp, optimizer, name: str) -> dict:
    """The checkpoint's config: the CLI's defaults, then ``config``, then what the objects say."""
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict of npddp.train settings, got {type(config).__name__}")
    fields = set(Config.__dataclass_fields__)
    unknown = sorted(set(config) - fields)
    if unknown:
        raise ValueError(f"config has unknown settings {unknown}; valid: the fields of npddp.train.config.Config "
                         f"({', '.join(sorted(fields))})")
    hyper = optimizer.state_dict() if not isinstance(optimizer, CheckpointedOptimizer) else \
        optimizer.sharded.template_state_dict()
    taken = {"optimizer": name, "lr": float(hyper["lr"]), "weight_decay": float(hyper["weight_decay"]),
             "backend": ddp.comm.name, "bucket_mb": ddp.bucket_cap_mb,
             "zero": ddp.stage if isinstance(ddp, ZeroDataParallel) else
             int(isinstance(optimizer, CheckpointedOptimizer))}
    if name == "sgd":
        taken["momentum"] = float(hyper["momentum"])
    if not isinstance(ddp, ZeroDataParallel):
        taken["sync"] = ddp.sync
    differ = [f"{k}={config[k]!r} (the objects say {v!r})" for k, v in taken.items() if k in config and config[k] != v]
    if differ:
        raise ValueError(f"config disagrees with the model, optimizer or communicator given: {', '.join(differ)}; "
                         "leave these out of config")
    cfg = Config(**{**config, **taken})
    return {**cfg.as_dict(), "dataset": cfg.dataset_name()}


def _check_model(settings: dict, model, input_shape, num_classes) -> tuple:
    """(description, dropout layers) after checking ``settings`` rebuild ``model``'s parameters exactly."""
    try:
        built, _, description = build_model(settings, input_shape, num_classes)
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"config {settings['model']!r} with input_shape {tuple(input_shape)} and num_classes "
                         f"{num_classes} does not build a model: {exc}") from None
    want = [(n, p.data.shape, p.data.dtype) for n, p in built.named_parameters()]
    have = [(n, p.data.shape, p.data.dtype) for n, p in model.named_parameters()]
    if want != have:
        first = next((i for i, (a, b) in enumerate(zip(want, have)) if a != b), min(len(want), len(have)))
        show = (lambda rows: f"{rows[first][0]} {rows[first][1]} {rows[first][2]}" if first < len(rows) else "nothing")
        raise ValueError(f"config does not describe the script's model: parameter #{first} is {show(want)} when "
                         f"built from config, {show(have)} in the model given ({len(want)} and {len(have)} "
                         "parameters); give config the model's settings (model, hidden, channels, model_size, "
                         "dropout, dtype, ...)")
    return description, [m for _, m in model.named_modules() if isinstance(m, Dropout)]


def save_checkpoint(path, ddp, optimizer, *, config: dict, input_shape, num_classes: int, epoch: int = 0) -> None:
    """Write ``ddp``'s model and ``optimizer`` to ``path`` as ``python -m npddp.train`` does (collective).

    Every rank calls it at the same step; rank 0 writes, atomically. ``ddp`` is a
    DistributedDataParallel or ZeroDataParallel, ``optimizer`` SGD or AdamW (or ZeRO's over
    them); ``config``, ``input_shape`` and ``num_classes`` describe the model (module docstring);
    ``epoch`` is the number of complete epochs (a CLI resume starts the next one). The step is
    the optimizer's. ValueError/TypeError before anything is sent when the arguments do not fit;
    OSError on every rank when the file cannot be written.
    """
    comm = ddp.comm
    opt, name = _plain_optimizer(optimizer, comm)
    settings = _settings(config, ddp, opt, name)
    if not (isinstance(num_classes, (int, np.integer)) and num_classes >= 1):
        raise ValueError(f"num_classes must be an int >= 1, got {num_classes!r}")
    input_shape = tuple(int(v) for v in input_shape)
    description, dropouts = _check_model(settings, ddp.module, input_shape, int(num_classes))
    step = int(opt.sharded.step_count if isinstance(opt, CheckpointedOptimizer) else opt.step_count)
    if not (isinstance(epoch, (int, np.integer)) and 0 <= epoch <= step):
        raise ValueError(f"epoch must be an int in [0, {step}] (complete epochs; every epoch takes at least "
                         f"one of the optimizer's {step} steps), got {epoch!r}")
    attrs = {}
    if comm.rank == 0:
        attrs = {**environment(world_size=comm.size, backend=comm.name, mpi=transport_of(comm) == "mpi"),
                 "model": description, "parameters": ddp.module.num_parameters(), "written_by": "script"}
    objects = {"model": ModelState(ddp.module.named_parameters(), dropouts, ddp), "optim": opt,
               "train": TrainState(int(epoch), 0, step, np.zeros(len(TOTALS)), TOTALS)}
    info = RunInfo(settings, comm.name, name, attrs, input_shape, int(num_classes))
    with ddp.full_parameters():                        # ZeRO-3 gathers the parameters here
        checkpoint.save(comm, path, objects, info=info, whole=True)


def load_checkpoint(path, ddp, optimizer=None) -> dict:
    """Load a checkpoint (the CLI's or :func:`save_checkpoint`'s) into ``ddp``'s model and ``optimizer`` (collective).

    Rank 0 reads and checks the file; every rank receives its values. Without ``optimizer`` only
    the parameters are loaded. Returns ``{"epoch", "batches_done", "step", "config"}``: the
    complete epochs, the batches of the next one already done, the optimizer steps, the settings.
    CheckpointError (a ValueError) on every rank when the file is missing, damaged or does not
    fit the model or optimizer.
    """
    comm = ddp.comm
    opt, name = _plain_optimizer(optimizer, comm) if optimizer is not None else (None, "")
    named = ddp.module.named_parameters()
    dropouts = [m for _, m in ddp.module.named_modules() if isinstance(m, Dropout)]
    position = TrainState()
    with ddp.full_parameters():                        # ZeRO-3: every rank's copy takes the whole parameters
        if opt is None:
            return _load_parameters(comm, path, named)
        got = checkpoint.load(comm, path, {"model": ModelState(named, dropouts, ddp), "optim": opt,
                                           "train": position}, optimizer=name)
    return {"epoch": position.epochs_done, "batches_done": position.batches_done, "step": position.step,
            "config": got["config"]}


def _load_parameters(comm, path, named) -> dict:
    """Rank 0's parameters (replica 0's under local SGD) on every rank, and where the file stands."""
    ckpt, message, text = None, None, ""
    if comm.rank == 0:
        try:
            ckpt = fileformat.read(path)
            message = _params_misfit(ckpt, path, named)
            text = json.dumps(ckpt.config)
        except fileformat.CheckpointError as exc:
            message = str(exc)
    message = agree(comm, message)
    if message:
        raise fileformat.CheckpointError(message)
    config = json.loads(share_text(comm, text))
    head = np.array([ckpt.per_rank, ckpt.epochs_done, ckpt.batches_done, ckpt.step] if comm.rank == 0
                    else [0, 0, 0, 0], dtype=np.int64)
    comm.broadcast(head, root=0)
    for key, p in named:
        if comm.rank == 0:
            value = ckpt.params[key]
            np.copyto(p.data, value[0] if ckpt.per_rank else value)
        comm.broadcast(p.data, root=0)
    return {"epoch": int(head[1]), "batches_done": int(head[2]), "step": int(head[3]), "config": config}


def _params_misfit(ckpt, path, named) -> str | None:
    """Why ``ckpt``'s parameters do not fit ``named`` (names, shapes, dtypes), or None."""
    lead = (ckpt.world_size,) if ckpt.per_rank else ()
    if list(ckpt.params) != [n for n, _ in named]:
        return f"checkpoint {os.fspath(path)!r} holds parameters {list(ckpt.params)}, the model has {[n for n, _ in named]}"
    for n, p in named:
        saved = ckpt.params[n]
        if saved.shape != lead + p.data.shape or saved.dtype != p.data.dtype:
            return (f"checkpoint {os.fspath(path)!r}: parameter {n!r} is {saved.shape} {saved.dtype} there, "
                    f"{p.data.shape} {p.data.dtype} here")
    return None


def load_model(path, rank: int = 0):
    """The model a checkpoint describes, with its trained parameters, in eval mode.

    Built from the settings stored in the file (``--model``, ``--hidden``, ...) and its
    ``input_shape`` and ``num_classes``. With local SGD, where replicas differ, rank
    ``rank``'s replica is loaded. ``model.forward(x)`` then gives logits for rows of
    ``input_shape`` (flattened for an MLP: see :func:`npddp.train.models.shape_rows`).
    """
    ckpt = fileformat.read(path)
    if not ckpt.input_shape or not ckpt.num_classes:
        raise fileformat.CheckpointError(f"checkpoint {os.fspath(path)!r} does not record the model's input "
                                         "shape and classes (written before npddp stored them)")
    model, _, _ = build_model(ckpt.config, ckpt.input_shape, ckpt.num_classes)
    if ckpt.per_rank and not 0 <= rank < ckpt.world_size:
        raise ValueError(f"rank {rank} is out of range; the checkpoint holds replicas 0..{ckpt.world_size - 1}")
    params = {k: (v[rank] if ckpt.per_rank else v) for k, v in ckpt.params.items()}
    try:
        model.load_state_dict(params)
    except ValueError as exc:
        raise fileformat.CheckpointError(f"checkpoint {os.fspath(path)!r} does not fit the model it describes: "
                                         f"{exc}") from None
    return model.eval()
