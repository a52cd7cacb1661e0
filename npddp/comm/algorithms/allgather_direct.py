"""Direct all-gather: every rank posts its block to every other rank and all receives at once, then waits.

One round of ``N - 1`` sends and ``N - 1`` receives per rank: no forwarding, so each block crosses
the network once; the transport (or MPI) orders the ``N - 1`` messages on the wire.
"""

from __future__ import annotations

from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.engine.call import Context
from npddp.comm.engine.cost import Cost
from npddp.comm.engine.work import RoundWork


class DirectAllgather:
    """The direct (post all, then wait) all-gather of one communicator."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: float | None = None) -> Cost:
        """``N - 1`` messages from this rank, ``(N-1)/N`` of the output sent."""
        return Cost(size - 1, (size - 1) / size * nbytes, 0.0)

    def start(self, call, src, dst, ufunc, result):
        """One round: this rank's block to every peer, every peer's block into its row of ``dst``."""
        rank, size = self.ctx.rank, self.ctx.size
        block = dst.size // size
        rows = [dst[s * block:(s + 1) * block] for s in range(size)]  # each (block,)
        peers = [s for s in range(size) if s != rank]
        return RoundWork(call, [([(rows[rank], d) for d in peers], [(rows[s], s) for s in peers], None)], result)


register_algorithm("direct", DirectAllgather, collective="allgather", auto=True,
                   help="every block straight to every rank, all posted at once")
