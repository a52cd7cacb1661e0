"""The default argument check of the hand-written backends: a signature in a call's first messages, then its index.

The first call with a signature is signed in full (below); later calls with it carry only the
signature's index in their tag (:class:`Signer`), so matching calls cost a dictionary lookup.

When a signed call opens, its messages go through a :class:`SignedCall`. Its first message to
each peer carries the call's signature (:mod:`npddp.comm.signature`, :data:`HEAD_BYTES` bytes) at
its head, and its first receive from each peer checks the peer's signature before the
algorithm sees any data:

* A first message of at most :data:`SMALL_BYTES` goes as one message ``[signature | payload]``,
  copied into a fresh array the transport's request keeps until it is sent (no wrapper: the
  call waits on the transport's own request); the receiver receives it into a staging buffer,
  checks the signature, then copies the payload to the algorithm's buffer. No extra message, no wait.
* A larger first message goes as the signature alone, then the payload, back to back under the
  call's tag; the receiver posts both receives at once (the signature into a staging buffer, the
  payload straight into the algorithm's buffer), and the payload's receive completes only after
  the signature, which arrives first (one pair and tag keep their order), has matched.

What a call signs is fixed by its shape: the collective, dtype, count, op and root. The
:class:`Signer` keeps the packed signature of each shape it has seen (:class:`Shape`), so a
repeated call packs nothing. The call's number does not travel in the signature (its word is
-1 on the wire): the tag already carries it (:class:`~npddp.comm.engine.call.TagSequence`), and
a message only ever meets a receive of the same call.

A staging buffer holds any small first message, so whichever way a peer sent its first message
the receiver reads its signature. A receive that fails on the first message from a peer (a
message of unexpected size) counts as a mismatch on that edge too. Later messages to and from a
peer pass through unchanged, and so do messages under user tags (``send``/``recv``). Receive
staging buffers come from a pool (:class:`Staging`) that grows to the first receives in flight,
so steady-state calls allocate nothing that lasts.

A rank that finds a mismatch stops: it sends an abort (its own and the peer's signature) to every
rank (:mod:`npddp.comm.engine.abort`), and raises :class:`~npddp.comm.signature.CollectiveMismatchError`.
A wait that lasts (the engine's clock reads) looks for aborts, so a rank waiting on a rank that
stopped raises the same error instead of hanging. After a mismatch the
communicator is closed: its ranks stand at different calls.
"""

from __future__ import annotations

import numpy as np

from npddp.comm import checks as c
from npddp.comm import signature as sg
from npddp.comm.engine.call import Call
from npddp.comm.engine.deadline import wait_until

#: Bytes of the signature at the head of a first message.
HEAD_BYTES = sg.HEAD.size
#: First messages of at most this many bytes travel in one message with the signature (copied into it, and out
#: of the receiver's staging buffer).
SMALL_BYTES = 8192
_unpack_from, _agree, _frombuffer, _BYTE = sg.HEAD.unpack_from, sg.agree, np.frombuffer, np.dtype(np.uint8)
_STAGE_BYTES = HEAD_BYTES + SMALL_BYTES
#: Shapes a :class:`Signer` keeps packed (the oldest is dropped past this many).
SHAPE_CACHE_SIZE = 256
#: A collective's tag without its signature's index: the user tags and the span of collective tags below 2**15.
INDEX_SHIFT = (c.USER_TAG_LIMIT + c.COLLECTIVE_TAG_SPAN - 1).bit_length()
CALL_MASK = (1 << INDEX_SHIFT) - 1
#: Signature indices a communicator hands out at most (fewer where the transport's tags end sooner).
MAX_INDICES = (1 << 14) - 1
#: The tag bound assumed of a transport that names none: the least MPI guarantees.
MIN_TAG_BOUND = 32767


class Staging:
    """Reusable receive buffers of ``HEAD_BYTES + SMALL_BYTES`` bytes for first messages, lent and given back.

    A buffer is a triple: the array that goes to the transport, a memoryview of it (the signature
    is read from there) and one of the payload after the signature, for copies (cheaper than
    NumPy's for messages this small). Calls pop and append ``free`` directly."""

    __slots__ = ("free", "nbytes")

    def __init__(self):
        self.free: list[tuple] = []   # buffers not lent
        self.nbytes = 0               # bytes of the buffers the pool owns, free and lent

    def new(self) -> tuple:
        """A new buffer (when every one is lent: the pool grows to the first receives in flight)."""
        self.nbytes += _STAGE_BYTES
        array = np.empty(_STAGE_BYTES, dtype=np.uint8)
        return array, array.data, array.data[HEAD_BYTES:]


class Shape:
    """What every call of one shape signs: its signature (number -1), that signature packed for the wire, and its
    index's tag bits (0 until a call of the shape has been signed in full, and when it has no index)."""

    __slots__ = ("sig", "head", "alone", "index", "bits")

    def __init__(self, sig: tuple, index: int, signed_before: bool):
        self.sig, self.head = sig, sg.HEAD.pack(*sig)
        self.alone = np.frombuffer(self.head, dtype=np.uint8)   # the signature as a message of its own (read-only)
        self.index = index
        self.bits = index << INDEX_SHIFT if signed_before else 0


class SignedSend:
    """A large first send: the signature alone (``head``), then the payload (``data``), under one tag."""

    __slots__ = ("head", "data", "stage")

    def __init__(self, head, data, stage):
        self.head, self.data, self.stage = head, data, stage   # stage: the signature's array, kept until sent

    def test(self) -> bool:
        """True once both parts have been sent."""
        if self.stage is not None:
            if not self.head.test():
                return False
            self.stage = None
        return self.data.test()

    def complete(self, call) -> None:
        """Wait through ``call``'s deadline loop, polling the transport's own requests (no wrapper per poll)."""
        if self.stage is not None:
            wait_until(self.head.test, call.overdue)
            self.stage = None
        wait_until(self.data.test, call.overdue)

    def cancel(self) -> None:
        """Abandon the parts still in flight (the signature's array stays with this handle)."""
        if self.stage is not None:
            self.head.cancel()
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
        self.error = self.call.mismatch(self.source, sg.UNKNOWN)
        return self.error

    def _check(self) -> None:
        """The first message is in: check the peer's signature, copy a small payload out, give back the stage."""
        call, stage = self.call, self.stage
        view = stage[1]
        theirs = _unpack_from(view)
        if theirs != call.signature and not _agree(call.signature, theirs):
            self.error = call.mismatch(self.source, theirs)
            raise self.error
        if self.data is None:
            n = self.buf.nbytes
            if n:
                self.buf.data.cast("B")[:] = stage[2][:n]
        self.stage = None
        call.staging.free.append(stage)

    def cancel(self) -> None:
        """Abandon the parts still in flight (the staging buffer stays out of the pool)."""
        if self.stage is not None:
            self.head.cancel()
        if self.data is not None:
            self.data.cancel()


class SignedCall(Call):
    """A call whose messages go through itself: the first message each way between two ranks carries the signature.

    It is its own ``transport``: ``isend``/``irecv`` sign or check the first message to or from
    each peer and pass the others to the communicator's transport (``raw``)."""

    __slots__ = ("raw", "staging", "shape", "sent", "heard")

    def __init__(self, owner, operation: str, number: int, tag: int, shape: Shape, staging: Staging):
        # Call's fields (but transport, a property here) set without Call.__init__: this runs once per call
        self.owner, self.operation, self.number, self.tag = owner, operation, number, tag
        self.expires, self.rounds, self.scale, self.signature = 0.0, 0, 0.0, shape.sig
        self.raw, self.staging, self.shape = owner.transport, staging, shape
        self.sent = self.heard = 0   # bit p: the first message to (from) peer p is posted

    @property
    def transport(self):
        """The call itself (a property, not a field: a reference to itself would keep it alive until a collection)."""
        return self

    @property
    def name(self) -> str:
        """The transport's name."""
        return self.raw.name

    def mismatch(self, source: int, theirs) -> sg.CollectiveMismatchError:
        """Tell every rank that ``source``'s signature ``theirs`` differs from this call's; the error to raise."""
        mine = (self.signature[0], self.number, *self.signature[2:])
        return self.owner.mismatch(self.number, source, mine, theirs)

    def isend(self, buf, dest: int, tag: int):
        """Send ``buf``; the first message to ``dest`` carries the signature."""
        bit = 1 << dest
        if self.sent & bit:
            return self.raw.isend(buf, dest, tag)
        self.sent |= bit
        n = buf.nbytes
        if n <= SMALL_BYTES:   # one message, a fresh array (read-only) that the transport's request holds until sent
            return self.raw.isend(_frombuffer(self.shape.head + buf.tobytes(), _BYTE), dest, tag)
        head, raw = self.shape.alone, self.raw
        return SignedSend(raw.isend(head, dest, tag), raw.isend(buf, dest, tag), head)

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
        free = self.staging.free
        stage = free.pop() if free else self.staging.new()
        raw = self.raw
        head = raw.irecv(stage[0], source, tag)
        data = raw.irecv(buf, source, tag) if buf.nbytes > SMALL_BYTES else None
        return SignedRecv(self, source, head, data, stage, buf)


_SIGNED = (SignedSend, SignedRecv)


class Signer:
    """What a communicator's signed calls share: the staging pool, the packed signature of each call shape, and the
    index of each signature in the tags.

    Indices. The first call with a signature is signed in full; the signature then gets the next
    free index (1, 2, ...), and every later call with it goes out plain, its index in its tag's high
    bits (:data:`INDEX_SHIFT`), so a rank that passed other arguments posts and sends under another
    tag and nothing matches. Every rank numbers the signatures in the order of their first calls,
    and each first call was checked in full, so equal indices mean equal signatures on every rank.
    A call whose messages stall looks for a peer's message of the same call under another index
    (:meth:`stray`) and names that index's signature. Indices stop at what the transport's tags hold
    (``tag_bound``; none below 2**16, MPI's least being 32767): later new signatures are signed in
    full at every call.
    """

    __slots__ = ("staging", "shapes", "indices", "signatures", "limit")

    def __init__(self, transport):
        self.staging = Staging()
        # (operation, dtype number, count, op, root) -> Shape; None: not signed
        self.shapes: dict[tuple, Shape | None] = {}
        self.indices: dict[tuple, int] = {}     # signature -> its index
        self.signatures: list = [None]          # index -> signature
        bound = getattr(transport, "tag_bound", MIN_TAG_BOUND)
        if getattr(transport, "unmatched_tags", None) is None:
            bound = MIN_TAG_BOUND   # a stalled call could not see what its peers sent
        self.limit = min(MAX_INDICES, ((bound + 1) >> INDEX_SHIFT) - 1)

    def open(self, owner, operation: str, number: int, tag: int, key: tuple, buf=None, op=None, root=None) -> Call:
        """The call about to run (``key``: its shape's, built by the communicator): signed in full, or plain under its
        signature's index, if it is a collective; else a plain :class:`Call`."""
        shape = self.shapes.get(key, self)
        if shape is self:
            shape = self._shape(key, operation, buf, op, root)
        if shape is None:
            return Call(owner, operation, number, tag)
        if shape.bits:
            return Call(owner, operation, number, tag | shape.bits, shape.sig)
        shape.bits = shape.index << INDEX_SHIFT   # signed in full this once: the next calls carry the index
        return SignedCall(owner, operation, number, tag, shape, self.staging)

    def _shape(self, key: tuple, operation: str, buf, op, root) -> Shape | None:
        """The Shape of a call not seen lately (None for what is not a collective), kept under ``key``."""
        shapes = self.shapes
        if len(shapes) >= SHAPE_CACHE_SIZE:
            del shapes[next(iter(shapes))]
        if sg.kind_code(operation) < 0:
            shape = None
        else:
            sig = sg.Signature(sg.words(operation, -1, buf, op, root))
            index = self.indices.get(sig, 0)
            known = index > 0
            if not known and len(self.signatures) <= self.limit:
                index = self.indices[sig] = len(self.signatures)
                self.signatures.append(sig)
            shape = Shape(sig, index, known)
        shapes[key] = shape
        return shape

    def stray(self, call, transport, silent: bool = False) -> tuple | None:
        """``(peer, its signature)`` of a peer's message that arrived for ``call`` under another index, or None.

        ``silent``: ``call`` sends and receives no message at all (the shared-memory all-reduce), so a peer's
        message for it under any tag, its own included, is one: its signature :data:`~npddp.comm.signature.UNKNOWN`
        where the tag carries no index (the peer's call was signed in full)."""
        mine, signatures = call.tag, self.signatures
        for peer in range(transport.size):
            if peer == transport.rank:
                continue
            for tag in transport.unmatched_tags(peer):
                if tag & CALL_MASK != mine & CALL_MASK or (tag == mine and not silent):
                    continue
                index = tag >> INDEX_SHIFT
                if 0 < index < len(signatures):
                    return peer, signatures[index]
                if silent:
                    return peer, sg.UNKNOWN
        return None
