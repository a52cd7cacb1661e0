"""All-to-all by pairwise exchange: in round k (1..N-1) send to rank + k and receive from rank - k.

One message in and one out per round, so no rank is sent more than one block at a time, whatever N:
the schedule for large blocks. Any counts (``alltoallv``). Cost: N - 1 steps, each rank sends all
but its own block once.
"""

from __future__ import annotations

from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.engine.cost import Cost
from npddp.comm.engine.exchange import Exchange, blocks, pairwise_rounds


class Pairwise(Exchange):
    """N - 1 rounds of one send and one receive."""

    def rounds(self, flat, out, send, recv, equal):
        return pairwise_rounds(self.ctx.rank, self.ctx.size, blocks(flat, send), blocks(out, recv))

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: int) -> Cost:
        """``nbytes``: the send buffer (all N blocks)."""
        return Cost(size - 1, nbytes * (size - 1) / size, 0.0)


register_algorithm("pairwise", Pairwise, collective="alltoall", auto=True,
                   help="N - 1 rounds: send to rank + k, receive from rank - k")
