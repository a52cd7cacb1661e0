"""Training state over the communicator: gathered for a checkpoint, restored from one.

:func:`collect` gathers every rank's state into a :class:`~npddp.train.checkpoint.Checkpoint` on rank
0; :func:`restore` puts rank 0's checkpoint back into every rank's model, optimizer, DDP and
dropout streams. Both are collective. Per-rank arrays travel as int64 or float buffers
through the communicator's gather, scatter and broadcast; nothing is pickled.
"""

from __future__ import annotations

import numpy as np

from npddp.train.checkpoint import Checkpoint


def _gathered(comm, array: np.ndarray, per_rank: bool):
    """Root: ``(size, *shape)`` stack of every rank's ``array`` (per_rank) or a copy of its own."""
    if per_rank:
        return comm.gather(np.ascontiguousarray(array), root=0)
    return np.array(array, copy=True) if comm.rank == 0 else None


def collect(comm, *, named_params, optimizer, ddp, dropouts, position: tuple[int, int, int],
            totals: np.ndarray, totals_columns, config: dict, backend: str,
            optimizer_name: str, attrs: dict, input_shape=(), num_classes: int = 0) -> Checkpoint | None:
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
                      totals_columns=tuple(totals_columns), attrs=attrs,
                      input_shape=tuple(int(v) for v in input_shape), num_classes=int(num_classes))



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
