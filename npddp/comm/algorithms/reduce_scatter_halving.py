"""Recursive-halving reduce-scatter: ``log2 p`` exchanges, each of half the data the step before.

With ``p`` a power of two, each rank starts responsible for every block; in each step it splits its
range of blocks in two, sends the half its partner (the rank differing in the step's bit, from the
highest bit down) keeps, receives the partner's partial of its own half and reduces the two, the lower
rank's partial first. After ``log2 p`` steps rank r holds block r, reduced over all ranks. Any other N
folds first (:mod:`npddp.comm.algorithms.fold`): the even rank of each of the first ``2 * extra``
pairs hands its whole vector in, and its partner (standing for both blocks) sends its block back
at the end. Blocks are ``np.array_split``'s, as every reduce-scatter here.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from npddp.comm import checks as c
from npddp.comm.algorithms.allgather_rd import RecursiveDoublingAllgather
from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.algorithms.fold import Fold
from npddp.comm.engine.cost import Cost
from npddp.comm.engine.work import RoundWork


class RecursiveHalving(RecursiveDoublingAllgather):
    """The recursive-halving reduce-scatter of one communicator (the fold and block ranges of the rd all-gather)."""

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: float | None = None) -> Cost:
        """``log2 p`` exchanges sending and reducing ``(p-1)/p`` of the vector (+ the fold's vector in)."""
        lg, fold = math.log2(1 << (size.bit_length() - 1)), Fold.extra_steps(size)
        share = (size - 1) / size * nbytes + fold * nbytes
        return Cost(lg + 2 * fold, share, share)

    def start(self, call, src, dst, ufunc, result):
        """Reduce flat ``src`` (n,) so that ``dst`` (this rank's block) holds block ``rank`` of the reduction."""
        rank, size, fold, pool = self.ctx.rank, self.ctx.size, self.fold, self.ctx.scratch
        bounds = c.block_bounds(src.size, size)
        if fold.vrank < 0:   # hand the vector in, get this rank's reduced block back
            return RoundWork(call, [([(src, fold.partner)], (), None),
                                    ((), nonempty([(dst, fold.partner)]), partial(call.apply_scale, dst))], result)
        raw = pool.acquire(2 * src.nbytes)
        acc = np.frombuffer(raw, dtype=src.dtype, count=src.size)                           # (n,) partials
        got = np.frombuffer(raw, dtype=src.dtype, count=src.size, offset=src.nbytes)     # (n,) the partner's

        def span(v0: int, v1: int) -> slice:   # the elements of active ranks [v0, v1)'s blocks
            return slice(int(bounds[self.first_block(v0)]), int(bounds[self.first_block(v1)]))

        rounds, cur = [], src
        if fold.partner >= 0:   # the even rank below (lower: its partial first) hands its vector in
            rounds.append(((), [(got, fold.partner)], partial(ufunc, got, src, out=acc)))
            cur = acc
        v, lo, hi, mask = fold.vrank, 0, fold.p, fold.p >> 1
        while mask:
            partner, mid = v ^ mask, lo + mask
            keep, give = ((lo, mid), (mid, hi)) if v < mid else ((mid, hi), (lo, mid))
            k, g = span(*keep), span(*give)
            first, second = (got[k], cur[k]) if partner < v else (cur[k], got[k])
            rounds.append((nonempty([(cur[g], fold.real(partner))]), nonempty([(got[k], fold.real(partner))]),
                           partial(ufunc, first, second, out=acc[k])))
            cur, (lo, hi), mask = acc, keep, mask >> 1
        mine = slice(int(bounds[rank]), int(bounds[rank + 1]))
        finish = partial(_finish, cur, mine, dst, call)
        if fold.partner >= 0:   # send the partner its reduced block
            theirs = slice(int(bounds[fold.partner]), int(bounds[fold.partner + 1]))
            rounds.append((nonempty([(cur[theirs], fold.partner)]), (), finish))
        else:
            rounds.append(((), (), finish))
        return RoundWork(call, rounds, result, partial(pool.release, raw))


def nonempty(pairs: list) -> list:
    """The ``(array, peer)`` pairs that move any data (both ends know every block's size, so both skip alike)."""
    return [(a, peer) for a, peer in pairs if a.size]


def _finish(partials: np.ndarray, mine: slice, dst: np.ndarray, call) -> None:
    """This rank's block of the reduction into ``dst``, averaged if the op asks."""
    np.copyto(dst, partials[mine])
    call.apply_scale(dst)


register_algorithm("halving", RecursiveHalving, collective="reduce_scatter", auto=True,
                   help="recursive halving (any N, folded onto a power of two)")
