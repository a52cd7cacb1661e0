"""Recursive-doubling all-gather: ``log2 p`` exchanges, each doubling the blocks a rank holds.

With ``p`` a power of two, in step k every rank swaps everything it has gathered (``2**k``
consecutive blocks) with the rank whose number differs in bit k. Any other N folds as the
all-reduce's ``rd`` does (:mod:`npddp.comm.algorithms.fold`): the first ``2 * extra`` ranks pair up,
the even one hands its block to the odd one, which then stands for both (two consecutive blocks),
and gets the whole output back after the last step.
"""

from __future__ import annotations

import math

from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.algorithms.fold import Fold
from npddp.comm.engine.call import Context
from npddp.comm.engine.cost import Cost
from npddp.comm.engine.work import RoundWork


class RecursiveDoublingAllgather:
    """The recursive-doubling all-gather of one communicator."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.fold = Fold(ctx.rank, ctx.size)

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: float | None = None) -> Cost:
        """``log2 p`` exchanges sending ``(p-1)/p`` of the output (+ the fold's block in and output out)."""
        lg, fold = math.log2(1 << (size.bit_length() - 1)), Fold.extra_steps(size)
        return Cost(lg + 2 * fold, (size - 1) / size * nbytes + fold * nbytes, 0.0)

    def first_block(self, vrank: int) -> int:
        """The first real block active rank ``vrank`` stands for (``p``: one past the last block)."""
        fold = self.fold
        return 2 * vrank if vrank < fold.extra else vrank + fold.extra

    def start(self, call, src, dst, ufunc, result):
        """Rounds: fold in, the doubling steps over ranges of blocks, fold out."""
        rank, size, fold = self.ctx.rank, self.ctx.size, self.fold
        block = dst.size // size

        def blocks(v0: int, v1: int):   # the real blocks of active ranks [v0, v1) as a view of dst
            return dst[self.first_block(v0) * block:self.first_block(v1) * block]

        own = dst[rank * block:(rank + 1) * block]
        if fold.vrank < 0:   # hand in this rank's block, get the whole output back
            return RoundWork(call, [([(own, fold.partner)], (), None), ((), [(dst, fold.partner)], None)], result)
        rounds = []
        if fold.partner >= 0:   # the even rank below hands in its block
            rounds.append(((), [(dst[fold.partner * block:(fold.partner + 1) * block], fold.partner)], None))
        v, mask = fold.vrank, 1
        while mask < fold.p:
            mine, theirs = v & ~(mask - 1), (v ^ mask) & ~(mask - 1)
            rounds.append(([(blocks(mine, mine + mask), fold.real(v ^ mask))],
                           [(blocks(theirs, theirs + mask), fold.real(v ^ mask))], None))
            mask <<= 1
        if fold.partner >= 0:
            rounds.append(([(dst, fold.partner)], (), None))
        return RoundWork(call, rounds, result)


register_algorithm("rd", RecursiveDoublingAllgather, collective="allgather", auto=True,
                   help="recursive doubling (any N, folded onto a power of two)")
