"""Pairwise-exchange reduce-scatter: in step s (1 .. N-1) rank r sends block ``r + s`` to rank ``r + s`` and
receives its own block from rank ``r - s``; then it reduces the N contributions in rank order.

``N - 1`` steps each moving one block, like the ring, but nothing is forwarded and every block is reduced
in the same order (rank 0's contribution first, then rank 1's, ...) whatever N, the sizes or the timing.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from npddp.comm import checks as c
from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.engine.call import Context
from npddp.comm.engine.cost import Cost
from npddp.comm.engine.work import RoundWork


class PairwiseReduceScatter:
    """The pairwise-exchange reduce-scatter of one communicator."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: float | None = None) -> Cost:
        """``N - 1`` steps sending and reducing ``(N-1)/N`` of the vector."""
        share = (size - 1) / size * nbytes
        return Cost(size - 1, share, share)

    def start(self, call, src, dst, ufunc, result):
        """Rounds of one exchange each, then the reduction in rank order into ``dst`` (this rank's block)."""
        rank, size, pool = self.ctx.rank, self.ctx.size, self.ctx.scratch
        bounds = c.block_bounds(src.size, size)
        block = int(bounds[rank + 1] - bounds[rank])
        raw = pool.acquire(max(1, size * block) * src.itemsize)
        parts = np.frombuffer(raw, dtype=src.dtype, count=size * block).reshape(size, block)  # (N, block)
        rounds = []
        for step in range(1, size):
            to, frm = (rank + step) % size, (rank - step) % size
            sends = [(src[bounds[to]:bounds[to + 1]], to)] if bounds[to + 1] > bounds[to] else []
            recvs = [(parts[frm], frm)] if block else []
            rounds.append((sends, recvs, None))
        parts[rank] = src[bounds[rank]:bounds[rank + 1]]
        rounds.append(((), (), partial(_reduce_in_rank_order, parts, dst, ufunc, call)))
        return RoundWork(call, rounds, result, partial(pool.release, raw))


def _reduce_in_rank_order(parts: np.ndarray, dst: np.ndarray, ufunc, call) -> None:
    """``dst = parts[0] op parts[1] op ...`` left to right, then the average's scale if the op asks."""
    np.copyto(dst, parts[0])
    for row in parts[1:]:
        ufunc(dst, row, out=dst)
    call.apply_scale(dst)


register_algorithm("pairwise", PairwiseReduceScatter, collective="reduce_scatter", auto=True,
                   help="pairwise exchange, each block reduced in rank order")
