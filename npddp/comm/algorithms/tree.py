"""Binomial-tree all-reduce: reduce up a binomial tree to rank 0, then broadcast down the same tree.

Rank r's parent is r with its lowest set bit cleared; its children are ``r + 1, r + 2, r + 4,
...`` below its lowest set bit (every power of two for rank 0). Each rank adds its children's
partials to its own, nearest child first, and passes the sum to its parent; rank 0 ends with
the total, computed at that one place, and sends it back down, so every rank holds the same
bits. Long vectors are cut into chunks of ``chunk_bytes`` that flow through the tree one
after another, so the levels of the tree work on different chunks at once (a pipeline).

Cost: ``2 ceil(log2 N)`` steps of the whole vector without chunks; the root's link carries
everything, so it suits short vectors and many ranks, and loses to the ring on long vectors.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.engine.call import Context

from npddp.comm.engine.cost import Cost

from npddp.comm.engine.work import RoundWork


class Tree:
    """The binomial-tree all-reduce of one communicator."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        rank, size = ctx.rank, ctx.size
        low = rank & -rank if rank else 1 << size.bit_length()
        self.parent = rank - low if rank else -1
        self.children = [rank + d for d in (1 << k for k in range(size.bit_length())) if d < low and rank + d < size]

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: float | None = None) -> Cost:
        """Up and down a tree of depth ``ceil(log2 N)``, chunks pipelined; rank 0's link carries the vector once per child."""
        depth = math.ceil(math.log2(size)) if size > 1 else 0
        chunks = 1 if chunk_bytes is None else max(1, math.ceil(nbytes / chunk_bytes))
        return Cost(2 * (depth + chunks - 1), 2 * depth * nbytes, depth * nbytes)

    def start(self, call, src, dst, ufunc, result):
        """Rounds per chunk: receive the children's partials, reduce, send up; then down the tree."""
        children, parent = self.children, self.parent
        seg = max(1, self.ctx.chunk_bytes // src.itemsize)
        cuts = [slice(i, min(i + seg, src.size)) for i in range(0, src.size, seg)]
        pool = self.ctx.scratch
        width = min(seg, src.size)
        raw = pool.acquire(len(children) * width * src.itemsize)
        slots = np.frombuffer(raw, dtype=src.dtype, count=len(children) * width).reshape(len(children), width)  # (children, chunk)
        rounds = []
        for part in cuts:  # up the tree, chunk by chunk
            if children:
                got = [slots[i, :part.stop - part.start] for i in range(len(children))]
                rounds.append(((), list(zip(got, children)), partial(_reduce, ufunc, src[part], got, dst[part])))
            if parent >= 0:
                rounds.append(([(dst[part] if children else src[part], parent)], (), None))
        for part in cuts:  # down the tree, farthest child first
            if parent >= 0:
                rounds.append(((), [(dst[part], parent)], None))
            if children:
                rounds.append(([(dst[part], child) for child in reversed(children)], (), None))
        return RoundWork(call, rounds, result, partial(pool.release, raw))


def _reduce(ufunc, own, partials, out) -> None:
    """``out = ((own op p0) op p1) ...``: the children's partials in order, nearest first."""
    ufunc(own, partials[0], out=out)
    for p in partials[1:]:
        ufunc(out, p, out=out)


register_algorithm("tree", Tree, auto=True, help="up a binomial tree and back down")
