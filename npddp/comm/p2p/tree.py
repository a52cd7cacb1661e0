"""Binomial-tree all-reduce: reduce up a binomial tree to rank 0, then broadcast down the same tree.

Rank r's parent is r with its lowest set bit cleared; its children are ``r + 1, r + 2, r + 4,
...`` below its lowest set bit (every power of two for rank 0). Each rank adds its children's
partials to its own, nearest child first, and passes the sum to its parent; rank 0 ends with
the total, computed at that one place, and sends it back down, so every rank holds the same
bits. Long vectors are cut into segments of ``segment_bytes`` that flow through the tree one
after another, so the levels of the tree work on different segments at once (a pipeline).

Cost: ``2 ceil(log2 N)`` steps of the whole vector without segments; the root's link carries
everything, so it suits short vectors and many ranks, and loses to the ring on long vectors.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from npddp.comm.p2p.engine import RoundWork


class Tree:
    """The binomial-tree all-reduce of one communicator."""

    def __init__(self, comm):
        self.comm = comm
        rank, size = comm.rank, comm.size
        low = rank & -rank if rank else 1 << size.bit_length()
        self.parent = rank - low if rank else -1
        self.children = [rank + d for d in (1 << k for k in range(size.bit_length())) if d < low and rank + d < size]

    def start(self, call, src, dst, ufunc, result):
        """Rounds per segment: receive the children's partials, reduce, send up; then down the tree."""
        comm, children, parent = self.comm, self.children, self.parent
        seg = max(1, comm.segment_bytes // src.itemsize)
        cuts = [slice(i, min(i + seg, src.size)) for i in range(0, src.size, seg)]
        pool = comm.scratch
        width = min(seg, src.size)
        raw = pool.acquire(len(children) * width * src.itemsize)
        slots = np.frombuffer(raw, dtype=src.dtype, count=len(children) * width).reshape(len(children), width)  # (children, segment)
        rounds = []
        for part in cuts:  # up the tree
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
