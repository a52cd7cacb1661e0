"""All-to-all by Bruck's algorithm: ceil(log2 N) rounds, each moving about half the blocks, for small blocks.

The blocks are first rotated so that block i is the one for rank + i. In round k (step s = 2**k)
every block whose index has bit k set goes, in one message, to rank + s, and the blocks of the
same indices come from rank - s into their places; after the last round block i holds what rank - i
sent this rank, and an inverse rotation puts it at ``out[rank - i]``. Fewer messages than the
pairwise exchange (log2 N against N - 1), more bytes (about N/2 blocks per round) and two local
copies of the buffer. Equal blocks only: for ``alltoallv`` (counts per pair) it runs the pairwise
exchange.
"""

from __future__ import annotations

import numpy as np

from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.engine.cost import Cost
from npddp.comm.engine.exchange import Exchange, blocks, pairwise_rounds


class Bruck(Exchange):
    """Rotate, ceil(log2 N) rounds of the blocks with bit k of their index set, rotate back."""

    def rounds(self, flat, out, send, recv, equal):
        rank, size = self.ctx.rank, self.ctx.size
        if not equal:
            return pairwise_rounds(rank, size, blocks(flat, send), blocks(out, recv))
        rows, got = flat.reshape(size, -1), out.reshape(size, -1)   # (size, block) each
        order = (rank + np.arange(size)) % size
        work = rows[order]                                # work[i]: the block for rank + i (a copy: rows stays)
        rounds, step = [], 1
        picks = []
        while step < size:
            picks.append(np.flatnonzero(np.arange(size) & step))
            step <<= 1
        packed = [np.empty((len(p), rows.shape[1]), dtype=flat.dtype) for p in picks]
        arrived = [np.empty_like(b) for b in packed]
        np.take(work, picks[0], axis=0, out=packed[0])

        def land(k: int) -> None:
            work[picks[k]] = arrived[k]
            if k + 1 < len(picks):
                np.take(work, picks[k + 1], axis=0, out=packed[k + 1])
            else:                                         # block i came from rank - i
                got[(rank - np.arange(size)) % size] = work

        for k, p in enumerate(picks):
            s = 1 << k
            rounds.append(([(packed[k], (rank + s) % size)], [(arrived[k], (rank - s) % size)],
                           lambda k=k: land(k)))
        return rounds

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: int) -> Cost:
        """``nbytes``: the send buffer (all N blocks); the two rotations count as bytes handled locally."""
        steps = max(1, (size - 1).bit_length())
        return Cost(steps, steps * nbytes / 2, 2 * nbytes)


register_algorithm("bruck", Bruck, collective="alltoall", auto=True,
                   help="ceil(log2 N) rounds of about half the blocks (small blocks)")
