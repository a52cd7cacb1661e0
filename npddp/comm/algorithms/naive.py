"""Baseline all-reduce: every buffer goes through rank 0, over point-to-point messages.

All-reduce gathers every buffer to rank 0, reduces there in rank order ((x0 op x1) op x2) ...,
and sends the result to every rank: O(N) messages of the full buffer through one rank, the
traffic pattern the other algorithms exist to beat. Barrier, broadcast, reduce-scatter and
all-gather go through rank 0 the same way.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.engine.call import Context
from npddp.comm.engine.cost import Cost
from npddp.comm.engine.work import RoundWork

ROOT = 0


class Naive:
    """Gather to rank 0, reduce there in rank order, send the result to every rank."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: float | None = None) -> Cost:
        """Rank 0 receives and sends the whole vector ``N - 1`` times each, and reduces it ``N - 1`` times."""
        return Cost(2 * (size - 1), 2 * (size - 1) * nbytes, (size - 1) * nbytes)

    def start(self, call, src, dst, ufunc, result):
        """Rounds: rank 0 receives and reduces each rank's buffer in rank order, then sends the result to all."""
        ctx = self.ctx
        if ctx.rank != ROOT:
            rounds = [([(src, ROOT)], (), None), ((), [(dst, ROOT)], None)]
            return RoundWork(call, rounds, result)
        raw = ctx.scratch.acquire(src.nbytes)
        got = np.frombuffer(raw, dtype=src.dtype, count=src.size)  # (n,)
        rounds = [((), [(got, source)], partial(ufunc, src if source == 1 else dst, got, out=dst))
                  for source in range(1, ctx.size)]
        rounds.append(([(dst, dest) for dest in range(1, ctx.size)], (), None))
        return RoundWork(call, rounds, result, partial(ctx.scratch.release, raw))


register_algorithm("naive", Naive, auto=False, help="gather to rank 0 and back")
