"""Training state over the communicator: gathered for a checkpoint, restored from one.

:func:`collect` gathers every rank's state into a :class:`~npddp.checkpoint.fileformat.Checkpoint` on rank
0; :func:`restore` puts rank 0's checkpoint back into every rank's objects (model, optimizer,
position: :mod:`npddp.checkpoint.stateful`). Both are collective. Per-rank arrays travel as int64 or float buffers
through the communicator's gather, scatter and broadcast; nothing is pickled.
"""

from __future__ import annotations

import numpy as np

from npddp.checkpoint.fileformat import Checkpoint
from npddp.checkpoint.stateful import ModelState, RunInfo, TrainState


def _row(array) -> np.ndarray:
    """A hook state array as a contiguous array of at least one dimension."""
    return np.ascontiguousarray(np.atleast_1d(array))


def _names(comm, names: list[str]) -> list[str]:
    """Rank 0's list of names on every rank (as int32 characters, no pickling)."""
    raw = np.frombuffer("\n".join(names).encode(), dtype=np.uint8).astype(np.int32) if comm.rank == 0 else None
    size = np.array([0 if raw is None else raw.size], dtype=np.int64)
    comm.broadcast(size, root=0)
    text = raw if raw is not None else np.zeros(int(size[0]), dtype=np.int32)
    comm.broadcast(text, root=0)
    decoded = bytes(text.astype(np.uint8)).decode()
    return decoded.split("\n") if decoded else []


def _gathered(comm, array: np.ndarray, per_rank: bool):
    """Root: ``(size, *shape)`` stack of every rank's ``array`` (per_rank) or a copy of its own."""
    if per_rank:
        return comm.gather(np.ascontiguousarray(array), root=0)
    return np.array(array, copy=True) if comm.rank == 0 else None


def collect(comm, model: ModelState, optim, train: TrainState, info: RunInfo) -> Checkpoint | None:
    """Gather this step's state of ``model``, ``optim`` and ``train``; the Checkpoint on rank 0, None elsewhere.

    Collective: every rank calls it at the same step. Parameters and optimizer buffers are
    stored once (rank 0's), or per rank when ``model.per_rank`` (local SGD: replicas differ);
    dropout streams and comm hook state always per rank.
    """
    per_rank = model.per_rank and comm.size > 1
    mine = model.state_dict()
    params = {name: _gathered(comm, value, per_rank) for name, value in mine["params"].items()}
    opt = {k: _gathered(comm, v, per_rank) if isinstance(v, np.ndarray) and v.ndim else v
           for k, v in optim.state_dict().items()}
    dropout = None
    if mine["dropout"] is not None:
        dropout = comm.gather(mine["dropout"].view(np.int64), root=0)        # (size, n_dropout, 6)
    arrays = mine["hooks"]
    hook_state = {name: comm.gather(_row(arrays[name]), root=0) for name in sorted(arrays)}  # (size, ...)
    if comm.rank != 0:
        return None
    where = train.state_dict()
    world = model.replicas or comm.size
    return Checkpoint(epochs_done=where["epochs_done"], batches_done=where["batches_done"], step=where["step"],
                      world_size=world, backend=info.backend, config=info.config, params=params,
                      optimizer=opt, optimizer_name=info.optimizer, per_rank=per_rank,
                      dropout_rng=None if dropout is None else dropout.view(np.uint64)[:world],
                      hook_state=hook_state, totals=where["totals"], totals_columns=where["columns"],
                      attrs=info.attrs, input_shape=tuple(int(v) for v in info.input_shape),
                      num_classes=int(info.num_classes))


_DTYPES = ("float16", "float32", "float64", "int32", "int64")


def restore(comm, ckpt: Checkpoint | None, model: ModelState, optim, train: TrainState) -> dict:
    """Load rank 0's ``ckpt`` into every rank's ``model``, ``optim`` and ``train`` (collective).

    ``ckpt`` is only read on rank 0 (and must fit the objects: :func:`npddp.checkpoint.saveload.misfit`).
    Returns the checkpoint's ``world_size`` and ``fresh``: the per-rank state that could not be
    restored (another world size).
    """
    epochs_done, batches_done, step, saved_size, per_rank, has_dropout, n_hook = _shared_head(comm, ckpt)
    same = saved_size == comm.size
    root = comm.rank == 0
    for name, p in model.named:
        _place(comm, ckpt.params[name] if root else None, p.data, bool(per_rank) and same, bool(per_rank))
    if optim is not None:
        _restore_optimizer(comm, ckpt, optim, bool(per_rank), same)
    fresh, loaded = [], {"steps": step}
    if has_dropout and same:
        loaded["dropout"] = _scattered_dropouts(comm, ckpt, len(model.dropouts))
    elif model.dropouts:
        fresh.append("dropout streams")
    if n_hook and same and model.hooks is not None:
        loaded["hooks"] = _scattered_hook_state(comm, ckpt)
    elif n_hook:
        fresh.append("comm hook state")
    model.load_state_dict(loaded)
    train.load_state_dict({"epochs_done": epochs_done, "batches_done": batches_done, "step": step,
                           "totals": _shared_totals(comm, ckpt)})
    return {"world_size": saved_size, "fresh": fresh}


def _shared_head(comm, ckpt: Checkpoint | None) -> tuple[int, ...]:
    """Rank 0's position, world size and what the checkpoint holds, on every rank."""
    head = np.zeros(7, dtype=np.int64)
    if comm.rank == 0:
        head[:] = [ckpt.epochs_done, ckpt.batches_done, ckpt.step, ckpt.world_size, ckpt.per_rank,
                   ckpt.dropout_rng is not None, len(ckpt.hook_state)]
    comm.broadcast(head, root=0)
    return tuple(int(v) for v in head)


def _place(comm, saved, target: np.ndarray, scatter: bool, stacked: bool) -> None:
    """Copy a saved array into ``target`` on every rank: each its own row (``scatter``) or rank 0's copy."""
    root = comm.rank == 0
    if scatter:
        stack = np.asarray(saved) if root else np.empty((comm.size,) + target.shape, target.dtype)
        np.copyto(target, comm.scatter(np.ascontiguousarray(stack, dtype=target.dtype), root=0))
        return
    if root:
        np.copyto(target, np.asarray(saved)[0] if stacked else saved)
    comm.broadcast(target, root=0)


def _restore_optimizer(comm, ckpt: Checkpoint | None, optimizer, per_rank: bool, same: bool) -> None:
    """The optimizer's buffers and scalars from rank 0's checkpoint, in sorted key order on every rank."""
    root = comm.rank == 0
    state = optimizer.state_dict()
    for key in sorted(state):
        value = state[key]
        if isinstance(value, np.ndarray) and value.ndim:
            _place(comm, ckpt.optimizer[key] if root else None, value, per_rank and same, per_rank)
            continue
        kind = np.int64 if key == "step" or isinstance(value, (bool, np.bool_)) else np.float64
        box = np.array([ckpt.optimizer[key] if root else 0], dtype=kind)
        comm.broadcast(box, root=0)
        state[key] = np.int64(box[0]) if key == "step" else type(value)(box[0].item())
    optimizer.load_state_dict(state)


def _scattered_dropouts(comm, ckpt: Checkpoint | None, n: int) -> np.ndarray:
    """This rank's (n, 6) uint64 dropout stream words from the checkpoint's (same world size)."""
    stack = ckpt.dropout_rng.view(np.int64) if comm.rank == 0 else np.empty((comm.size, n, 6), np.int64)
    return comm.scatter(np.ascontiguousarray(stack), root=0).view(np.uint64)


def _scattered_hook_state(comm, ckpt: Checkpoint | None) -> dict:
    """Each rank's own comm hook arrays from the checkpoint's (same world size), by name."""
    root = comm.rank == 0
    loaded = {}
    for name in _names(comm, sorted(ckpt.hook_state) if root else []):
        saved = np.ascontiguousarray(ckpt.hook_state[name]) if root else None
        head = np.zeros(9, dtype=np.int64)   # dtype code, ndim, shape (up to 7 axes)
        if root:
            head[:2] = [_DTYPES.index(saved.dtype.name), saved.ndim]
            head[2:2 + saved.ndim] = saved.shape
        comm.broadcast(head, root=0)
        shape = tuple(int(v) for v in head[2:2 + int(head[1])])
        src = saved if root else np.empty(shape, dtype=_DTYPES[int(head[0])])
        loaded[name] = comm.scatter(src, root=0)
    return loaded


def _shared_totals(comm, ckpt: Checkpoint | None) -> np.ndarray:
    """Rank 0's running sums of the epoch in progress, on every rank."""
    root = comm.rank == 0
    totals = np.array(ckpt.totals if root else np.zeros(0), dtype=np.float64)
    size = np.array([totals.size], dtype=np.int64)
    comm.broadcast(size, root=0)
    totals = totals if root else np.zeros(int(size[0]))
    comm.broadcast(totals, root=0)
    return totals
