"""Broadcast down a pipelined chain: root -> root + 1 -> ..., each rank forwarding a chunk as soon as it has arrived.

The buffer goes as chunks of ``chunk_bytes``; N - 2 + (chunks) steps, every rank sending the buffer
once: the schedule for large buffers on more than two ranks.
"""

from __future__ import annotations

import math

from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.engine.cost import Cost
from npddp.comm.engine.deadline import Overdue


class Chain:
    """Root -> root+1 -> ...: each rank forwards a chunk as soon as it has arrived."""

    def __init__(self, ctx):
        self.ctx = ctx

    def run(self, call, flat, root: int) -> None:
        """Broadcast root's 1-d ``flat`` in place (blocking, under ``call``)."""
        rank, size = self.ctx.rank, self.ctx.size
        vrank, tag, owner = (rank - root) % size, call.tag, call.owner
        seg = max(1, self.ctx.chunk_bytes // flat.itemsize)
        parts = [flat[i:i + seg] for i in range(0, flat.size, seg)]
        left, right = (rank - 1) % size, (rank + 1) % size
        if vrank == 0:
            call.transfer(sends=[(p, right) for p in parts])
            return
        transport, recvs, sends = call.transport, [], []
        try:
            recvs += [(transport.irecv(p, left, tag), left) for p in parts]
            for p, (req, _) in zip(parts, recvs):
                call.wait(req)
                if vrank < size - 1:
                    sends.append((transport.isend(p, right, tag), right))
            for req, _ in sends:
                call.wait(req)
        except Overdue:
            raise owner.give_up(call, recvs, sends, parts) from None
        except ConnectionError as exc:
            raise owner.fail(call, exc, recvs, sends, parts) from None
        except Exception:   # a mismatch found while waiting
            owner.strand(recvs + sends, parts)
            raise

    start = run   # the registry's contract names a start; a broadcast runs blocking

    @staticmethod
    def cost(nbytes: float, size: int, chunk_bytes: int) -> Cost:
        """Each rank sends the buffer once; the last chunk leaves the root N - 2 steps before it reaches the end."""
        chunks = max(1, math.ceil(nbytes / max(1, chunk_bytes)))
        return Cost(size - 2 + chunks, nbytes, 0.0)


register_algorithm("chain", Chain, collective="broadcast", auto=True,
                   help="down a chain of ranks in pipelined chunks (large buffers)")
