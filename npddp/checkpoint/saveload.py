"""Saving and loading a checkpoint of Stateful objects, sharded or whole by what the objects hold.

    from npddp import checkpoint
    objects = {"model": checkpoint.ModelState(ddp.module.named_parameters(), dropouts, ddp),
               "optim": opt, "train": checkpoint.TrainState(epochs_done=3, step=opt.step_count)}
    checkpoint.save(comm, "run.h5", objects, info=checkpoint.RunInfo(config, comm.name, "sgd"))
    checkpoint.load(comm, "run.h5", objects, optimizer="sgd")       # objects["train"] now says where

Both are collective. :func:`save` writes shards and an index when the optimizer holds shards
(ZeRO, a :class:`~npddp.checkpoint.stateful.CheckpointedOptimizer`; :mod:`npddp.checkpoint.shardwrite`),
else one whole file that rank 0 writes atomically (a crash leaves the old file or the new one,
never half). :func:`load` reads either kind at any world size, checks that the file fits the
objects on rank 0, and restores every rank's state.
"""

from __future__ import annotations

import json
import os

import numpy as np

from npddp.checkpoint import fileformat, shardwrite, state
from npddp.checkpoint.fileformat import Checkpoint, CheckpointError
from npddp.checkpoint.stateful import CheckpointedOptimizer, ModelState, RunInfo, TrainState
from npddp.process.agree import agree, share_text


def save(comm, path, objects: dict, *, info: RunInfo, whole: bool = False) -> None:
    """Write ``objects`` (``model``, ``optim``, ``train``) to ``path`` (collective); OSError on every rank on failure.

    ``whole``: one whole file even when the optimizer holds shards (its state consolidated on rank 0).
    """
    model, optim, train = objects["model"], objects["optim"], objects["train"]
    if isinstance(optim, CheckpointedOptimizer) and not whole:
        shardwrite.save(comm, path, model, optim, train, info)
        return
    ckpt = state.collect(comm, model, optim, train, info)
    message = None
    if comm.rank == 0:
        kept = "the previous file is kept" if os.path.lexists(path) else "there was no previous file"
        try:
            fileformat.write(path, ckpt)
            shardwrite.remove_old_steps(path, keep="")         # a sharded set this whole file replaces
        except OSError as exc:
            message = f"cannot write {os.fspath(path)}: {exc.strerror or exc}; {kept}"
    message = agree(comm, message)
    if message:
        raise OSError(message)


def load(comm, path, objects: dict, *, optimizer: str, ckpt: Checkpoint | None = None, check=None) -> dict:
    """Restore ``objects`` (``model``, ``optim``, ``train``) from ``path`` on every rank (collective).

    ``optimizer``: the optimizer's name the file must record. ``ckpt``: the file as rank 0 already
    read it (None: read here). ``check(ckpt)``: rank 0's check of the file against the objects, a
    message or None (default: :func:`misfit`).
    CheckpointError on every rank when the file is missing, damaged, or does not fit the objects.
    Returns the checkpoint's ``world_size``, ``fresh`` (per-rank state another world size left
    unrestored) and ``config`` (the settings the file records).
    """
    message, text = None, ""
    if comm.rank == 0:
        try:
            ckpt = fileformat.read(path) if ckpt is None else ckpt
            text = json.dumps(ckpt.config)
            message = (check(ckpt) if check is not None else
                       misfit(ckpt, path, objects["model"], _Template(objects["optim"]), optimizer))
        except CheckpointError as exc:
            message = str(exc)
    message = agree(comm, message)
    if message:
        raise CheckpointError(message)
    config = json.loads(share_text(comm, text))
    return {**state.restore(comm, ckpt, objects["model"], objects["optim"], objects["train"]), "config": config}


class _Template:
    """An optimizer as the rank-0 check sees it: its state's keys, shapes and dtypes, with nothing exchanged."""

    def __init__(self, optimizer):
        sharded = isinstance(optimizer, CheckpointedOptimizer)
        self.state_dict = optimizer.sharded.template_state_dict if sharded else optimizer.state_dict


def _describe(a) -> str:
    a = np.asarray(a)
    return f"{tuple(a.shape)} {a.dtype.name}"


def misfit(ckpt: Checkpoint, path, model: ModelState, optim, optimizer: str) -> str | None:
    """Why ``ckpt`` cannot be loaded into ``model`` and ``optim`` (a message naming both values), or None."""
    where = f"checkpoint {os.fspath(path)!r}"
    mine = [(name, p.data) for name, p in model.named]
    if list(ckpt.params) != [name for name, _ in mine]:
        return (f"{where} holds a different model: parameters {list(ckpt.params)} there, "
                f"{[name for name, _ in mine]} here")
    lead = (ckpt.world_size,) if ckpt.per_rank else ()
    for name, data in mine:
        saved = ckpt.params[name]
        if saved.shape != lead + data.shape or saved.dtype != data.dtype:
            return (f"{where} holds a different model: parameter {name!r} is {_describe(saved)} there, "
                    f"{_describe(np.empty(lead + data.shape, data.dtype))} here")
    if ckpt.optimizer_name != optimizer:
        return f"{where} holds {ckpt.optimizer_name} state, this run uses {optimizer}"
    template = optim.state_dict()
    if set(template) != set(ckpt.optimizer):
        return (f"{where} holds optimizer state {sorted(ckpt.optimizer)}, this run's optimizer "
                f"needs {sorted(template)}")
    for key, value in template.items():
        if isinstance(value, np.ndarray) and value.ndim:
            saved = np.asarray(ckpt.optimizer[key])
            if saved.shape != lead + value.shape or saved.dtype != value.dtype:
                return f"{where}: optimizer state {key!r} is {_describe(saved)} there, {_describe(value)} here"
    return _hook_misfit(ckpt, where, model.engine)


def _hook_misfit(ckpt: Checkpoint, where: str, engine) -> str | None:
    """Why the saved comm hook error feedback does not fit ``engine``'s buckets (same world size), or None."""
    errors = {int(k.split(".")[1]): v for k, v in ckpt.hook_state.items() if k.startswith("error.")}
    if not errors or engine is None or ckpt.world_size != engine.comm.size:
        return None
    have = {i: int(np.shape(v)[1]) for i, v in sorted(errors.items())}
    want = {i: int(engine.buckets[i].buffer.size) if i < len(engine.buckets) else 0 for i in have}
    if have == want:
        return None
    return (f"{where} holds comm hook error feedback for buckets of {list(have.values())} elements, "
            f"this run's buckets have {list(want.values())}; resume with the saved --sync and --bucket-mb "
            f"({_show(ckpt.config.get('sync'))}, {_show(ckpt.config.get('bucket_mb'))})")



def _show(value) -> str:
    """A setting as typed on the command line."""
    return " ".join(str(v) for v in value) if isinstance(value, list) else "none" if value is None else str(value)
