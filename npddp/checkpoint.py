"""Training checkpoints: gathered over the communicator, written atomically by rank 0, restored exactly.

File layout (HDF5, written through ``runinfo.atomic_h5``)::

    /                 attrs: format="npddp-checkpoint", schema_version, epochs_done (complete
                      epochs), batches_done (batches of the epoch in progress), step (optimizer
                      steps in all), world_size, backend, per_rank, optimizer, sampler_seed,
                      config (JSON) and config.<field>, the environment (mpi_library, host, ...)
    /params/<name>    each parameter, in named_parameters() order (group attr ``order``);
                      shape (world_size, *shape) when per_rank (local SGD: replicas differ)
    /optimizer/<key>  the optimizer's state_dict(): step, lr, hyperparameters as scalars,
                      buffers such as exp_avg.3 (with a leading rank axis when per_rank)
    /rng/dropout      (world_size, n_dropout, 6) uint64: each rank's PCG64 dropout streams
                      (present only when the model has dropout)
    /ddp/residual.<i> (world_size, n): each rank's top-k error feedback of bucket i (top-k only)
    /progress/totals  running sums of the epoch in progress (attr ``columns``)

The data order needs no state: the sampler shuffles with ``sampler_seed + epoch``.
Per-rank arrays travel as int64 or float buffers through the communicator's gather and
scatter; nothing is pickled. Only rank 0 touches the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

from .runinfo import SCHEMA_VERSION, atomic_h5, read_attrs, write_attrs

FORMAT = "npddp-checkpoint"
_POSITION = ("epochs_done", "batches_done", "step", "world_size")


class CheckpointError(ValueError):
    """A checkpoint that is missing, unreadable, foreign, or does not fit this run."""


@dataclass
class Checkpoint:
    """Everything a checkpoint file holds, in memory (rank 0 only)."""

    epochs_done: int
    batches_done: int
    step: int
    world_size: int
    backend: str
    config: dict
    params: dict              # name -> array, (world_size, *shape) when per_rank
    optimizer: dict           # state_dict() key -> array or scalar (buffers rank-major when per_rank)
    optimizer_name: str
    per_rank: bool = False
    dropout_rng: np.ndarray | None = None          # (world_size, n_dropout, 6) uint64
    residuals: list = field(default_factory=list)  # [(world_size, n)] per bucket
    totals: np.ndarray = field(default_factory=lambda: np.zeros(0))
    totals_columns: tuple = ()
    attrs: dict = field(default_factory=dict)      # environment, written as attributes


# ----------------------------------------------------------------------------- file I/O (rank 0)

def write(path, ckpt: Checkpoint) -> None:
    """Write ``ckpt`` to ``path`` atomically: a crash leaves the previous file or this one."""
    with atomic_h5(path) as f:
        write_attrs(f, ckpt.attrs)
        write_attrs(f, {"config": ckpt.config})
        f.attrs.update({"format": FORMAT, "schema_version": SCHEMA_VERSION,
                        "epochs_done": ckpt.epochs_done, "batches_done": ckpt.batches_done,
                        "step": ckpt.step, "world_size": ckpt.world_size, "backend": ckpt.backend,
                        "per_rank": ckpt.per_rank, "optimizer": ckpt.optimizer_name,
                        "sampler_seed": int(ckpt.config.get("seed", 0))})
        g = f.create_group("params")
        g.attrs["order"] = json.dumps(list(ckpt.params))
        for name, value in ckpt.params.items():
            g.create_dataset(name, data=value)
        g = f.create_group("optimizer")
        for key, value in ckpt.optimizer.items():
            g.create_dataset(key, data=value)
        rng = f.create_group("rng")
        if ckpt.dropout_rng is not None:
            rng.create_dataset("dropout", data=ckpt.dropout_rng.astype(np.uint64))
        g = f.create_group("ddp")
        for i, res in enumerate(ckpt.residuals):
            g.create_dataset(f"residual.{i}", data=res)
        g = f.create_group("progress")
        g.create_dataset("totals", data=np.asarray(ckpt.totals, dtype=np.float64))
        g["totals"].attrs["columns"] = json.dumps(list(ckpt.totals_columns))


def read(path) -> Checkpoint:
    """Load a checkpoint file; CheckpointError (naming the file) when it is missing, foreign or damaged."""
    import h5py

    path = os.fspath(path)
    if not os.path.exists(path):
        raise CheckpointError(f"checkpoint {path!r} does not exist")
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path!r}: not an HDF5 file, or damaged ({exc})") \
            from None
    with f:
        attrs = read_attrs(f)
        if attrs.get("format") != FORMAT:
            found = f"format {attrs['format']!r}" if "format" in attrs else "no 'format' attribute"
            raise CheckpointError(f"{path!r} is not an npddp checkpoint ({found}; expected {FORMAT!r})")
        if attrs.get("schema_version") != SCHEMA_VERSION:
            raise CheckpointError(f"checkpoint {path!r} has schema version {attrs.get('schema_version')!r}; "
                                  f"this npddp reads version {SCHEMA_VERSION}")
        try:
            return _from_file(f, attrs)
        except (KeyError, ValueError, TypeError, OSError) as exc:
            raise CheckpointError(f"checkpoint {path!r} is damaged or incomplete: {exc}") from None


def _from_file(f, attrs: dict) -> Checkpoint:
    """The Checkpoint stored in an open file whose format is already checked."""
    order = json.loads(f["params"].attrs["order"])
    params = {name: f["params"][name][()] for name in order}
    optimizer = {}
    for key, ds in f["optimizer"].items():
        value = ds[()]
        optimizer[key] = value.item() if isinstance(value, np.generic) and key != "step" else value
    dropout = f["rng"]["dropout"][()] if "dropout" in f["rng"] else None
    residuals = [f["ddp"][f"residual.{i}"][()] for i in range(len(f["ddp"]))]
    totals = f["progress"]["totals"]
    env = {k: v for k, v in attrs.items() if not k.startswith("config")}
    return Checkpoint(epochs_done=int(attrs["epochs_done"]), batches_done=int(attrs["batches_done"]),
                      step=int(attrs["step"]), world_size=int(attrs["world_size"]),
                      backend=str(attrs["backend"]), config=json.loads(attrs["config"]),
                      params=params, optimizer=optimizer, optimizer_name=str(attrs["optimizer"]),
                      per_rank=bool(attrs["per_rank"]), dropout_rng=dropout, residuals=residuals,
                      totals=totals[()], totals_columns=tuple(json.loads(totals.attrs["columns"])),
                      attrs=env)


# ----------------------------------------------------------------------------- gather (collective)

def _gathered(comm, array: np.ndarray, per_rank: bool):
    """Root: ``(size, *shape)`` stack of every rank's ``array`` (per_rank) or a copy of its own."""
    if per_rank:
        return comm.gather(np.ascontiguousarray(array), root=0)
    return np.array(array, copy=True) if comm.rank == 0 else None


def collect(comm, *, named_params, optimizer, ddp, dropouts, position: tuple[int, int, int],
            totals: np.ndarray, totals_columns, config: dict, backend: str,
            optimizer_name: str, attrs: dict) -> Checkpoint | None:
    """Gather this step's training state; the Checkpoint on rank 0, None elsewhere.

    Collective: every rank calls it at the same step. Parameters and optimizer buffers are
    stored once, or per rank with local SGD (``ddp.local_sgd``) where replicas differ.
    """
    per_rank = bool(ddp.local_sgd) and comm.size > 1
    params = {name: _gathered(comm, p.data, per_rank) for name, p in named_params}
    state = optimizer.state_dict()
    opt = {k: _gathered(comm, v, per_rank) if isinstance(v, np.ndarray) and v.ndim else v
           for k, v in state.items()}
    dropout = None
    if dropouts:
        words = np.stack([d.get_rng_state() for d in dropouts])               # (n_dropout, 6) uint64
        dropout = comm.gather(words.view(np.int64), root=0)                   # (size, n_dropout, 6)
    residuals = []
    if ddp.compression == "topk":
        for bucket in ddp.buckets:
            res = bucket.residual if bucket.residual is not None else np.zeros_like(bucket.buffer)
            residuals.append(comm.gather(res, root=0))                        # (size, n)
    if comm.rank != 0:
        return None
    epochs_done, batches_done, step = position
    return Checkpoint(epochs_done=epochs_done, batches_done=batches_done, step=step,
                      world_size=comm.size, backend=backend, config=config, params=params,
                      optimizer=opt, optimizer_name=optimizer_name, per_rank=per_rank,
                      dropout_rng=None if dropout is None else dropout.view(np.uint64),
                      residuals=residuals, totals=np.array(totals, dtype=np.float64),
                      totals_columns=tuple(totals_columns), attrs=attrs)


# ----------------------------------------------------------------------------- compatibility (rank 0)

def _describe(a) -> str:
    a = np.asarray(a)
    return f"{tuple(a.shape)} {a.dtype.name}"


def incompatibility(ckpt: Checkpoint, path, *, config: dict, fixed: tuple, flags: dict, world_size: int,
                    allow_world_size_change: bool, named_params, optimizer, ddp,
                    optimizer_name: str) -> str | None:
    """Why ``ckpt`` cannot continue this run (a message naming both values), or None.

    ``config`` is this run's config with resolved values, ``fixed`` the fields that must
    match, ``flags`` maps field names to their command-line flags.
    """
    where = f"--resume: checkpoint {os.fspath(path)!r}"
    if ckpt.world_size != world_size and not allow_world_size_change:
        return (f"{where} was written by {ckpt.world_size} ranks, this run has {world_size}; "
                f"resume with {ckpt.world_size} ranks, or pass --allow-world-size-change "
                "(the result will no longer be bit-identical)")
    differ = [(flags[name], ckpt.config.get(name, "<missing>"), config[name]) for name in fixed
              if ckpt.config.get(name, "<missing>") != config[name]
              and not (name == "momentum" and config.get("optimizer") != "sgd")]
    if differ:
        saved = " ".join(f"{f} {_show(a)}" for f, a, _ in differ)
        now = " ".join(f"{f} {_show(b)}" for f, _, b in differ)
        return (f"{where} was written with {saved}, this run has {now}; "
                "flags marked [fixed on resume] must repeat the saved values")
    mine = [(name, p.data) for name, p in named_params]
    if list(ckpt.params) != [name for name, _ in mine]:
        return (f"{where} holds a different model: parameters {list(ckpt.params)} there, "
                f"{[name for name, _ in mine]} here")
    lead = (ckpt.world_size,) if ckpt.per_rank else ()
    for name, data in mine:
        saved = ckpt.params[name]
        if saved.shape != lead + data.shape or saved.dtype != data.dtype:
            return (f"{where} holds a different model: parameter {name!r} is {_describe(saved)} there, "
                    f"{_describe(np.empty(lead + data.shape, data.dtype))} here")
    if ckpt.optimizer_name != optimizer_name:
        return f"{where} holds {ckpt.optimizer_name} state, this run uses {optimizer_name}"
    template = optimizer.state_dict()
    if set(template) != set(ckpt.optimizer):
        return (f"{where} holds optimizer state {sorted(ckpt.optimizer)}, this run's optimizer "
                f"needs {sorted(template)}")
    for key, value in template.items():
        if isinstance(value, np.ndarray) and value.ndim:
            saved = np.asarray(ckpt.optimizer[key])
            if saved.shape != lead + value.shape or saved.dtype != value.dtype:
                return f"{where}: optimizer state {key!r} is {_describe(saved)} there, {_describe(value)} here"
    if ckpt.world_size == world_size and ddp.compression == "topk" and ckpt.residuals:
        have = [int(r.shape[1]) for r in ckpt.residuals]
        want = [int(b.buffer.size) for b in ddp.buckets]
        if have != want:
            return (f"{where} holds top-k residuals for buckets of {have} elements, this run's buckets "
                    f"have {want}; resume with the saved --sync and --bucket-mb "
                    f"({_show(ckpt.config.get('sync'))}, {_show(ckpt.config.get('bucket_mb'))})")
    return None


def _show(value) -> str:
    """A config value as typed on the command line."""
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return "none" if value is None else str(value)


# ----------------------------------------------------------------------------- restore (collective)

def restore(comm, ckpt: Checkpoint | None, *, named_params, optimizer, ddp, dropouts) -> dict:
    """Load rank 0's ``ckpt`` into every rank's model, optimizer, DDP and dropout streams.

    Collective; ``ckpt`` is only read on rank 0 (and must have passed :func:`incompatibility`).
    Returns the position (epochs_done, batches_done, step), the checkpoint's world_size, the
    epoch totals, and ``fresh``: the per-rank state that could not be restored (another world size).
    """
    root = comm.rank == 0
    head = np.zeros(7, dtype=np.int64)
    if root:
        head[:] = [ckpt.epochs_done, ckpt.batches_done, ckpt.step, ckpt.world_size, ckpt.per_rank,
                   ckpt.dropout_rng is not None, len(ckpt.residuals)]
    comm.broadcast(head, root=0)
    epochs_done, batches_done, step, saved_size, per_rank, has_dropout, n_res = (int(v) for v in head)
    same = saved_size == comm.size

    def place(saved, target: np.ndarray, stacked: bool) -> None:
        """Copy a saved array into ``target`` on every rank (its own row when ``stacked``)."""
        if stacked and same:
            stack = np.asarray(saved) if root else np.empty((comm.size,) + target.shape, target.dtype)
            np.copyto(target, comm.scatter(np.ascontiguousarray(stack, dtype=target.dtype), root=0))
            return
        if root:
            np.copyto(target, np.asarray(saved)[0] if stacked else saved)
        comm.broadcast(target, root=0)

    for name, p in named_params:
        place(ckpt.params[name] if root else None, p.data, bool(per_rank))
    state = optimizer.state_dict()
    for key in sorted(state):
        value = state[key]
        if isinstance(value, np.ndarray) and value.ndim:
            place(ckpt.optimizer[key] if root else None, value, bool(per_rank))
            continue
        kind = np.int64 if key == "step" or isinstance(value, (bool, np.bool_)) else np.float64
        box = np.array([ckpt.optimizer[key] if root else 0], dtype=kind)
        comm.broadcast(box, root=0)
        state[key] = np.int64(box[0]) if key == "step" else type(value)(box[0].item())
    optimizer.load_state_dict(state)
    fresh = []
    if has_dropout and same:
        words = np.stack([d.get_rng_state() for d in dropouts]).view(np.int64)       # (n_dropout, 6)
        stack = ckpt.dropout_rng.view(np.int64) if root else np.empty((comm.size,) + words.shape, np.int64)
        mine = comm.scatter(np.ascontiguousarray(stack), root=0).view(np.uint64)
        for d, w in zip(dropouts, mine):
            d.set_rng_state(w)
    elif dropouts:
        fresh.append("dropout streams")
    if n_res and same and ddp.compression == "topk":
        for i, bucket in enumerate(ddp.buckets):
            res = np.empty((comm.size, bucket.buffer.size), bucket.buffer.dtype)
            src = np.ascontiguousarray(ckpt.residuals[i], dtype=res.dtype) if root else res
            bucket.residual = comm.scatter(src, root=0)                       # (n,)
    elif ddp.compression == "topk":
        fresh.append("top-k residuals")
    ddp.steps = step
    totals = np.array(ckpt.totals if root else np.zeros(0), dtype=np.float64)
    size = np.array([totals.size], dtype=np.int64)
    comm.broadcast(size, root=0)
    totals = totals if root else np.zeros(int(size[0]))
    comm.broadcast(totals, root=0)
    return {"epochs_done": epochs_done, "batches_done": batches_done, "step": step,
            "world_size": saved_size, "totals": totals, "fresh": fresh}
