"""``--resume``: the settings a resumed run takes from its checkpoint, what may change, and restoring.

A checkpoint stores the whole config. A resumed run takes from it every field marked
``resume="match"`` in :class:`~npddp.train.config.Config` ([fixed on resume]: given again with
another value, it is an error) and every field marked ``"inherit"`` ([from the checkpoint]:
unless given again; the backend is one); the rest (timeout, threads, printing, --max-steps)
are this run's own. So ``--checkpoint run.h5 --resume`` alone continues a run.

Allowed changes and what they cost: the backend and the sync settings change the order in
which gradients are summed, and a new world size restarts per-rank state (dropout streams,
comm hook error feedback, local-SGD replicas); results stay defined but are no longer bit-identical to
an uninterrupted run, and the header says so.
"""

from __future__ import annotations

import dataclasses
import json
import os

from npddp import checkpoint
from npddp.checkpoint import fileformat
from npddp.checkpoint.saveload import misfit
from npddp.checkpoint.stateful import ModelState, TrainState
from npddp.process.agree import agree, share_text
from npddp.train.config import Config, ConfigError, fixed_on_resume, flag, inherited_on_resume
from npddp.process.job import EXIT_USAGE, JobError
from npddp.train.console.metrics import TOTALS, MetricsLog

#: Fields whose change on resume alters the order of the gradient sums.
_ORDER_FIELDS = ("backend", "sync", "bucket_mb", "tp", "micro_batches")


def _show(value) -> str:
    """A config value as typed on the command line."""
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return "none" if value is None else str(value)


def read_saved(comm, path: str):
    """(rank 0's verified Checkpoint or None elsewhere, what every rank needs of it as a dict).

    Collective. The dict holds ``config``, ``backend``, ``world_size`` and the position; a
    missing, damaged or foreign file is a JobError (exit 2) on every rank.
    """
    ckpt, message, text = None, None, ""
    if comm.rank == 0:
        try:
            ckpt = fileformat.read(path)
            text = json.dumps({"config": ckpt.config, "backend": ckpt.backend, "world_size": ckpt.world_size,
                               "step": ckpt.step, "epochs_done": ckpt.epochs_done,
                               "batches_done": ckpt.batches_done})
        except fileformat.CheckpointError as exc:
            message = f"--resume: {exc}"
    message = agree(comm, message)
    if message:
        raise JobError(message, EXIT_USAGE)
    return ckpt, json.loads(share_text(comm, text))


def merge(given: dict, saved: dict, path: str) -> Config:
    """This run's Config: the flags ``given``, then the checkpoint's fixed and inherited fields, then defaults.

    ConfigError when a fixed flag is given with another value than the saved one.
    """
    config = saved["config"]
    fields = set(Config.__dataclass_fields__)
    differ = [name for name in fixed_on_resume() if name in given and name in config
              and given[name] != config[name]
              and not (name == "momentum" and given.get("optimizer", config.get("optimizer")) != "sgd")]
    if differ:
        was = " ".join(f"{flag(n)} {_show(config[n])}" for n in differ)
        now = " ".join(f"{flag(n)} {_show(given[n])}" for n in differ)
        raise ConfigError(f"--resume: checkpoint {path!r} was written with {was}, this run has {now}; "
                          "flags marked [fixed on resume] come from the checkpoint: leave them out "
                          "or repeat the saved values")
    values = {n: config[n] for n in (*fixed_on_resume(), *inherited_on_resume()) if n in config and n in fields}
    values.update(given)
    return Config(**values)


def changes(cfg: Config, given: dict, saved: dict, world_size: int, unkept: str = "") -> list[str]:
    """Header lines naming what differs from the checkpoint and whether bit-identity still holds.

    ``world_size``: this run's data replicas (its ranks, unless --tp/--pp split the model), compared with
    the checkpoint's; ``unkept``: state of this run that its checkpoints do not hold (a split run's), "" for none.
    A setting that differs without being given (a backend this transport cannot run) counts as changed.
    """
    config, lines, order = saved["config"], [], []
    split = cfg.tp * cfg.pp > 1 or config.get("tp", 1) * config.get("pp", 1) > 1
    size = "data replicas" if split else "world size"       # a split model's ranks share their replica's rows
    now, was = {size: world_size}, {size: saved["world_size"]}
    for name in inherited_on_resume():
        if name in config and getattr(cfg, name) != config[name]:
            now[flag(name)], was[flag(name)] = getattr(cfg, name), config[name]
    for key in now:
        if now[key] != was[key]:
            lines.append(f"{key} {_show(was[key])} -> {_show(now[key])}")
            if key.lstrip("-").replace("-", "_") in _ORDER_FIELDS:
                order.append(key)
    if not lines and unkept:
        return [f"resume: same settings as the checkpoint, which does not hold {unkept}; so the run may differ "
                "from an uninterrupted one"]
    if not lines:
        return ["resume: same settings as the checkpoint; bit-identical to an uninterrupted run"]
    text = "resume: changed since the checkpoint: " + ", ".join(lines)
    if world_size != saved["world_size"]:
        text += ("; per-rank state (dropout streams, comm hook error feedback, local-SGD replicas) starts "
                 "afresh and the rows each rank reads change, so the run is no longer bit-identical "
                 "to an uninterrupted one")
    elif order:
        text += ("; gradients are summed in another order, so results may differ in the last bits "
                 "from an uninterrupted run")
    return [text]


def steps_per_epoch(n_train: int, batch_size: int, world_size: int) -> int:
    """Optimizer steps in one epoch: each rank's ceil(n / N) rows in batches of batch_size / N."""
    per_rank, local = -(-n_train // world_size), batch_size // world_size
    return -(-per_rank // local)


def incompatibility(ckpt, path, *, model: ModelState, optim, optimizer_name: str,
                    steps: int | None = None) -> str | None:
    """Why ``ckpt`` cannot continue this run (a message naming both values), or None.

    ``steps``: steps per epoch at the checkpoint's world size (checks ``batches_done``).
    """
    if steps is not None and ckpt.batches_done >= steps:
        return (f"--resume: checkpoint {os.fspath(path)!r} says {ckpt.batches_done} batches of the epoch are done, "
                f"but an epoch of this data has {steps} steps on {ckpt.world_size} ranks; valid: 0..{steps - 1}")
    why = misfit(ckpt, path, model, optim, optimizer_name)
    return None if why is None else f"--resume: {why}"


def restore_into(trainer, ckpt, saved: dict, out, named=None, optimizer=None) -> None:
    """Check ``ckpt`` against ``trainer``'s run and load it (collective); JobError (exit 2) when it does not fit.

    ``named``, ``optimizer``: where the parameters and optimizer state go instead of the trainer's
    (a split model's whole-model targets, :mod:`npddp.parallel.model.whole`).
    """
    cfg, comm = trainer.cfg, trainer.comm
    model = ModelState(trainer.model.named_parameters() if named is None else named, trainer.dropouts, trainer.engine)
    optim = trainer.optimizer if optimizer is None else optimizer
    position = TrainState()

    def check(ckpt) -> str | None:
        steps = steps_per_epoch(trainer.n_train, cfg.batch_size, ckpt.world_size)
        return incompatibility(ckpt, cfg.checkpoint, model=model, optim=optim, optimizer_name=cfg.optimizer,
                               steps=steps)

    try:
        checkpoint.load(comm, cfg.checkpoint, {"model": model, "optim": optim, "train": position},
                        optimizer=cfg.optimizer, ckpt=ckpt, check=check)
    except checkpoint.CheckpointError as exc:
        raise JobError(str(exc), EXIT_USAGE) from None
    if trainer.averager is not None:
        trainer.averager.step = position.step
    trainer.optimizer.lr = cfg.lr
    trainer.epochs_done, trainer.batches_done, trainer.step = position.epochs_done, position.batches_done, position.step
    trainer.saved_at = trainer.step
    if len(position.totals) == len(TOTALS):
        trainer.totals[:] = position.totals
    trainer.attrs["resumed_from_step"] = trainer.step
    if trainer.log is not None:
        trainer.log, note = MetricsLog.resume(cfg.metrics, trainer.step, trainer.epochs_done)
        if note:
            out.warn(note)


def auto(comm, cfg: Config) -> Config:
    """``--resume auto``: the config with ``resume`` True when rank 0 finds the checkpoint, else False.

    Collective. For a job restarted by ``python -m npddp.run --max-restarts``: the first start
    begins fresh, every restart continues from the last complete checkpoint.
    """
    exists = "1" if comm.rank == 0 and cfg.checkpoint and os.path.exists(cfg.checkpoint) else "0"
    return dataclasses.replace(cfg, resume=share_text(comm, exists) == "1")
