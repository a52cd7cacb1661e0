"""Recursive-doubling all-reduce: ``log2 N`` exchanges of the whole vector; the latency-optimal algorithm.

In step k (``k = 0 .. log2 p - 1``) every active rank swaps its whole partial result with the
rank whose number differs in bit k, and both reduce the two, the lower rank's partial first:
after the step, both hold the same bits, the reduction over a group of ``2**(k+1)`` ranks. For
a world that is not a power of two, the ranks first fold onto one (see :mod:`npddp.comm.algorithms.fold`):
the extra ranks hand their vector in before the first step and get the result back after the last.

Cost: ``log2 p`` steps (+2 when folding), each sending the whole vector: ideal for short
vectors, wasteful for long ones (it moves ``log2 p`` times what the ring moves).
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np


from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.engine.call import Context


from npddp.comm.engine.cost import Cost


from npddp.comm.engine.work import RoundWork
from npddp.comm.algorithms.fold import Fold


class RecursiveDoubling:
    """The recursive-doubling all-reduce of one communicator."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.fold = Fold(ctx.rank, ctx.size)
        fold = self.fold
        # (partner rank, True if the partner's partial goes first) for each doubling step
        self.steps = [] if fold.vrank < 0 else [
            (fold.real(fold.vrank ^ mask), fold.vrank ^ mask < fold.vrank)
            for mask in (1 << k for k in range(fold.p.bit_length() - 1))]

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: float | None = None) -> Cost:
        """``log2 p`` exchanges of the whole vector (+2 steps when folding), reducing it each time."""
        fold, lg = Fold.extra_steps(size), math.log2(1 << (size.bit_length() - 1))
        return Cost(lg + 2 * fold, (lg + 2 * fold) * nbytes, (lg + fold) * nbytes)

    def start(self, call, src, dst, ufunc, result):
        """Rounds: fold in, the doubling steps, fold out."""
        pool, fold = self.ctx.scratch, self.fold
        raw = pool.acquire(src.nbytes)
        got = np.frombuffer(raw, dtype=src.dtype, count=src.size)  # (n,) the partner's partial
        if fold.vrank < 0:  # hand the vector to the partner, get the result back
            rounds = [([(src, fold.partner)], (), None), ((), [(dst, fold.partner)], None)]
        else:
            rounds, cur = [], src
            if fold.partner >= 0:  # the partner below hands its vector in: it goes first
                rounds.append(((), [(got, fold.partner)], partial(ufunc, got, src, out=dst)))
                cur = dst
            for peer, peer_first in self.steps:
                first, second = (got, cur) if peer_first else (cur, got)
                rounds.append(([(cur, peer)], [(got, peer)], partial(ufunc, first, second, out=dst)))
                cur = dst
            if fold.partner >= 0:
                rounds.append(([(dst, fold.partner)], (), None))
        return RoundWork(call, rounds, result, partial(pool.release, raw))

    def run(self, call, src, dst, ufunc) -> None:
        """The same schedule as :meth:`start`, run to completion at once (a blocking call's short path)."""
        pool, fold = self.ctx.scratch, self.fold
        raw = pool.acquire(src.nbytes)
        got = np.frombuffer(raw, dtype=src.dtype, count=src.size)  # (n,)
        try:
            if fold.vrank < 0:
                call.transfer(sends=[(src, fold.partner)])
                call.transfer(recvs=[(dst, fold.partner)])
                return
            cur = src
            if fold.partner >= 0:
                call.transfer(recvs=[(got, fold.partner)])
                ufunc(got, src, out=dst)
                cur = dst
            for peer, peer_first in self.steps:
                call.exchange(got, cur, peer)
                if peer_first:
                    ufunc(got, cur, out=dst)
                else:
                    ufunc(cur, got, out=dst)
                cur = dst
            if fold.partner >= 0:
                call.transfer(sends=[(dst, fold.partner)])
        finally:
            del got
            pool.release(raw)


register_algorithm("rd", RecursiveDoubling, auto=True, help="recursive doubling")
