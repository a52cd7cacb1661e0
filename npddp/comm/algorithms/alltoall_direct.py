"""All-to-all by direct scattered exchange: every send and every receive posted at once, then all waited.

One round: the transport moves the N - 1 messages each way in whatever order they go. Any counts
(``alltoallv``). Its cost is the pairwise exchange's by the model (the same messages, each one's
overhead paid in turn), which cannot tell the two apart: ``auto`` does not pick it, a user (or the
tuner's measurement) may.
"""

from __future__ import annotations

from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.engine.cost import Cost
from npddp.comm.engine.exchange import Exchange, blocks


class Direct(Exchange):
    """Every message posted in one round, to rank + 1, rank + 2, ... (so the peers are not all hit at once)."""

    def rounds(self, flat, out, send, recv, equal):
        rank, size = self.ctx.rank, self.ctx.size
        sends, recvs = blocks(flat, send), blocks(out, recv)
        order = [(rank + k) % size for k in range(1, size)]
        posted = ([(sends[d], d) for d in order if sends[d].size],
                  [(recvs[s], s) for s in reversed(order) if recvs[s].size], None)
        return [posted] if posted[0] or posted[1] else []

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: int) -> Cost:
        """``nbytes``: the send buffer (all N blocks)."""
        return Cost(size - 1, nbytes * (size - 1) / size, 0.0)


register_algorithm("direct", Direct, collective="alltoall", auto=False,
                   help="every send and receive posted at once, then all waited")
