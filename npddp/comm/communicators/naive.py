"""``naive``: every collective through rank 0 (the all-reduce by :class:`~npddp.comm.algorithms.naive.Naive`), the traffic pattern the other backends exist to beat."""

from __future__ import annotations

from functools import partial

import numpy as np

from npddp.comm import checks as c
from npddp.comm import signature as sg
from npddp.comm.engine.exchange import blocks
from npddp.comm.communicators.p2p import P2PCommunicator
from npddp.comm.engine.work import DoneWork, RoundWork
from npddp.comm.algorithms.naive import ROOT


class NaiveCommunicator(P2PCommunicator):
    """Root-based collectives over point-to-point messages: gather to rank 0, compute there, send back."""

    def barrier(self) -> None:
        """Every rank signals rank 0; rank 0 answers each once it has heard from all."""
        call = self._begin("barrier")
        if self._rank == ROOT:
            others = range(1, self._size)
            call.transfer(recvs=[(self._empty, source) for source in others])
            call.transfer(sends=[(self._empty, dest) for dest in others])
        else:
            call.transfer(sends=[(self._empty, ROOT)])
            call.transfer(recvs=[(self._empty, ROOT)])

    def broadcast(self, buf, root=0):
        """Root sends ``buf`` to every other rank (all sends posted at once)."""
        c.check_buffer(buf)
        root = c.check_rank(root, self._size)
        call = self._begin("broadcast", None, buf, None, root)
        self._signed_empty(call)   # the root receives nothing: it compares its signature with every peer's first
        if buf.size and self._size > 1:
            if self._rank == root:
                call.transfer(sends=[(buf, dest) for dest in range(self._size) if dest != root])
            else:
                call.transfer(recvs=[(buf, root)])
        return buf

    def reduce_scatter(self, buf, op="sum"):
        """Rank 0 receives and reduces every buffer in rank order, then sends each rank its block."""
        opened = self._open_reduce_scatter(buf, op, None, "reduce_scatter")
        if isinstance(opened, DoneWork):
            return opened.wait()
        call, flat, ufunc, scale, out = opened
        bounds = c.block_bounds(flat.size, self._size).tolist()
        if self._rank != ROOT:
            call.transfer(recvs=[(out, ROOT)], sends=[(flat, ROOT)])
            return out
        total = flat.copy()  # (n,)
        raw = self.scratch.acquire(flat.nbytes)
        got = np.frombuffer(raw, dtype=buf.dtype, count=flat.size)  # (n,)
        for source in range(1, self._size):
            call.transfer(recvs=[(got, source)])
            ufunc(total, got, out=total)
        del got
        self.scratch.release(raw)
        if scale:
            np.multiply(total, scale, out=total)
        np.copyto(out, total[:bounds[1]])
        call.transfer(sends=[(total[bounds[d]:bounds[d + 1]], d) for d in range(1, self._size)])
        return out

    def allgather(self, buf):
        """Rank 0 receives every rank's buffer, then sends the stacked array to every rank."""
        c.check_buffer(buf, writable=False)
        call = self._begin("allgather", None, buf)
        out = np.empty((self._size, *buf.shape), dtype=buf.dtype)
        rows = out.reshape(self._size, -1)  # (size, buf.size)
        rows[self._rank] = buf.reshape(-1)
        if buf.size and self._size > 1:
            others = range(1, self._size)
            if self._rank == ROOT:
                call.transfer(recvs=[(rows[source], source) for source in others])
                call.transfer(sends=[(out, dest) for dest in others])
            else:
                call.transfer(sends=[(buf, ROOT)])
                call.transfer(recvs=[(out, ROOT)])
        else:
            self._signed_empty(call)
        return out

    def ireduce_scatter(self, buf, op="sum", out=None):
        """:meth:`reduce_scatter`'s rounds (the same bits), non-blocking: rank 0 reduces in rank order."""
        opened = self._open_reduce_scatter(buf, op, out, "ireduce_scatter")
        if isinstance(opened, DoneWork):
            return opened
        call, flat, ufunc, scale, out = opened
        if self._rank != ROOT:
            return RoundWork(call, [([(flat, ROOT)], [(out, ROOT)], None)], out)
        bounds = c.block_bounds(flat.size, self._size).tolist()
        raw = self.scratch.acquire(2 * flat.nbytes)
        total, got = np.frombuffer(raw, dtype=buf.dtype, count=2 * flat.size).reshape(2, -1)  # (n,) each
        np.copyto(total, flat)
        rounds = [((), [(got, source)], partial(ufunc, total, got, out=total)) for source in range(1, self._size)]
        if scale:  # op avg: the sum scaled before the blocks go out, as the blocking call does
            rounds.append(((), (), partial(np.multiply, total, scale, out=total)))
        rounds.append(([(total[bounds[d]:bounds[d + 1]], d) for d in range(1, self._size)], (),
                       partial(np.copyto, out, total[:bounds[1]])))
        return RoundWork(call, rounds, out, partial(self.scratch.release, raw))

    def iallgather(self, buf, out=None):
        """:meth:`allgather` non-blocking: rank 0 receives every buffer, then sends the stack to all."""
        c.check_buffer(buf, writable=False)
        out = c.check_stacked_out(buf, out, self._size, self._rank)
        call = self._begin("iallgather", None, buf)
        rows = out.reshape(self._size, -1)  # (size, buf.size)
        if not c.is_row(buf, out, self._rank):
            rows[self._rank] = buf.reshape(-1)
        if buf.size == 0 or self._size == 1:
            self._signed_empty(call)
            return DoneWork(out)
        if self._rank == ROOT:
            others = range(1, self._size)
            rounds = [((), [(rows[source], source) for source in others], None),
                      ([(out, dest) for dest in others], (), None)]
        else:
            rounds = [([(rows[self._rank], ROOT)], (), None), ((), [(out, ROOT)], None)]
        return RoundWork(call, rounds, out)

    def _alltoall_work(self, call, flat, out, send, recv, agreed: bool, result):
        """All-to-all through rank 0: every rank sends its whole buffer there, rank 0 sends each rank its blocks.
        Rank 0 needs every rank's counts: an ``alltoallv`` first gathers the rows of counts there and sends the table
        back to all (every rank compares it alike)."""
        size, rank = self._size, self._rank
        if agreed:   # equal blocks: the table is known everywhere
            table = np.tile(np.concatenate([send, recv]), (size, 1))   # (size, 2 * size)
            rounds = self._routed(flat, out, table)
            return RoundWork(call, rounds, result) if rounds else DoneWork(result)
        table = sg.counts_table(send, recv, rank)
        others = range(1, size)
        rounds: list = []
        then = partial(self._route_after, call, flat, out, table, rounds)
        if rank == ROOT:
            rounds += [((), [(table[s], s) for s in others], None), ([(table, d) for d in others], (), then)]
        else:
            rounds += [([(table[rank], ROOT)], (), None), ((), [(table, ROOT)], then)]
        return RoundWork(call, rounds, result)

    def _route_after(self, call, flat, out, table, rounds: list) -> None:
        """The table is in: compare it, then add the data rounds."""
        self._agree_counts(call, table)
        rounds += self._routed(flat, out, table)

    def _routed(self, flat, out, table) -> list:
        """Rounds moving every rank's blocks through rank 0, given every rank's counts ``table`` (size, 2 * size)."""
        size, rank = self._size, self._rank
        sent = table[:, :size]   # sent[i, j]: elements rank i sends rank j
        if rank != ROOT:
            sends = [(flat, ROOT)] if flat.size else []
            recvs = [(out, ROOT)] if out.size else []
            return [(sends, recvs, None)] if sends or recvs else []
        got = [flat] + [np.empty(int(sent[s].sum()), dtype=flat.dtype) for s in range(1, size)]
        outgoing = [out] + [np.empty(int(sent[:, d].sum()), dtype=flat.dtype) for d in range(1, size)]

        def assemble():
            for d in range(size):
                parts = [blocks(got[s], sent[s])[d] for s in range(size)]
                if outgoing[d].size:
                    np.concatenate(parts, out=outgoing[d])
        return [((), [(got[s], s) for s in range(1, size) if got[s].size], assemble),
                ([(outgoing[d], d) for d in range(1, size) if outgoing[d].size], (), None)]
