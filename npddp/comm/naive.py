"""Baseline backend: every collective goes through rank 0 over MPI point-to-point calls.

All-reduce gathers every buffer to rank 0, reduces there in rank order ((x0 op x1) op x2) ...,
and sends the result to every rank: O(N) messages of the full buffer through one rank, the
traffic pattern the ring backend exists to beat.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from . import _common as c
from .p2p import P2PCommunicator, RoundWork

ROOT = 0


class NaiveCommunicator(P2PCommunicator):
    """Root-based collectives over point-to-point calls: gather to rank 0, compute there, send back."""

    name = "naive"

    def __init__(self, mpi_comm=None):
        super().__init__(mpi_comm)
        self._empty = np.empty(0, dtype=np.uint8)

    def barrier(self) -> None:
        """Every rank signals rank 0; rank 0 answers each once it has heard from all."""
        tag = self._tags.next()
        others = range(1, self._size)
        if self._rank == ROOT:
            for source in others:
                self.comm.Recv(self._empty, source=source, tag=tag)
            for dest in others:
                self.comm.Send(self._empty, dest=dest, tag=tag)
        else:
            self.comm.Send(self._empty, dest=ROOT, tag=tag)
            self.comm.Recv(self._empty, source=ROOT, tag=tag)

    def broadcast(self, buf, root=0):
        """Root sends ``buf`` to every other rank in turn."""
        c.check_buffer(buf)
        root = c.check_rank(root, self._size)
        tag = self._tags.next()
        if buf.size:
            if self._rank == root:
                for dest in range(self._size):
                    if dest != root:
                        self.comm.Send(buf, dest=dest, tag=tag)
            else:
                self.comm.Recv(buf, source=root, tag=tag)
        return buf

    def _allreduce_work(self, src, dst, ufunc, tag, result):
        """Rounds: rank 0 receives and reduces each rank's buffer in rank order, then sends the result to all."""
        if self._rank != ROOT:
            rounds = [([(src, ROOT)], (), None), ((), [(dst, ROOT)], None)]
            return RoundWork(self.comm, tag, rounds, self._active, result)
        raw = self.scratch.acquire(src.nbytes)
        got = np.frombuffer(raw, dtype=src.dtype, count=src.size)  # (n,)
        rounds = [((), [(got, source)], partial(ufunc, src if source == 1 else dst, got, out=dst))
                  for source in range(1, self._size)]
        rounds.append(([(dst, dest) for dest in range(1, self._size)], (), None))
        return RoundWork(self.comm, tag, rounds, self._active, result, partial(self.scratch.release, raw))

    def reduce_scatter(self, buf, op="sum"):
        """Rank 0 receives and reduces every buffer in rank order, then sends each rank its block."""
        ufunc = c.check_op(op)
        c.check_buffer(buf, writable=False)
        tag = self._tags.next()
        flat = buf.reshape(-1)
        bounds = c.block_bounds(flat.size, self._size).tolist()
        out = np.empty(bounds[self._rank + 1] - bounds[self._rank], dtype=buf.dtype)
        if flat.size == 0 or self._size == 1:
            np.copyto(out, flat)
            return out
        if self._rank != ROOT:
            self.comm.Send(flat, dest=ROOT, tag=tag)
            self.comm.Recv(out, source=ROOT, tag=tag)
            return out
        total = flat.copy()  # (n,)
        raw = self.scratch.acquire(flat.nbytes)
        got = np.frombuffer(raw, dtype=buf.dtype, count=flat.size)  # (n,)
        for source in range(1, self._size):
            self.comm.Recv(got, source=source, tag=tag)
            ufunc(total, got, out=total)
        del got
        self.scratch.release(raw)
        np.copyto(out, total[:bounds[1]])
        for dest in range(1, self._size):
            self.comm.Send(total[bounds[dest]:bounds[dest + 1]], dest=dest, tag=tag)
        return out

    def allgather(self, buf):
        """Gather to rank 0, then broadcast the stacked array from rank 0."""
        c.check_buffer(buf, writable=False)
        stacked = self.gather(buf, ROOT)
        if stacked is None:
            stacked = np.empty((self._size, *buf.shape), dtype=buf.dtype)
        return self.broadcast(stacked, ROOT)
