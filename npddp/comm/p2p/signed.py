"""The default argument check of the hand-written backends: a signature ahead of each call's first message.

:class:`SignedTransport` stands between the algorithms and the transport. When a call opens
(:meth:`open`), its signature (:mod:`npddp.comm.signature`) is registered under the call's tag. The
first send of that call to each peer is preceded by the signature, under the same tag, so it
arrives first (messages of one pair and tag keep their order); the receives from each peer are held back until the peer's signature has arrived and matched (then
posted in order). So a mismatch is found before any data of that peer lands anywhere, and
whatever the algorithm, every edge of its schedule is checked.

A rank that finds a mismatch stops: it sends an abort (its own and the peer's signature) to every
rank under :data:`CONTROL_TAG`, and raises :class:`CollectiveMismatchError`. Every rank keeps one
receive per peer posted on that tag (:class:`AbortWatch`); a wait that lasts (the engine's clock
reads) looks at them, so a rank waiting on a rank that stopped raises the same error instead of
hanging. After a mismatch the communicator is closed: its ranks stand at different calls.

Cost: one message of ``WORDS`` int64s per peer a call sends to, sent back to back with the data.
Messages under user tags (``send``/``recv``) pass through unchanged.
"""

from __future__ import annotations

import time

import numpy as np

from npddp.comm import checks as c
from npddp.comm import signature as sg

#: The tag of aborts: the last collective tag, which :class:`~npddp.comm.p2p.engine.TagSequence` never hands out.
CONTROL_TAG = c.USER_TAG_LIMIT + c.COLLECTIVE_TAG_SPAN - 1
#: Words of an abort: the rank that found the mismatch, the peer, then both signatures.
ABORT_WORDS = 2 + 2 * sg.WORDS


class HeaderFirst:
    """A send completing once the signature's send (``first``) and the data's (``then``) have completed."""

    __slots__ = ("first", "then")

    def __init__(self, first, then):
        self.first, self.then = first, then

    def test(self) -> bool:
        """True once both have completed."""
        if self.first is not None:
            if not self.first.test():
                return False
            self.first = None
        return self.then.test()

    def cancel(self) -> None:
        """Abandon both."""
        if self.first is not None:
            self.first.cancel()
        self.then.cancel()


class _Inbound:
    """A peer's signature in one call, and the receives from that peer held back until it has matched.

    Holding them back keeps a mismatched message from ever landing in (or overflowing) a buffer,
    and posting them in order afterwards keeps the pair's message order.
    """

    __slots__ = ("header", "theirs", "queued", "checked", "check")

    def __init__(self, header, theirs, check):
        self.header, self.theirs, self.check = header, theirs, check
        self.queued: list = []
        self.checked = False

    def ready(self) -> bool:
        """True once the signature has arrived and matched (then the held receives are posted)."""
        if self.checked:
            return True
        if not self.header.test():
            return False
        self.check(self.theirs)
        self.checked = True
        for held in self.queued:
            held.request = held.post()
        self.queued = []
        return True


class HeldRecv:
    """A receive posted only once its peer's signature has matched."""

    __slots__ = ("inbound", "post", "request")

    def __init__(self, inbound: _Inbound, post):
        self.inbound, self.post, self.request = inbound, post, None

    def test(self) -> bool:
        """True once the data has arrived (CollectiveMismatchError if the peer's signature differs)."""
        if self.request is None and not self.inbound.ready():
            return False
        return self.request.test()

    def cancel(self) -> None:
        """Abandon the receive (or the signature's, if the receive was never posted)."""
        if self.request is not None:
            self.request.cancel()
        elif not self.inbound.checked:
            self.inbound.header.cancel()
            self.inbound.checked = True   # nothing more will be posted


class _Open:
    """One open call's signature, the peers it has sent it to, and what it hears from each peer."""

    __slots__ = ("sig", "number", "sent", "inbound")

    def __init__(self, sig: np.ndarray, number: int):
        self.sig, self.number, self.sent, self.inbound = sig, number, set(), {}


class SignedTransport:
    """A transport whose collective messages carry their call's signature; user tags pass through."""

    def __init__(self, transport, owner):
        self.raw, self.owner = transport, owner
        self.name, self.rank, self.size = transport.name, transport.rank, transport.size
        self._open: dict[int, _Open] = {}     # tag -> the call open under it (replaced when the tag comes round)

    def open(self, tag: int, number: int, operation: str, buf=None, op=None, root=None):
        """Register the signature of the call about to run under ``tag``; return it (not a collective: None)."""
        if sg.kind_code(operation) < 0:
            self._open.pop(tag, None)
            return None
        sig = sg.encode(np.empty(sg.WORDS, dtype=np.int64), operation, number, buf, op, root)
        self._open[tag] = _Open(sig, number)
        return sig

    def isend(self, buf, dest: int, tag: int):
        """Send ``buf``; the call's signature goes ahead on its first message to ``dest``."""
        call = self._open.get(tag)
        if call is None or dest in call.sent:
            return self.raw.isend(buf, dest, tag)
        call.sent.add(dest)
        return HeaderFirst(self.raw.isend(call.sig, dest, tag), self.raw.isend(buf, dest, tag))

    def irecv(self, buf, source: int, tag: int):
        """Receive into ``buf``; receives from ``source`` wait behind its signature until it has matched."""
        call = self._open.get(tag)
        if call is None:
            return self.raw.irecv(buf, source, tag)
        inbound = call.inbound.get(source)
        if inbound is None:
            theirs = np.empty(sg.WORDS, dtype=np.int64)
            owner, mine, number = self.owner, call.sig, call.number

            def check(got):
                if not sg.agree(mine, got):
                    raise owner.mismatch(number, source, mine, got)

            inbound = call.inbound[source] = _Inbound(self.raw.irecv(theirs, source, tag), theirs, check)
        elif inbound.checked:
            return self.raw.irecv(buf, source, tag)
        raw = self.raw
        held = HeldRecv(inbound, lambda: raw.irecv(buf, source, tag))
        inbound.queued.append(held)
        return held

    def split(self, colors):
        """The raw transport's split (a new group signs its own calls)."""
        return self.raw.split(colors)


class AbortWatch:
    """One receive per peer on :data:`CONTROL_TAG`: a peer that found a mismatch tells every rank.

    The receives are posted at the first look (the first wait that lasts), not before: until then
    an abort waits in the transport like any early message, and calls that never wait long post nothing.
    """

    def __init__(self, transport):
        self.transport, self.rank, self.size = transport, transport.rank, transport.size
        self.inbox = np.zeros((self.size, ABORT_WORDS), dtype=np.int64)  # row p: peer p's abort
        self.requests: list | None = None

    def heard(self) -> str | None:
        """The message of an abort that has arrived, or None."""
        if self.requests is None:
            self.requests = [(p, self.transport.irecv(self.inbox[p], p, CONTROL_TAG))
                             for p in range(self.size) if p != self.rank]
        for p, request in self.requests:
            if request.test():
                row = self.inbox[p]
                finder, peer = int(row[0]), int(row[1])
                mine, theirs = row[2:2 + sg.WORDS], row[2 + sg.WORDS:]
                return sg.message(int(mine[1]), finder, mine, peer, theirs, found_by=finder)
        return None

    def tell_all(self, found: np.ndarray, seconds: float) -> None:
        """Send abort ``found`` to every peer; wait at most ``seconds`` for the sends to complete."""
        sends = [self.transport.isend(found, p, CONTROL_TAG) for p in range(self.size) if p != self.rank]
        expires = time.monotonic() + seconds
        while not all([r.test() for r in sends]) and time.monotonic() < expires:
            time.sleep(0)
