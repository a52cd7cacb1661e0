"""Rabenseifner's all-reduce: reduce-scatter by recursive halving, then all-gather by recursive doubling.

The vector is cut into ``p`` blocks as ``np.array_split`` cuts it (``p``: the active ranks
after folding a world that is not a power of two, see :mod:`npddp.comm.algorithms.fold`). Each active
rank starts owning all ``p`` blocks. In each halving step (distance ``p/2``, then ``p/4``, ...,
1) it swaps half of what it owns with its partner: the lower rank keeps the lower half, the
upper rank the upper half, and each reduces the half it keeps, the lower rank's partial first.
After ``log2 p`` steps active rank v owns block v, fully reduced at that one place. The
all-gather runs the steps backwards (distance 1, 2, ..., ``p/2``), each rank copying the
partner's reduced blocks beside its own, so every rank ends with the same bits. For
``op="avg"`` the owned block is scaled by 1/N right after its last reduction, before the all-gather.

Cost: ``2 log2 p`` steps, each rank sending ``2 (p-1)/p`` of the vector in all: the ring's
bandwidth with the latency of recursive doubling. The choice for medium vectors.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from npddp.comm import checks as c
from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.engine.call import Context
from npddp.comm.engine.cost import Cost
from npddp.comm.engine.work import RoundWork
from npddp.comm.algorithms.fold import Fold

_PLAN_CACHE_SIZE = 64


class RabenseifnerPlan:
    """The steps of one active rank for ``n`` elements.

    ``halving``: ``(peer, keep, send, peer_first)`` per step, with element slices; ``doubling``:
    ``(peer, mine, theirs)`` per step; ``scratch_elems``: the largest half received.
    """

    __slots__ = ("halving", "doubling", "scratch_elems")

    def __init__(self, n: int, fold: Fold):
        p, v = fold.p, fold.vrank
        bounds = c.block_bounds(n, p).tolist()

        def elems(lo, hi):
            return slice(bounds[lo], bounds[hi])

        self.halving, self.doubling = [], []
        lo, hi, mask = 0, p, p >> 1
        while mask:
            mid = (lo + hi) // 2
            upper = bool(v & mask)
            keep, send = ((mid, hi), (lo, mid)) if upper else ((lo, mid), (mid, hi))
            self.halving.append((fold.real(v ^ mask), elems(*keep), elems(*send), upper))
            lo, hi = keep
            mask >>= 1
        mask = 1
        while mask < p:
            width = hi - lo
            theirs = (lo - width, lo) if v & mask else (hi, hi + width)
            self.doubling.append((fold.real(v ^ mask), elems(lo, hi), elems(*theirs)))
            lo, hi = min(lo, theirs[0]), max(hi, theirs[1])
            mask <<= 1
        self.scratch_elems = max((k.stop - k.start for _, k, _, _ in self.halving), default=0)


class Rabenseifner:
    """Rabenseifner's all-reduce of one communicator: cached plans, rounds per call."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.fold = Fold(ctx.rank, ctx.size)
        self._plans: dict[int, RabenseifnerPlan] = {}

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: float | None = None) -> Cost:
        """``2 log2 p`` steps moving ``2 (p-1)/p`` of the vector (+ the whole vector in and out when folding)."""
        fold, p = Fold.extra_steps(size), 1 << (size.bit_length() - 1)
        lg, share = math.log2(p), (p - 1) / p
        return Cost(2 * lg + 2 * fold, (2 * share + 2 * fold) * nbytes, (share + fold) * nbytes)

    def plan(self, n: int) -> RabenseifnerPlan:
        """The (cached) plan for ``n`` elements."""
        plan = self._plans.get(n)
        if plan is None:
            if len(self._plans) >= _PLAN_CACHE_SIZE:
                del self._plans[next(iter(self._plans))]
            plan = self._plans[n] = RabenseifnerPlan(n, self.fold)
        return plan

    def start(self, call, src, dst, ufunc, result):
        """Rounds: fold in, halve, double, fold out."""
        fold = self.fold
        if fold.vrank < 0:  # hand the vector to the partner, get the result back (averaged there)
            call.take_scale()
            return RoundWork(call, [([(src, fold.partner)], (), None), ((), [(dst, fold.partner)], None)], result)
        plan, pool = self.plan(src.size), self.ctx.scratch
        nrecv = max(plan.scratch_elems, src.size if fold.partner >= 0 else 0)
        raw = pool.acquire(nrecv * src.itemsize)
        got = np.frombuffer(raw, dtype=src.dtype, count=nrecv)  # (nrecv,) what the partner sent
        rounds, cur = [], src
        if fold.partner >= 0:  # the partner below hands its vector in: it goes first
            rounds.append(((), [(got[:src.size], fold.partner)], partial(ufunc, got[:src.size], src, out=dst)))
            cur = dst
        scale = call.take_scale()  # op avg: the owned block is scaled right after its last reduction
        for i, (peer, keep, send, peer_first) in enumerate(plan.halving):
            theirs, mine = got[:keep.stop - keep.start], cur[keep]
            first, second = (theirs, mine) if peer_first else (mine, theirs)
            last = scale and i == len(plan.halving) - 1
            action = partial(_reduce_scaled, ufunc, first, second, dst[keep], scale) if last else \
                partial(ufunc, first, second, out=dst[keep])
            rounds.append(([(cur[send], peer)], [(theirs, peer)], action))
            cur = dst
        for peer, mine, theirs in plan.doubling:
            rounds.append(([(dst[mine], peer)], [(dst[theirs], peer)], None))
        if fold.partner >= 0:
            rounds.append(([(dst, fold.partner)], (), None))
        return RoundWork(call, rounds, result, partial(pool.release, raw))


def _reduce_scaled(ufunc, first, second, out, scale: float) -> None:
    """``out = ufunc(first, second) * scale``, the scale applied while ``out`` is in cache."""
    ufunc(first, second, out=out)
    np.multiply(out, scale, out=out)


register_algorithm("rabenseifner", Rabenseifner, auto=True, help="recursive halving, then doubling")
