"""All-to-all by Bruck's algorithm: ceil(log2 N) rounds, each moving about half the blocks, for small blocks.

The blocks are first rotated so that block i is the one for rank + i. In round k (step s = 2**k)
every block whose index has bit k set goes, in one message, to rank + s, and the blocks of the
same indices come from rank - s into their places; after the last round block i holds what rank - i
sent this rank, and an inverse rotation puts it at ``out[rank - i]``. Fewer messages than the
pairwise exchange (log2 N against N - 1), more bytes (about N/2 blocks per round) and two local
copies of the buffer (through the scratch pool). Equal blocks only: for ``alltoallv`` (counts per pair) it runs the pairwise
exchange.
"""

from __future__ import annotations

import numpy as np

from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.engine.cost import Cost
from npddp.comm.engine.exchange import Exchange, blocks, pairwise_rounds


def s_count(runs: list) -> int:
    """Blocks in ``runs`` (slices of block indices)."""
    return sum(r.stop - r.start for r in runs)


def copy_runs(packed: np.ndarray, work: np.ndarray, runs: list, pack: bool) -> None:
    """Copy the blocks of ``runs`` from ``work`` into consecutive rows of ``packed`` (``pack``), or back."""
    row = 0
    for r in runs:
        n = r.stop - r.start
        if pack:
            packed[row:row + n] = work[r]
        else:
            work[r] = packed[row:row + n]
        row += n


class Bruck(Exchange):
    """Rotate, ceil(log2 N) rounds of the blocks with bit k of their index set, rotate back."""

    def rounds(self, flat, out, send, recv, equal):
        rank, size = self.ctx.rank, self.ctx.size
        if not equal:
            return pairwise_rounds(rank, size, blocks(flat, send), blocks(out, recv))
        rows, got = flat.reshape(size, -1), out.reshape(size, -1)   # (size, block) each
        half, pool = size // 2, self.ctx.scratch   # no round moves more than size // 2 blocks
        raw = pool.acquire((size + 2 * half) * rows[0].nbytes)
        scratch = np.frombuffer(raw, dtype=flat.dtype, count=(size + 2 * half) * rows.shape[1]).reshape(-1, rows.shape[1])
        work, sent, came = scratch[:size], scratch[size:size + half], scratch[size + half:]   # work[i]: for rank + i
        work[:size - rank], work[size - rank:] = rows[rank:], rows[:rank]
        steps = [1 << k for k in range((size - 1).bit_length())]
        runs = [[slice(i, min(i + s, size)) for i in range(s, size, 2 * s)] for s in steps]   # indices with bit k
        packed = [sent[:s_count(r)] for r in runs]
        arrived = [came[:s_count(r)] for r in runs]
        copy_runs(packed[0], work, runs[0], pack=True)

        def land(k: int) -> None:
            copy_runs(arrived[k], work, runs[k], pack=False)
            if k + 1 < len(runs):
                copy_runs(packed[k + 1], work, runs[k + 1], pack=True)
            else:                                         # block i came from rank - i
                got[:rank + 1] = work[rank::-1]
                got[rank + 1:] = work[:rank:-1]
                pool.release(raw)                         # every message of the call has completed

        return [([(packed[k], (rank + s) % size)], [(arrived[k], (rank - s) % size)], lambda k=k: land(k))
                for k, s in enumerate(steps)]

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: int) -> Cost:
        """``nbytes``: the send buffer (all N blocks); the two rotations count as bytes handled locally."""
        steps = max(1, (size - 1).bit_length())
        return Cost(steps, steps * nbytes / 2, 2 * nbytes)


register_algorithm("bruck", Bruck, collective="alltoall", auto=True,
                   help="ceil(log2 N) rounds of about half the blocks (small blocks)")
