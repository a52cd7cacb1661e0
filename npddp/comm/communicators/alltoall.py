"""All-to-all over point-to-point messages: ``alltoall`` (equal blocks) and ``alltoallv`` (counts per peer).

:class:`AllToAll` is a base of :class:`~npddp.comm.communicators.p2p.P2PCommunicator`. Both calls cut
the send buffer into one contiguous block per destination and the output into one per source,
then run the rounds of a registered all-to-all algorithm (:mod:`npddp.comm.engine.exchange`;
``pairwise``, ``bruck``, ``direct`` in :mod:`npddp.comm.algorithms`), chosen by name with
``create(..., algorithms={"alltoall": name})`` or by ``auto`` from their costs (:mod:`.choice`). The blocking call is the non-blocking one
waited on, so both give the same bits.

Argument check. ``alltoall``'s signature carries its dtype and element count, which every rank
passes alike. ``alltoallv``'s signature carries its dtype; its counts differ per rank, so with the
check on every rank first trades its row of counts with every peer (:mod:`npddp.comm.signature`)
and every rank raises the same CollectiveMismatchError, before any data moves, when rank i's
``sendcounts[j]`` differs from rank j's ``recvcounts[i]``. Blocks of zero elements send no message
(after that trade, every rank has compared signatures with every peer).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from npddp.comm import checks as c
from npddp.comm import signature as sg
from npddp.comm.communicators.choice import AUTO
from npddp.comm.engine.exchange import blocks
from npddp.comm.engine.work import DoneWork

class AllToAll:
    """``alltoall``/``alltoallv`` and their non-blocking forms for a communicator with ``_begin`` (CallLifecycle)
    and ``choice`` (:class:`~npddp.comm.communicators.choice.CollectiveChoice`), which names the schedule."""

    def _exchange(self, nbytes: int, equal: bool):
        """The all-to-all algorithm of a call of ``nbytes`` (its send buffer): the one chosen for the collective
        (``create(..., algorithms={"alltoall": name})``), or ``auto``'s pick at that size; an ``alltoallv``, whose
        size differs per rank, runs ``pairwise`` under ``auto`` (every rank must run one schedule)."""
        if equal:
            return self.choice.algorithm("alltoall", nbytes)
        name = self.choice.chosen["alltoall"]
        return self.choice.named("alltoall", "pairwise" if name == AUTO else name)

    def alltoall(self, buf, out=None):
        """Rank r's ``buf[j]`` lands in rank j's ``out[r]``; ``buf`` and ``out`` of shape ``(size, *block)``."""
        return self._open_alltoall(buf, out, "alltoall").wait()

    def ialltoall(self, buf, out=None):
        """Start :meth:`alltoall` into ``out`` (None: a new array); its Work's ``wait`` returns ``out``."""
        return self._open_alltoall(buf, out, "ialltoall")

    def _open_alltoall(self, buf, out, operation: str):
        """Check an all-to-all's arguments, open its call, copy this rank's own block; its Work."""
        out = c.check_alltoall(buf, out, self._size)
        call = self._begin(operation, None, buf)
        size, rank = self._size, self._rank
        rows = out.reshape(size, -1)   # (size, block elements)
        rows[rank] = buf.reshape(size, -1)[rank]
        if buf.size == 0 or size == 1:
            self._signed_empty(call)
            return DoneWork(out)
        counts = np.full(size, rows.shape[1], dtype=np.int64)
        return self._alltoall_work(call, buf.reshape(-1), rows.reshape(-1), counts, counts, True, out)

    def alltoallv(self, buf, sendcounts, recvcounts, out=None):
        """Rank r's block j (``sendcounts[j]`` elements of flat ``buf``, blocks in rank order) lands as block r of
        rank j's 1-d ``out`` (``recvcounts[r]`` elements, blocks in rank order); returns ``out``."""
        return self._open_alltoallv(buf, sendcounts, recvcounts, out, "alltoallv").wait()

    def ialltoallv(self, buf, sendcounts, recvcounts, out=None):
        """Start :meth:`alltoallv` into ``out`` (None: a new array); its Work's ``wait`` returns ``out``."""
        return self._open_alltoallv(buf, sendcounts, recvcounts, out, "ialltoallv")

    def _open_alltoallv(self, buf, sendcounts, recvcounts, out, operation: str):
        """Check an all-to-all-v's arguments, open its call, copy this rank's own block; its Work."""
        send, recv, flat, out = c.check_alltoallv(buf, sendcounts, recvcounts, out, self._size, self._rank)
        call = self._begin(operation, None, sg.typed(buf.dtype))
        rank = self._rank
        blocks(out, recv)[rank][...] = blocks(flat, send)[rank]
        if self._size == 1:
            return DoneWork(out)
        return self._alltoall_work(call, flat, out, send, recv, False, out)

    def _alltoall_work(self, call, flat, out, send, recv, agreed: bool, result):
        """The algorithm's rounds moving ``send``'s blocks of ``flat`` into ``recv``'s blocks of ``out``; first, with
        the check on and counts not ``agreed`` by the signature (alltoallv), every rank's row of counts traded and
        compared."""
        first = [self._counts_round(call, send, recv)] if not agreed and call.signature is not None else []
        work = self._exchange(flat.nbytes, agreed).start(call, flat, out, send, recv, agreed, result, first)
        if work.__class__ is DoneWork:   # nothing moves here, and the signature travels with no data message
            self._signed_empty(call)
        return work

    def _counts_round(self, call, send, recv) -> tuple:
        """The round that trades this rank's row of counts with every peer, then compares the whole table."""
        rank, size = self._rank, self._size
        table = sg.counts_table(send, recv, rank)
        peers = [p for p in range(size) if p != rank]
        return ([(table[rank], p) for p in peers], [(table[p], p) for p in peers],
                partial(self._agree_counts, call, table))

    def _agree_counts(self, call, table) -> None:
        """CollectiveMismatchError on every rank alike (and close) unless every pair's counts in ``table`` agree."""
        pair = sg.counts_disagreement(table)
        if pair is not None:
            text = sg.counts_message(call.number, table, pair)
            self._abandon_all(text, [], table)
            raise sg.CollectiveMismatchError(f"[{self.who()}] {text}; this communicator is now closed")
