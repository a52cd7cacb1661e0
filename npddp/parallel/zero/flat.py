"""A flat group of parameters split into equal shards over the ranks: the unit of ZeRO stages 2 and 3.

A group is a run of parameters of one dtype (cut like DDP's buckets, in reverse parameter
order). Its values and gradients live in two flat buffers padded to a multiple of the world
size, so shard r is elements ``[r*s, (r+1)*s)`` of both, with ``s = padded / size``; every
``p.data`` and ``p.grad`` is a view into them (the padding is zero and stays zero). The
rank's :attr:`shard` is a Parameter whose ``data`` is its slice of the values and whose
``grad`` is a separate buffer of ``s`` elements: the optimizer steps it, elementwise, exactly
as it would step the whole parameters.

* reduce: ``ireduce_scatter(grads, "avg", out=shard.grad)``: the average of the rank's shard;
* gather: ``iallgather(shard.data, out=values)``, in place (the shard is the rank's own row);
* with sharded gradients (ZeRO-2 and 3 over more than one rank) the full gradients exist only
  from the first backward that needs them (:meth:`ensure_grads`) until their reduction has
  completed; between uses every ``p.grad`` reads as a read-only array of zeros that occupies no
  memory. On one rank the shard is the whole group, so ZeRO-2's ``p.grad`` are views into the
  shard's gradient itself and the reduction is nothing (the memory of DDP);
* ZeRO-3 also frees the values between uses (:meth:`release`): every ``p.data`` then reads as
  zeros that occupy no memory, and :meth:`start_gather` brings them back.
"""

from __future__ import annotations

import numpy as np

from npddp.nn.parameter import Parameter


class BufferPool:
    """A few freed ZeRO-3 buffers kept for reuse, so gathering does not fault in fresh pages every time."""

    __slots__ = ("_free", "keep")

    def __init__(self, keep: int = 2):
        self._free: list[np.ndarray] = []
        self.keep = keep

    def take(self, n: int, dtype) -> np.ndarray:
        """A ``(n,)`` array of ``dtype`` (contents undefined): a kept one if one fits exactly, else a new one."""
        for i, a in enumerate(self._free):
            if a.size == n and a.dtype == dtype:
                return self._free.pop(i)
        return np.empty(n, dtype=dtype)

    def give(self, a: np.ndarray) -> None:
        """Keep ``a`` for reuse (the oldest kept one is dropped beyond ``keep``)."""
        self._free.append(a)
        if len(self._free) > self.keep:
            self._free.pop(0)


class FlatGroup:
    """Parameters of one dtype as padded flat values and gradients, with this rank's shard."""

    __slots__ = ("index", "params", "comm", "numel", "padded", "shard_size", "offsets", "values", "grads",
                 "shard", "reports", "pending", "work", "gather_work", "live", "reduced", "_owned", "_dtype", "pool", "_sharded_grads")

    def __init__(self, index: int, params: list[Parameter], comm, sharded_values: bool = False, pool=None,
                 sharded_grads: bool | None = None, source=None):
        self.index, self.params, self.comm = index, params, comm
        self.pool = BufferPool() if pool is None else pool
        size, rank = comm.size, comm.rank
        dtype = self._dtype = params[0].data.dtype
        self.numel = sum(p.data.size for p in params)
        self.shard_size = -(-self.numel // size)
        self.padded = self.shard_size * size
        self.offsets = np.cumsum([0] + [p.data.size for p in params]).tolist()
        values = np.zeros(self.padded, dtype=dtype)        # (padded,)
        for p, lo in zip(params, self.offsets):   # source: a ShardedInit's regrouping (collective)
            values[lo:lo + p.data.size] = p.data.reshape(-1) if source is None else source(p)
        mine = slice(rank * self.shard_size, (rank + 1) * self.shard_size)
        self.grads = None
        self._sharded_grads = (size > 1 or sharded_values) if sharded_grads is None else sharded_grads
        if sharded_values:   # ZeRO-3: only the shard is kept; values and gradients exist while needed
            self._owned = values[mine].copy()               # (shard_size,)
            self.values = None
            del values
            for p in params:
                p.data = _absent(p.data.shape, dtype)
        else:
            self._owned, self.values = None, values
            self._bind(values)
        self.shard = Parameter(self._owned if sharded_values else values[mine])
        if self._sharded_grads:   # gradients start as zeros that occupy no memory; a backward gets real ones
            for p in params:
                p.grad = _absent(p.data.shape, dtype)
        else:                     # one rank, values kept: every p.grad a view into the shard's gradient (the group)
            self.grads = self.shard.grad                    # (padded,)
            for p, lo in zip(params, self.offsets):
                self.grads[lo:lo + p.data.size] = p.grad.reshape(-1)
                p.grad = self.grads[lo:lo + p.data.size].reshape(p.data.shape)
        self.reports = self.pending = len(params)
        self.work = self.gather_work = None
        self.live = not sharded_values
        self.reduced = False

    @property
    def dtype(self):
        """The group's dtype."""
        return self._dtype

    @property
    def buffer(self) -> np.ndarray:
        """The flat gradients (what DDP calls a bucket's buffer; ZeRO-3 between backwards: zeros, no memory)."""
        return self.grads if self.grads is not None else _absent((self.padded,), self._dtype)

    def _bind(self, values: np.ndarray) -> None:
        """Make every ``p.data`` a view into ``values``."""
        for p, lo in zip(self.params, self.offsets):
            p.data = values[lo:lo + p.data.size].reshape(p.data.shape)

    # --- gradients ---------------------------------------------------------------------------
    def ensure_grads(self) -> None:
        """Sharded gradients: give the parameters full gradients, zero by ``zero_grad``, for a backward to write."""
        if self.grads is None:
            self.grads = self.pool.take(self.padded, self._dtype)
            self.grads[self.numel:] = 0                       # the padding; the rest is written or settled
            for p, lo in zip(self.params, self.offsets):
                p.grad = self.grads[lo:lo + p.data.size].reshape(p.data.shape)
                p.zero_grad()                                 # lazily: the backward overwrites, a read settles

    def drop_grads(self) -> None:
        """Sharded gradients: free the full ones (once reduced into the shard); ``p.grad`` reads as zeros."""
        if not self._sharded_grads:
            return
        if self.grads is not None:
            self.pool.give(self.grads)
        self.grads = None
        for p in self.params:
            p.grad = _absent(p.data.shape, self._dtype)

    def start_reduce(self) -> None:
        """Begin reducing the gradients into this rank's shard (one rank, values kept: they are the shard already)."""
        self.ensure_grads()
        for p in self.params:     # a parameter no layer wrote since zero_grad sends zeros
            p.settle()
        if self.grads is self.shard.grad:
            self.work = _DONE
        else:
            self.work = self.comm.ireduce_scatter(self.grads, "avg", out=self.shard.grad)   # summed, scaled by 1/N once

    def finish_reduce(self) -> None:
        """Wait for the reduction: the shard's gradient is the average over ranks (sharded: full ones freed)."""
        self.work.wait()
        self.work = None
        self.reduced = True
        self.drop_grads()

    # --- values ------------------------------------------------------------------------------
    def start_gather(self) -> None:
        """Begin bringing every rank's shard into the full values (ZeRO-3: into a fresh buffer)."""
        if self.gather_work is not None or (self.live and self._owned is not None):
            return
        if self._owned is not None:
            self.values = self.pool.take(self.padded, self._dtype)
            rows = self.values.reshape(self.comm.size, -1)
            rows[self.comm.rank] = self._owned
            self.gather_work = self.comm.iallgather(rows[self.comm.rank], out=rows)
        else:
            self.gather_work = self.comm.iallgather(self.shard.data, out=self.values.reshape(self.comm.size, -1))

    def finish_gather(self) -> None:
        """Wait for the gather started by :meth:`start_gather` (if any); the values are usable after it."""
        if self.gather_work is not None:
            self.gather_work.wait()
            self.gather_work = None
            if self._owned is not None:
                self._bind(self.values)
                self.live = True

    def keep_values(self) -> None:
        """ZeRO-3: make this rank's shard of the live values its master copy (after they were written)."""
        if self._owned is not None and self.live:
            rank, n = self.comm.rank, self.shard_size
            np.copyto(self._owned, self.values[rank * n:(rank + 1) * n])

    def release(self) -> None:
        """ZeRO-3: drop the gathered values; ``p.data`` reads as zeros that occupy no memory."""
        if self._owned is None or not self.live:
            return
        for p in self.params:
            p.data = _absent(p.data.shape, self._dtype)
        self.pool.give(self.values)
        self.values = None
        self.live = False

    def state_pieces(self, flat: np.ndarray) -> list[np.ndarray]:
        """Split a gathered ``(padded,)`` array into this group's parameters' shapes (views)."""
        return [flat[lo:lo + p.data.size].reshape(p.data.shape) for p, lo in zip(self.params, self.offsets)]


class _Done:
    """The work of a reduction that had nothing to do (one rank, the gradients already the shard's)."""

    __slots__ = ()

    def test(self) -> bool:
        """Always complete."""
        return True

    def wait(self) -> None:
        """Nothing to wait for."""


_DONE = _Done()


def _absent(shape, dtype) -> np.ndarray:
    """A read-only array of zeros of ``shape`` that occupies no memory (a freed value or gradient)."""
    return np.broadcast_to(np.zeros((), dtype=dtype), shape)
