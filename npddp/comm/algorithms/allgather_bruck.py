"""Bruck's all-gather: ``ceil(log2 N)`` steps for any N, each sending what this rank has gathered so far.

Blocks are kept rotated so that this rank's own block comes first: in step k (distance ``d = 2**k``)
rank r sends its first ``min(d, N - d)`` blocks to rank ``r - d`` and receives as many from rank
``r + d``, appending them. After the last step the rotated buffer holds blocks ``r, r+1, ...`` and
one copy puts them in rank order. Few messages (latency-bound sizes), each block sent ``N - 1``
times in all as in the ring, plus one local copy of the whole output.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.engine.call import Context
from npddp.comm.engine.cost import Cost
from npddp.comm.engine.work import RoundWork


class BruckAllgather:
    """Bruck's all-gather of one communicator."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: float | None = None) -> Cost:
        """``ceil(log2 N)`` steps sending ``(N-1)/N`` of the output; the copy back counts as a pass over it."""
        return Cost(math.ceil(math.log2(size)), (size - 1) / size * nbytes, nbytes)

    def start(self, call, src, dst, ufunc, result):
        """Rounds over a rotated scratch copy of the stacked output ``dst`` (this rank's block already in place)."""
        rank, size, pool = self.ctx.rank, self.ctx.size, self.ctx.scratch
        block = dst.size // size
        raw = pool.acquire(dst.nbytes)
        rotated = np.frombuffer(raw, dtype=dst.dtype, count=dst.size)  # (N * block,) own block first
        rotated[:block] = dst[rank * block:(rank + 1) * block]
        rounds, dist = [], 1
        while dist < size:
            count = min(dist, size - dist) * block
            rounds.append(([(rotated[:count], (rank - dist) % size)],
                           [(rotated[dist * block:dist * block + count], (rank + dist) % size)], None))
            dist <<= 1
        rounds[-1] = (*rounds[-1][:2], partial(_unrotate, rotated, dst, rank * block))
        return RoundWork(call, rounds, result, partial(pool.release, raw))


def _unrotate(rotated: np.ndarray, dst: np.ndarray, offset: int) -> None:
    """Blocks ``r, r+1, ..., r-1`` in ``rotated`` to rank order in ``dst`` (``offset`` = r * block)."""
    tail = dst.size - offset
    dst[offset:] = rotated[:tail]
    dst[:offset] = rotated[tail:]


register_algorithm("bruck", BruckAllgather, collective="allgather", auto=True,
                   help="Bruck: log2 N steps for any N, then one local rotation")
