"""ZeRO stage 1: :class:`ZeroRedundancyOptimizer`, each rank keeping and stepping the state of its own parameters.

PyTorch's semantics: parameters are partitioned whole over the ranks, greedily by size
(:func:`~npddp.parallel.zero.partition.partition_parameters`); every rank builds the wrapped
optimizer over its own parameters only, so its state (AdamW's two moments) exists once in the
job instead of once per rank. ``step()`` updates the local parameters, then every rank's
updated parameters travel to all others (one broadcast per rank of a packed buffer). The
gradients must already be averaged over ranks (DDP's job). ``state_dict()`` works only after
``consolidate_state_dict(to)`` on every rank, and only on rank ``to``; its layout is exactly
the wrapped optimizer's over all parameters, so a checkpoint does not depend on sharding.
"""

from __future__ import annotations

import numpy as np

from npddp.nn.parameter import Parameter
from npddp.optim import Wrapping
from npddp.parallel.zero.partition import partition_parameters


class ZeroRedundancyOptimizer(Wrapping):
    """Wrap ``optimizer_class(params, **defaults)``; each rank holds the state of its partition only."""

    def __init__(self, params, optimizer_class, comm, **defaults):
        params = list(params)
        if not params:
            raise ValueError("ZeroRedundancyOptimizer: got an empty parameter list")
        for i, p in enumerate(params):
            if not isinstance(p, Parameter):
                raise TypeError(f"ZeroRedundancyOptimizer: params[{i}] is {type(p).__name__}, not a Parameter")
        self.params, self.comm = params, comm
        self.partition = partition_parameters([p.data.size for p in params], comm.size)  # rank -> indices
        self.owner = [0] * len(params)
        for r, ids in enumerate(self.partition):
            for i in ids:
                self.owner[i] = r
        mine = [params[i] for i in self.partition[comm.rank]]
        self._placeholder = not mine  # more ranks than parameters: step an empty one
        self.optim = optimizer_class(mine or [Parameter(np.zeros(0, dtype=params[0].dtype))], **defaults)
        self._packs = [self._pack_buffers(ids) for ids in self.partition]  # rank -> {dtype: (n,)}
        self._consolidated: dict | None = None
        self._consolidated_to: int | None = None

    def _pack_buffers(self, ids: list[int]) -> dict:
        """One flat buffer per dtype for the parameters ``ids`` of one rank."""
        totals: dict = {}
        for i in ids:
            dt = self.params[i].data.dtype
            totals[dt] = totals.get(dt, 0) + self.params[i].data.size
        return {dt: np.empty(n, dtype=dt) for dt, n in totals.items()}

    # --- the optimizer's face ---------------------------------------------------------------
    @property
    def buffers(self) -> tuple:
        """The wrapped optimizer's per-parameter state buffers (``exp_avg``, ...), as in :meth:`state_dict`'s keys."""
        return tuple(self.optim.buffers)

    def zero_grad(self) -> None:
        """Zero every parameter's gradient (all of them, not only this rank's)."""
        for p in self.params:
            p.zero_grad()

    def step(self) -> None:
        """Update this rank's parameters, then give every rank everyone's updated values."""
        self.optim.step()
        self._consolidated = None
        if self.comm.size == 1:
            return
        for r, ids in enumerate(self.partition):
            for dt, flat in self._packs[r].items():
                members = [self.params[i] for i in ids if self.params[i].data.dtype == dt]
                if r == self.comm.rank:
                    _pack(members, flat)
                self.comm.broadcast(flat, root=r)
                if r != self.comm.rank:
                    _unpack(flat, members)

    # --- checkpoints --------------------------------------------------------------------------
    def consolidate_state_dict(self, to: int = 0) -> None:
        """Collective: gather the whole optimizer state on rank ``to`` (then call :meth:`state_dict` there)."""
        from npddp.comm.checks import check_rank
        to = check_rank(to, self.comm.size, "to")
        local = self.optim.state_dict()
        buffers = self.optim.buffers
        full = {k: v for k, v in local.items() if not _is_buffer(k, buffers)}
        rank = self.comm.rank
        for b in buffers:
            for i, p in enumerate(self.params):
                owner = self.owner[i]
                if owner == rank:
                    arr = local[f"{b}.{self.partition[rank].index(i)}"]
                    if rank == to:
                        full[f"{b}.{i}"] = arr
                    else:
                        self.comm.send(arr, to, tag=_TAG)
                elif rank == to:
                    full[f"{b}.{i}"] = self.comm.recv(np.empty_like(p.data), owner, tag=_TAG)
        self._consolidated = full if rank == to else None
        self._consolidated_to = to

    def state_dict(self) -> dict:
        """The consolidated state, in the wrapped optimizer's own layout over all parameters (rank ``to`` only)."""
        if self._consolidated is None:
            where = ("" if self._consolidated_to is None or self._consolidated_to == self.comm.rank
                     else f" (it was consolidated to rank {self._consolidated_to}, this is rank {self.comm.rank})")
            raise RuntimeError("ZeroRedundancyOptimizer.state_dict: the optimizer state has not been consolidated on "
                               f"this rank{where}; call consolidate_state_dict(to=RANK) on every rank after the last "
                               "step, then state_dict() on rank RANK")
        return dict(self._consolidated)

    def template_state_dict(self) -> dict:
        """The keys, shapes and dtypes of :meth:`state_dict` (arrays zero), on any rank, without communication."""
        local = self.optim.state_dict()
        full = {k: v for k, v in local.items() if not _is_buffer(k, self.optim.buffers)}
        for b in self.optim.buffers:
            for i, p in enumerate(self.params):
                full[f"{b}.{i}"] = np.zeros(p.data.shape, dtype=p.data.dtype)
        return full

    def load_state_dict(self, d: dict) -> None:
        """Load a whole-model state dict (as :meth:`state_dict` gives, on every rank): keep this rank's part."""
        buffers = self.optim.buffers
        local = {k: v for k, v in d.items() if not _is_buffer(k, buffers)}
        expected = {f"{b}.{i}" for b in buffers for i in range(len(self.params))}
        got = {k for k in d if _is_buffer(k, buffers)}
        if got != expected:
            raise ValueError(f"ZeroRedundancyOptimizer.load_state_dict: buffer keys do not match {len(self.params)} "
                             f"parameters; missing {sorted(expected - got)[:4]}, unexpected {sorted(got - expected)[:4]}")
        ids = self.partition[self.comm.rank]
        for b in buffers:
            for j, i in enumerate(ids):
                local[f"{b}.{j}"] = d[f"{b}.{i}"]
            if self._placeholder:
                local[f"{b}.0"] = self.optim.state[b][0]
        self.optim.load_state_dict(local)
        self._consolidated = None

    def local_state_bytes(self) -> int:
        """Bytes of optimizer state held by this rank."""
        return sum(a.nbytes for arrays in self.optim.state.values() for a in arrays)


_TAG = 7  # user tag of the consolidation messages


def _is_buffer(key: str, buffers) -> bool:
    """True for a per-parameter state key such as ``exp_avg.3``."""
    head, _, tail = key.rpartition(".")
    return head in buffers and tail.isdigit()


def _pack(params, flat: np.ndarray) -> None:
    """Copy the parameters' values into ``flat``, one after another."""
    offset = 0
    for p in params:
        flat[offset:offset + p.data.size] = p.data.reshape(-1)
        offset += p.data.size


def _unpack(flat: np.ndarray, params) -> None:
    """Copy ``flat`` back into the parameters' values."""
    offset = 0
    for p in params:
        p.data.reshape(-1)[...] = flat[offset:offset + p.data.size]
        offset += p.data.size
