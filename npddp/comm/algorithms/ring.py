"""Ring all-reduce: a ring reduce-scatter, then a ring all-gather, as a non-blocking state machine.

The schedule. The vector is cut into ``size`` blocks as ``np.array_split`` cuts it. A ring pass
has ``2 (N-1)`` steps; in step s rank r sends block ``r - s - 1`` to its right neighbour and
receives block ``r - s - 2`` from its left (:func:`ring_blocks`). In the first ``N - 1`` steps
(the reduce-scatter) it adds what it receives to its own partial of that block, so after them
rank r holds block ``r`` fully reduced; in the last ``N - 1`` (the all-gather) it passes the
reduced blocks on, copying what it receives. Every element is reduced at exactly one place and
only copied afterwards, so every rank ends with the same bits. For ``op="avg"`` each chunk of
the last reduce step (the rank's own block) is scaled by 1/N as soon as it is reduced. Bandwidth-optimal (each rank
sends ``2 (N-1)/N`` of the vector) but ``2 (N-1)`` steps long. The blocking ``reduce_scatter``
and ``allgather`` of every hand-written communicator run the first or the second half of the
same schedule (:class:`RingPlan` with ``phase``).

The state machine. Each step's block is cut into ``nchunk`` chunks of at most ``chunk_bytes``;
a *unit* is one chunk of one step, numbered ``u = step * nchunk + chunk`` (``2 (N-1) nchunk``
units for an all-reduce). Four counters describe the whole state:

* ``nsent``: sends posted. Unit u's send forwards what unit ``u - nchunk`` received (reduced,
  in the first half), so it may start once ``ndone > u - nchunk``; the first ``nchunk`` units
  send the rank's own data.
* ``nposted``: receives posted, at most ``window`` ahead of ``ndone``. Reduce-scatter receives
  land in a scratch slot; all-gather receives land in the result directly, but in an all-reduce
  only once the send that read that region has completed.
* ``ndone``: receives completed (and, in the first half, reduced into the result).
* ``nsent_done``: sends completed, in order.

``_advance`` posts everything the counters allow, then completes the oldest receive, and
repeats; non-blocking, it returns as soon as that receive has not arrived yet.

A blocking call whose pass has one chunk per step (:meth:`Ring.run`, taken when no other call of
the communicator is in flight) runs the steps one after another instead, with the same messages
in the same order and no state machine: a small call's cost is then its messages and adds.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from npddp.comm import checks as c
from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.engine.call import Context
from npddp.comm.engine.cost import Cost
from npddp.comm.engine.work import P2PWork

_PLAN_CACHE_SIZE = 64
#: Which part of the ring pass a plan runs.
PHASES = ("allreduce", "reduce_scatter", "allgather")


def ring_blocks(rank: int, size: int, step: int) -> tuple[int, int]:
    """(block sent, block received) by ``rank`` at ``step`` of a ring pass (0 .. 2N-3; the all-gather starts at N-1)."""
    return (rank - step - 1) % size, (rank - step - 2) % size


class RingPlan:
    """Per-unit slices of one rank's part of a ring pass over ``n`` elements; unit ``u`` is chunk ``u % nchunk``.

    ``phase``: ``allreduce`` (both halves), ``reduce_scatter`` (the first: partials land in the
    result, block ``rank`` ends reduced) or ``allgather`` (the second: block ``rank`` is the
    rank's own, the others arrive). ``reduce_units``: units that reduce what they receive;
    ``scratch[u]`` is where reduce-scatter unit u lands: slot ``u % window``.
    """

    __slots__ = ("phase", "nchunk", "nunits", "reduce_units", "window", "send", "recv", "scratch", "scratch_elems",
                 "own")

    def __init__(self, n: int, size: int, rank: int, chunk_elems: int, window: int, phase: str = "allreduce"):
        bounds = c.block_bounds(n, size).tolist()
        self.phase = phase
        self.nchunk = nchunk = max(1, -(-(bounds[1] - bounds[0]) // chunk_elems))  # block 0 is the largest
        half = (size - 1) * nchunk
        first = half if phase == "allgather" else 0           # the first unit of the pass this plan runs
        self.nunits = 2 * half if phase == "allreduce" else half
        self.reduce_units = 0 if phase == "allgather" else half
        self.window = window = max(1, min(window, self.reduce_units or self.nunits))
        units = range(first, first + self.nunits)
        self.send = [_chunk(bounds, ring_blocks(rank, size, u // nchunk)[0], u % nchunk, nchunk) for u in units]
        self.recv = [_chunk(bounds, ring_blocks(rank, size, u // nchunk)[1], u % nchunk, nchunk) for u in units]
        slot = max((r.stop - r.start for r in self.recv), default=0)
        self.scratch = [slice((u % window) * slot, (u % window) * slot + r.stop - r.start)
                        for u, r in enumerate(self.recv[:self.reduce_units])]
        self.scratch_elems = window * slot if self.reduce_units else 0
        self.own = slice(bounds[rank], bounds[rank + 1])     # the block this rank reduces (or owns)


def _chunk(bounds: list[int], block: int, j: int, nchunk: int) -> slice:
    """Slice of chunk ``j`` of ``nchunk`` of block ``block``."""
    lo, length = bounds[block], bounds[block + 1] - bounds[block]
    return slice(lo + length * j // nchunk, lo + length * (j + 1) // nchunk)


class Ring:
    """The ring all-reduce of one communicator: cached plans, one state machine per call."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self._plans: dict[tuple, RingPlan] = {}

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: float | None = None) -> Cost:
        """``2 (N-1)`` steps per chunk, ``2 (N-1)/N`` of the vector sent and ``(N-1)/N`` reduced."""
        share = (size - 1) / size
        chunks = 1 if chunk_bytes is None else max(1, math.ceil(nbytes / size / chunk_bytes))
        return Cost(2 * (size - 1) * chunks, 2 * share * nbytes, share * nbytes)

    def plan(self, n: int, itemsize: int, phase: str = "allreduce") -> RingPlan:
        """The (cached) plan for ``n`` elements of ``itemsize`` bytes at the context's chunk size and window."""
        ctx = self.ctx
        key = (n, max(1, ctx.chunk_bytes // itemsize), ctx.window, phase)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= _PLAN_CACHE_SIZE:
                del self._plans[next(iter(self._plans))]
            plan = self._plans[key] = RingPlan(n, ctx.size, ctx.rank, *key[1:])
        return plan

    def start(self, call, src, dst, ufunc, result, phase: str = "allreduce"):
        """Start the state machine for flat ``src`` -> flat ``dst`` (``phase``: which part of the pass)."""
        return RingWork(call, self.ctx, src, dst, ufunc, self.plan(src.size, src.itemsize, phase), result)

    def run(self, call, src, dst, ufunc) -> None:
        """A blocking all-reduce: a pass of one chunk per step runs step by step, each step's receive and send
        completed before the next (the same messages in the same order as :class:`RingWork`'s, with no state
        machine); a longer pass runs the state machine to completion."""
        plan = self.plan(src.size, src.itemsize)
        if plan.nchunk != 1:
            RingWork(call, self.ctx, src, dst, ufunc, plan, dst).wait()
            return
        ctx = self.ctx
        left, right = (ctx.rank - 1) % ctx.size, (ctx.rank + 1) % ctx.size
        pool, half = ctx.scratch, plan.reduce_units
        raw = pool.acquire(plan.scratch_elems * src.itemsize)
        scratch = np.frombuffer(raw, dtype=src.dtype, count=plan.scratch_elems)  # (window * slot,)
        scale = call.take_scale()
        try:
            for u in range(half):   # reduce-scatter: what arrives is reduced into this rank's partial
                region, got = dst[plan.recv[u]], scratch[plan.scratch[u]]
                call.exchange(got, (src if u == 0 else dst)[plan.send[u]], left, right)
                ufunc(region if src is dst else src[plan.recv[u]], got, out=region)
            if scale:
                np.multiply(region, scale, out=region)
            for u in range(half, plan.nunits):   # all-gather: the reduced blocks pass on
                call.exchange(dst[plan.recv[u]], dst[plan.send[u]], left, right)
        finally:
            del scratch
            pool.release(raw)


class RingWork(P2PWork):
    """One ring pass in progress (see the module docstring for its four counters)."""

    __slots__ = ("_transport", "_tag", "_left", "_right", "_src", "_dst", "_ufunc", "_plan", "_pool", "_raw",
                 "_scratch", "_nsent", "_nsent_done", "_nposted", "_ndone", "_sends", "_recvs", "_scale")

    def __init__(self, call, ctx: Context, src, dst, ufunc, plan: RingPlan, result):
        super().__init__(call, result)
        self._transport, self._tag = call.transport, call.tag
        self._left, self._right = (ctx.rank - 1) % ctx.size, (ctx.rank + 1) % ctx.size
        self._src, self._dst, self._ufunc, self._plan, self._pool = src, dst, ufunc, plan, ctx.scratch
        self._raw = self._pool.acquire(plan.scratch_elems * src.itemsize)
        self._scratch = np.frombuffer(self._raw, dtype=src.dtype, count=plan.scratch_elems)  # (window * slot,)
        self._nsent = self._nsent_done = self._nposted = self._ndone = 0
        self._sends: deque = deque()
        self._recvs: deque = deque()
        # op avg: the last reduce step's chunks (this rank's block) are scaled as they are reduced,
        # before the all-gather forwards them, so no pass over the result remains
        self._scale = call.take_scale() if plan.phase == "allreduce" else 0.0
        self._start()

    def _sends_complete(self, k: int, block: bool) -> bool:
        """True once the first ``k`` sends have completed."""
        sends = self._sends
        while self._nsent_done < k:
            if block:
                self._call.wait(sends[0])
            elif not sends[0].test():
                return False
            sends.popleft()
            self._nsent_done += 1
        return True

    def _advance(self, block):
        plan, transport, tag, src, dst = self._plan, self._transport, self._tag, self._src, self._dst
        nchunk, nunits, reduce_units, window = plan.nchunk, plan.nunits, plan.reduce_units, plan.window
        guarded = plan.phase == "allreduce"   # all-gather receives overwrite what reduce-scatter sends read
        own = src if reduce_units else dst   # where the first nchunk units' data lies
        sends, recvs = self._sends, self._recvs
        nsent, nposted, ndone = self._nsent, self._nposted, self._ndone
        while True:
            stop = min(ndone + nchunk, nunits)
            while nsent < stop:  # forward what has arrived (the first nchunk units send our own data)
                sends.append(transport.isend((own if nsent < nchunk else dst)[plan.send[nsent]], self._right, tag))
                nsent += 1
            stop = min(ndone + window, nunits)
            while nposted < stop:
                if nposted < reduce_units:
                    target = self._scratch[plan.scratch[nposted]]
                else:
                    v = nposted - reduce_units
                    if guarded and (v >= nsent or not self._sends_complete(v + 1, block)):
                        break
                    target = dst[plan.recv[nposted]]
                recvs.append(transport.irecv(target, self._left, tag))
                nposted += 1
            self._nsent, self._nposted, self._ndone = nsent, nposted, ndone
            if ndone == nunits:
                return self._sends_complete(nunits, block)
            if not recvs:
                return False
            if block:
                self._call.wait(recvs[0])
            elif not recvs[0].test():
                return False
            recvs.popleft()
            if ndone < reduce_units:  # reduce the arrived partial into our block
                region = dst[plan.recv[ndone]]
                self._ufunc(region if src is dst else src[plan.recv[ndone]],
                            self._scratch[plan.scratch[ndone]], out=region)
                if self._scale and ndone >= reduce_units - nchunk:
                    np.multiply(region, self._scale, out=region)
            ndone += 1

    def _requests(self):
        return [(r, self._left) for r in self._recvs], [(r, self._right) for r in self._sends]

    def _release(self):
        self._scratch = None
        self._pool.release(self._raw)
        self._raw = None


class ReduceScatterWork(RingWork):
    """The ring's first half into a pooled partials vector; on completion this rank's block is copied to ``out``."""

    __slots__ = ("_block", "_own", "_partials_raw", "_block_scale")

    def __init__(self, call, ring: Ring, flat, ufunc, out, scale: float = 0.0):
        ctx = ring.ctx
        plan = ring.plan(flat.size, flat.itemsize, "reduce_scatter")
        self._block, self._own, self._block_scale = out, plan.own, scale   # scale: op avg's 1/N, else 0
        self._partials_raw = ctx.scratch.acquire(flat.nbytes)
        partials = np.frombuffer(self._partials_raw, dtype=flat.dtype, count=flat.size)  # (n,)
        super().__init__(call, ctx, flat, partials, ufunc, plan, out)

    def _release(self):
        np.copyto(self._block, self._dst[self._own])
        if self._block_scale:
            np.multiply(self._block, self._block_scale, out=self._block)
        super()._release()
        self._dst = None
        self._pool.release(self._partials_raw)
        self._partials_raw = None


register_algorithm("ring", Ring, auto=True, help="reduce-scatter, then all-gather around a ring")


class RingAllgather(Ring):
    """The ring's second half alone: each rank's block passes around the ring (the all-gather every backend ran)."""

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: float | None = None) -> Cost:
        """``N - 1`` steps per chunk sending ``(N-1)/N`` of the output."""
        chunks = 1 if chunk_bytes is None else max(1, math.ceil(nbytes / size / chunk_bytes))
        return Cost((size - 1) * chunks, (size - 1) / size * nbytes, 0.0)

    def start(self, call, src, dst, ufunc, result, phase: str = "allgather"):
        """Start the all-gather half over the stacked output ``dst`` (this rank's block in place)."""
        return super().start(call, src, dst, ufunc, result, phase)


class RingReduceScatter(Ring):
    """The ring's first half alone: rank r ends with block r (the reduce-scatter every backend ran)."""

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: float | None = None) -> Cost:
        """``N - 1`` steps per chunk sending and reducing ``(N-1)/N`` of the vector."""
        share = (size - 1) / size * nbytes
        chunks = 1 if chunk_bytes is None else max(1, math.ceil(nbytes / size / chunk_bytes))
        return Cost((size - 1) * chunks, share, share)

    def start(self, call, src, dst, ufunc, result):
        """Reduce flat ``src`` so that ``result`` (this rank's block, 1-D) holds block ``rank`` of the reduction."""
        return ReduceScatterWork(call, self, src, ufunc, result, call.take_scale())


register_algorithm("ring", RingAllgather, collective="allgather", auto=True, help="blocks passed around a ring")
register_algorithm("ring", RingReduceScatter, collective="reduce_scatter", auto=True,
                   help="partial blocks passed around a ring, each reduced on the way")
