"""The default argument check of the hand-written backends: the signature rides in each call's first messages.

When a signed call opens, its messages go through a :class:`SignedCall`. Its first message to
each peer carries the call's signature (:mod:`npddp.comm.signature`, :data:`HEAD_BYTES` bytes) at
its head, and its first receive from each peer checks the peer's signature before the
algorithm sees any data:

* A first message of at most :data:`SMALL_BYTES` goes as one message ``[signature | payload]``
  from a staging buffer; the receiver receives it into a staging buffer, checks the signature,
  then copies the payload to the algorithm's buffer. No extra message, no wait.
* A larger first message goes as the signature alone, then the payload, back to back under the
  call's tag; the receiver posts both receives at once (the signature into a staging buffer, the
  payload straight into the algorithm's buffer), and the payload's receive completes only after
  the signature, which arrives first (one pair and tag keep their order), has matched.

A staging buffer holds any small first message, so whichever way a peer sent its first message
the receiver reads its signature. A receive that fails on the first message from a peer (a
message of unexpected size) counts as a mismatch on that edge too. Later messages to and from a
peer pass through unchanged, and so do messages under user tags (``send``/``recv``). Staging
buffers come from a pool (:class:`Staging`) that grows to the first messages in flight, so
steady-state calls allocate nothing that lasts.

A rank that finds a mismatch stops: it sends an abort (its own and the peer's signature) to every
rank under :data:`CONTROL_TAG`, and raises :class:`~npddp.comm.signature.CollectiveMismatchError`.
A wait that lasts (the engine's clock reads) looks for aborts (:class:`AbortWatch`), so a rank
waiting on a rank that stopped raises the same error instead of hanging. After a mismatch the
communicator is closed: its ranks stand at different calls.
"""

from __future__ import annotations

import time

import numpy as np

from npddp.comm import checks as c
from npddp.comm import signature as sg
from npddp.comm.engine.call import Call
from npddp.comm.engine.deadline import wait_until

#: The tag of aborts: the last collective tag, which :class:`~npddp.comm.engine.call.TagSequence` never hands out.
CONTROL_TAG = c.USER_TAG_LIMIT + c.COLLECTIVE_TAG_SPAN - 1
#: Words of an abort: the rank that found the mismatch, the peer, then both signatures.
ABORT_WORDS = 2 + 2 * sg.WORDS
#: Bytes of the signature at the head of a first message.
HEAD_BYTES = sg.HEAD.size
#: First messages of at most this many bytes travel in one message with the signature (copied through staging).
SMALL_BYTES = 8192
_pack_into, _unpack_from, _agree = sg.HEAD.pack_into, sg.HEAD.unpack_from, sg.agree


class Staging:
    """Reusable buffers for first messages, lent and given back: whole ones (``HEAD_BYTES + SMALL_BYTES`` bytes,
    for every first receive and small first send) and heads (``HEAD_BYTES``, the signature ahead of a large send).

    A buffer is a pair: the array that goes to the transport, and a memoryview of it for copies
    (cheaper than NumPy's for messages this small)."""

    __slots__ = ("free", "nbytes")

    def __init__(self):
        self.free: dict[int, list] = {HEAD_BYTES + SMALL_BYTES: [], HEAD_BYTES: []}   # bytes -> free buffers
        self.nbytes = 0   # bytes of the buffers the pool owns, free and lent

    def take(self, nbytes: int = HEAD_BYTES + SMALL_BYTES) -> tuple:
        """A free buffer of ``nbytes`` (a new one only when all are lent: the pool grows to the calls in flight)."""
        free = self.free[nbytes]
        if free:
            return free.pop()
        self.nbytes += nbytes
        array = np.empty(nbytes, dtype=np.uint8)
        return array, array.data

    def give(self, stage: tuple) -> None:
        """Take back a buffer lent by :meth:`take`."""
        self.free[len(stage[1])].append(stage)


class SignedSend:
    """A first send: the staged message (``head``: signature and small payload, or signature only), then ``data``."""

    __slots__ = ("head", "data", "stage", "staging")

    def __init__(self, head, data, stage, staging):
        self.head, self.data, self.stage, self.staging = head, data, stage, staging

    def test(self) -> bool:
        """True once every part has been sent (the staging buffer then goes back to the pool)."""
        if self.stage is not None:
            if not self.head.test():
                return False
            self.staging.give(self.stage)
            self.stage = None
        return self.data is None or self.data.test()

    def complete(self, call) -> None:
        """Wait through ``call``'s deadline loop, polling the transport's own requests (no wrapper per poll)."""
        if self.stage is not None:
            wait_until(self.head.test, call.overdue)
            self.staging.give(self.stage)
            self.stage = None
        if self.data is not None:
            wait_until(self.data.test, call.overdue)

    def cancel(self) -> None:
        """Abandon the parts still in flight (their staging buffer stays out of the pool)."""
        if self.stage is not None:
            self.head.cancel()
        if self.data is not None:
            self.data.cancel()


class SignedRecv:
    """A first receive: the staged message is checked against the call's signature before any payload counts."""

    __slots__ = ("call", "source", "head", "data", "stage", "buf", "error")

    def __init__(self, call, source: int, head, data, stage, buf):
        self.call, self.source, self.head, self.data, self.stage, self.buf = call, source, head, data, stage, buf
        self.error = None

    def test(self) -> bool:
        """True once the payload is in the buffer; CollectiveMismatchError if the peer's signature differs."""
        if self.stage is not None:
            if self.error is not None:
                raise self.error
            try:
                if not self.head.test():
                    return False
            except (ValueError, RuntimeError) as exc:
                raise self._unfit(exc) from None
            self._check()
        return self.data is None or self.data.test()

    def complete(self, call) -> None:
        """Wait through ``call``'s deadline loop, polling the transport's own requests (no wrapper per poll);
        the signature is checked once, when its message is in."""
        if self.stage is not None:
            if self.error is not None:
                raise self.error
            try:
                wait_until(self.head.test, call.overdue)
            except (ValueError, RuntimeError) as exc:
                raise self._unfit(exc) from None
            self._check()
        if self.data is not None:
            wait_until(self.data.test, call.overdue)

    def _unfit(self, exc: Exception) -> Exception:
        """The error of a first message that did not fit (its sender called otherwise): a mismatch on this edge."""
        if isinstance(exc, sg.CollectiveMismatchError):
            return exc
        call = self.call
        self.error = call.owner.mismatch(call.number, self.source, call.sig, sg.UNKNOWN)
        return self.error

    def _check(self) -> None:
        """The first message is in: check the peer's signature, copy a small payload out, give back the stage."""
        call, stage = self.call, self.stage
        theirs = _unpack_from(stage[1])
        if theirs != call.sig and not _agree(call.sig, theirs):
            self.error = call.owner.mismatch(call.number, self.source, call.sig, theirs)
            raise self.error
        if self.data is None:
            n = self.buf.nbytes
            if n:
                self.buf.data.cast("B")[:] = stage[1][HEAD_BYTES:HEAD_BYTES + n]
        self.stage = None
        call.staging.give(stage)

    def cancel(self) -> None:
        """Abandon the parts still in flight."""
        if self.stage is not None:
            self.head.cancel()
        if self.data is not None:
            self.data.cancel()


class SignedCall(Call):
    """A call whose messages go through itself: the first message each way between two ranks carries the signature.

    It is its own ``transport``: ``isend``/``irecv`` sign or check the first message to or from
    each peer and pass the others to the communicator's transport (``raw``)."""

    __slots__ = ("raw", "staging", "sig", "sent", "heard")

    def __init__(self, owner, operation: str, number: int, tag: int, staging: Staging, sig: tuple):
        # Call's fields (but transport, a property here) set without Call.__init__: this runs once per call
        self.owner, self.operation, self.number, self.tag = owner, operation, number, tag
        self.expires, self.rounds, self.scale, self.signature = 0.0, 0, 0.0, sig
        self.raw, self.staging, self.sig = owner.transport, staging, sig
        self.sent = self.heard = 0   # bit p: the first message to (from) peer p is posted

    @property
    def transport(self):
        """The call itself (a property, not a field: a reference to itself would keep it alive until a collection)."""
        return self

    @property
    def name(self) -> str:
        """The transport's name."""
        return self.raw.name

    def isend(self, buf, dest: int, tag: int):
        """Send ``buf``; the first message to ``dest`` carries the signature."""
        bit = 1 << dest
        if self.sent & bit:
            return self.raw.isend(buf, dest, tag)
        self.sent |= bit
        n = buf.nbytes
        if n <= SMALL_BYTES:
            stage = self.staging.take()
            array, view = stage
            _pack_into(view, 0, *self.sig)
            if n:
                view[HEAD_BYTES:HEAD_BYTES + n] = buf.data.cast("B")
            return SignedSend(self.raw.isend(array[:HEAD_BYTES + n], dest, tag), None, stage, self.staging)
        stage = self.staging.take(HEAD_BYTES)
        _pack_into(stage[1], 0, *self.sig)
        raw = self.raw
        return SignedSend(raw.isend(stage[0], dest, tag), raw.isend(buf, dest, tag), stage, self.staging)

    def wait(self, request) -> None:
        """Complete ``request``; a signed one polls the transport's requests inside it directly."""
        if type(request) in _SIGNED:
            request.complete(self)
        else:
            wait_until(request.test, self.overdue)

    def irecv(self, buf, source: int, tag: int):
        """Receive into ``buf``; the first message from ``source`` is checked before it counts as received."""
        bit = 1 << source
        if self.heard & bit:
            return self.raw.irecv(buf, source, tag)
        self.heard |= bit
        stage = self.staging.take()
        raw = self.raw
        head = raw.irecv(stage[0], source, tag)
        data = raw.irecv(buf, source, tag) if buf.nbytes > SMALL_BYTES else None
        return SignedRecv(self, source, head, data, stage, buf)


_SIGNED = (SignedSend, SignedRecv)


class Signer:
    """What a communicator's signed calls share: the staging pool."""

    __slots__ = ("staging",)

    def __init__(self):
        self.staging = Staging()

    def open(self, owner, operation: str, number: int, tag: int, buf=None, op=None, root=None) -> Call:
        """The call about to run: signed if it is a collective, else a plain :class:`Call`."""
        if sg.kind_code(operation) < 0:
            return Call(owner, operation, number, tag)
        return SignedCall(owner, operation, number, tag, self.staging, sg.words(operation, number, buf, op, root))


class AbortWatch:
    """One receive per peer on :data:`CONTROL_TAG`: a peer that found a mismatch tells every rank.

    The receives are posted at the first look (the first wait that lasts), not before, and over MPI
    they stay posted. Over TCP they are posted for each look only and withdrawn after it: a receive
    left posted would have the transport read every peer's socket at every poll and read early
    frames aside into buffers of their own instead of leaving them in the socket (see
    :mod:`npddp.comm.transports.peer`); between looks an abort waits in the transport like any early message.
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

    def tell_all(self, found: np.ndarray, seconds: float) -> None:
        """Send abort ``found`` to every peer; wait at most ``seconds`` for the sends to complete."""
        sends = [self.transport.isend(found, p, CONTROL_TAG) for p in range(self.size) if p != self.rank]
        expires = time.monotonic() + seconds
        while not all([r.test() for r in sends]) and time.monotonic() < expires:
            time.sleep(0)
