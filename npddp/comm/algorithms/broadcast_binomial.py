"""Broadcast down a binomial tree: each rank receives the whole buffer from its parent, then sends it to its children.

Relative to the root, rank v's parent is v with its lowest set bit cleared; its children are
v + 2**j for the powers of two below that bit. ceil(log2 N) steps, each moving the whole buffer:
the schedule for small buffers.
"""

from __future__ import annotations

from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.engine.cost import Cost


class Binomial:
    """Receive from the parent (the lowest set bit of the relative rank cleared), then send to the children."""

    def __init__(self, ctx):
        self.ctx = ctx

    def run(self, call, buf, root: int) -> None:
        """Broadcast root's ``buf`` in place (blocking, under ``call``)."""
        size, vrank = self.ctx.size, (self.ctx.rank - root) % self.ctx.size
        mask = 1
        while mask < size:
            if vrank & mask:
                call.transfer(recvs=[(buf, (vrank - mask + root) % size)])
                break
            mask <<= 1
        children = []
        mask >>= 1
        while mask:
            if vrank + mask < size:
                children.append((buf, (vrank + mask + root) % size))
            mask >>= 1
        if children:
            call.transfer(sends=children)

    start = run   # the registry's contract names a start; a broadcast runs blocking

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: int) -> Cost:
        """The root sends the whole buffer once per level."""
        steps = max(1, (size - 1).bit_length())
        return Cost(steps, steps * nbytes, 0.0)


register_algorithm("binomial", Binomial, collective="broadcast", auto=True,
                   help="down a binomial tree, the whole buffer per level (small buffers)")
