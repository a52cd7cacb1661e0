"""A split model's checkpoint as the whole model's: shards assembled for writing, sliced again on reading.

A model split by tensor and pipeline parallelism holds, on each rank, some of the full model's
parameters, whole or as a block of rows or columns (``shard_indices``). :func:`assemble` builds
each full array on rank 0: every rank fills the part it writes into zeros of the full shape
and one all-reduce (sum) over the world adds them (exactly: one rank writes each element, the
rest add zeros). So the file is the ordinary whole-model checkpoint, which every reader takes
(``npddp.evaluate``, ``npddp.generate``, ``load_model``) and any layout resumes. :class:`Pieces`
says where each full parameter's part lives; :meth:`Pieces.slice_into` puts full arrays back
into this rank's shards. The cost: one full parameter at a time on every rank while saving
(rank 0 keeps the whole model and optimizer state); the whole model and its optimizer state on
every rank while resuming. Collective where noted; nothing is pickled.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np


class Pieces:
    """Which part of each full parameter this rank holds, and whether its copy is the one written.

    ``full``: the full model's ``(name, shape, dtype)`` in order. ``local``: this rank's
    ``(full name, Parameter)``; ``shards``: ``full name -> (axis, indices)`` for split ones.
    ``writes(name)``: this rank's copy counts (one rank per element: callers pick it).
    """

    def __init__(self, full, local, shards: dict, writes):
        self.full = [(n, tuple(s), np.dtype(d)) for n, s, d in full]
        self.local = {name: p for name, p in local}
        self.shards, self.writes = dict(shards), writes

    def piece(self, name: str, full: np.ndarray) -> np.ndarray:
        """This rank's part of the full array ``full`` of parameter ``name``."""
        if name in self.shards:
            axis, idx = self.shards[name]
            return np.take(full, idx, axis=axis)
        return full

    def place(self, name: str, part: np.ndarray, into: np.ndarray) -> None:
        """Write this rank's ``part`` of ``name`` into the full-shaped ``into``."""
        if name in self.shards:
            axis, idx = self.shards[name]
            index = [slice(None)] * into.ndim
            index[axis] = idx
            into[tuple(index)] = part
        else:
            into[...] = part

    def slice_into(self, full: dict) -> None:
        """Copy each local parameter's part of ``full[name]`` into it."""
        for name, p in self.local.items():
            np.copyto(p.data, self.piece(name, np.asarray(full[name])))


def assemble(comm, pieces: Pieces, local: dict) -> dict:
    """Full arrays by name on rank 0 (None elsewhere) from every rank's ``local[name]`` parts (collective)."""
    out = {}
    for name, shape, dtype in pieces.full:
        buf = np.zeros(shape, dtype)
        if name in local and pieces.writes(name):
            pieces.place(name, local[name], buf)
        buf = comm.allreduce(buf)
        out[name] = buf if comm.rank == 0 else None
    return out


def whole_parameters(comm, pieces: Pieces) -> list:
    """``(name, holder of .data)`` of the full model for :func:`state.collect` (collective; data on rank 0)."""
    full = assemble(comm, pieces, {n: p.data for n, p in pieces.local.items()})
    return [(name, SimpleNamespace(data=full[name])) for name, _, _ in pieces.full]


def _index(optimizer, pieces: Pieces) -> list[str]:
    """The full name of each of ``optimizer``'s parameters, in its order."""
    names = {id(p): n for n, p in pieces.local.items()}
    return [names[id(p)] for p in _holder(optimizer).params]


def _holder(optimizer):
    """The optimizer that names the parameters and buffers: a ZeRO-1 optimizer under the CLI's checkpoint wrapper."""
    return getattr(optimizer, "sharded", optimizer)


class WholeOptimizerState:
    """An optimizer's state in the full model's parameter order: ``state_dict`` for saving, or a template
    and ``load_state_dict`` (slicing into this rank's optimizer) for resuming.

    Under ZeRO-1 the optimizer's ``state_dict`` gathers the stage's state on the first data
    replica, the one whose copy is written; elsewhere it is zeros, which no rank writes.
    """

    def __init__(self, comm, pieces: Pieces, optimizer, gather: bool):
        self.pieces, self.optimizer = pieces, optimizer
        state = optimizer.state_dict()
        order = _index(optimizer, pieces)
        full_index = {n: j for j, (n, _, _) in enumerate(pieces.full)}
        buffers = _holder(optimizer).buffers
        self.keys = {f"{b}.{full_index[n]}": (f"{b}.{i}", n) for b in buffers for i, n in enumerate(order)}
        self.state = {k: v for k, v in state.items() if not (isinstance(v, np.ndarray) and v.ndim)}
        for b in buffers:
            full = (assemble(comm, pieces, {n: state[f"{b}.{i}"] for i, n in enumerate(order)}) if gather
                    else {n: np.zeros(s, d) for n, s, d in pieces.full})
            for j, (n, _, d) in enumerate(pieces.full):
                self.state[f"{b}.{j}"] = full[n] if full[n] is not None else np.zeros(0, d)

    def state_dict(self) -> dict:
        """The full-order state (saving: assembled on rank 0; resuming: zeros of the full shapes)."""
        return dict(self.state)

    def load_state_dict(self, d: dict) -> None:
        """Slice the full-order state ``d`` into this rank's optimizer."""
        local = {k: v for k, v in d.items() if not (isinstance(v, np.ndarray) and v.ndim)}
        for key, (local_key, name) in self.keys.items():
            local[local_key] = self.pieces.piece(name, np.asarray(d[key])).copy()
        self.optimizer.load_state_dict(local)


class RngHolder:
    """A stand-in Dropout for :func:`state.collect`: six PCG64 words."""

    def __init__(self, words: np.ndarray):
        self.words = words

    def get_rng_state(self) -> np.ndarray:
        return self.words


def whole_dropout_states(comm, dropouts, owned) -> list[RngHolder]:
    """Every dropout stream's words as its owner (``owned[j]``: this rank writes stream j) holds them (collective)."""
    if not dropouts:
        return []
    words = np.zeros((len(dropouts), 6), np.int64)
    for j, d in enumerate(dropouts):
        if owned[j]:
            words[j] = d.get_rng_state().view(np.int64)
    words = comm.allreduce(words)
    return [RngHolder(w.view(np.uint64)) for w in words]
