"""Aborts: a rank that found a mismatch tells every rank, under a tag of their own, so none waits for it.

An abort is :data:`ABORT_WORDS` int64 words (the rank that found the mismatch, the peer, then both
signatures: :mod:`npddp.comm.signature`) sent under :data:`CONTROL_TAG` (:meth:`AbortWatch.tell_all`);
a wait that lasts looks for them (:meth:`AbortWatch.heard`) and raises the same
:class:`~npddp.comm.signature.CollectiveMismatchError`. The argument check that finds mismatches is
:mod:`npddp.comm.engine.signed`.
"""

from __future__ import annotations

import time

import numpy as np

from npddp.comm import checks as c
from npddp.comm import signature as sg

#: The tag of aborts: the last collective tag, which :class:`~npddp.comm.engine.call.TagSequence` never hands out.
CONTROL_TAG = c.USER_TAG_LIMIT + c.COLLECTIVE_TAG_SPAN - 1
#: Words of an abort: the rank that found the mismatch, the peer, then both signatures.
ABORT_WORDS = 2 + 2 * sg.WORDS


class AbortWatch:
    """One receive per peer on :data:`CONTROL_TAG`: a peer that found a mismatch tells every rank.

    The receives are posted at the first look (the first wait that lasts), not before, and over MPI
    they stay posted until the communicator is collected or the process ends (:meth:`withdraw`).
    Over TCP they are posted for each look only and withdrawn after it: a receive left posted would
    have the transport read every peer's socket at every poll and read early frames aside into
    buffers of their own instead of leaving them in the socket (see :mod:`npddp.comm.transports.peer`);
    between looks an abort waits in the transport like any early message.
    """

    def __init__(self, transport):
        self.transport, self.rank, self.size = transport, transport.rank, transport.size
        self.inbox = np.zeros((self.size, ABORT_WORDS), dtype=np.int64)  # row p: peer p's abort
        self.found: np.ndarray | None = None   # the abort heard (its row of the inbox)
        self.requests: list | None = None
        self.transient = transport.name == "tcp"   # post for each look only

    def heard(self) -> str | None:
        """The message of an abort that has arrived, or None."""
        if self.requests is None:
            self.requests = [(p, self.transport.irecv(self.inbox[p], p, CONTROL_TAG))
                             for p in range(self.size) if p != self.rank]
        for p, request in self.requests:
            if request.test():
                row = self.found = self.inbox[p]
                finder, peer = int(row[0]), int(row[1])
                mine, theirs = row[2:2 + sg.WORDS], row[2 + sg.WORDS:]
                return sg.message(int(mine[1]), finder, mine, peer, theirs, found_by=finder)
        if self.transient:
            for _, request in self.requests:
                request.cancel()
            self.requests = None
        return None

    def withdraw(self) -> None:
        """Cancel the receives still posted: the communicator is gone, or the process is ending.

        Left posted on a group the user passed, they would take a later communicator's aborts on
        it and hold the group in MPI until MPI_Finalize (which MPICH reports)."""
        requests, self.requests = self.requests or (), None
        for _, request in requests:
            try:
                request.cancel()
            except ConnectionError:
                pass

    def tell_all(self, found: np.ndarray, seconds: float) -> None:
        """Send abort ``found`` to every peer; wait at most ``seconds`` for the sends to complete."""
        sends = [self.transport.isend(found, p, CONTROL_TAG) for p in range(self.size) if p != self.rank]
        expires = time.monotonic() + seconds
        while not all([r.test() for r in sends]) and time.monotonic() < expires:
            time.sleep(0)
