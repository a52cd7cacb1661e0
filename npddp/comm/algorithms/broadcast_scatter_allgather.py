"""Broadcast as a scatter then an all-gather (van de Geijn's): for large buffers, every link busy at once.

The root sends block i of the buffer (blocks as ``np.array_split``) to rank i, then the ranks
all-gather the blocks around the ring (the ring schedule's second half,
:mod:`npddp.comm.algorithms.ring`), so each rank sends about ``2n (N-1)/N`` bytes instead of the
whole buffer per level. The root's N - 1 sends go out at once; 2 (N - 1) steps.
"""

from __future__ import annotations

from npddp.comm import checks as c
from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.engine.cost import Cost


class ScatterAllgather:
    """The root scatters the blocks, the ring all-gathers them."""

    def __init__(self, ctx):
        from npddp.comm.algorithms.ring import Ring   # here: importing it above would register ring out of order
        self.ctx = ctx
        self.ring = Ring(ctx)

    def run(self, call, flat, root: int) -> None:
        """Broadcast root's 1-d ``flat`` in place (blocking, under ``call``)."""
        rank, size = self.ctx.rank, self.ctx.size
        bounds = c.block_bounds(flat.size, size).tolist()
        block = [flat[bounds[i]:bounds[i + 1]] for i in range(size)]
        if rank == root:
            call.transfer(sends=[(block[d], d) for d in range(size) if d != root and block[d].size])
        elif block[rank].size:
            call.transfer(recvs=[(block[rank], root)])
        self.ring.start(call, flat, flat, None, flat, phase="allgather").wait()

    start = run   # the registry's contract names a start; a broadcast runs blocking

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: int) -> Cost:
        """The root's scatter, then the ring's all-gather: each moves ``(N-1)/N`` of the buffer."""
        return Cost(2 * (size - 1), 2 * nbytes * (size - 1) / size, 0.0)


register_algorithm("scatter_allgather", ScatterAllgather, collective="broadcast", auto=True,
                   help="the root scatters blocks, then a ring all-gather (large buffers)")
