"""One TCP connection of the transport: frames, their matching, and early frames (:class:`Peer`).

A message is a frame: a 16-byte header (context, tag, byte count with the sender's dtype in its
top byte) followed by the raw bytes of the sender's array. Sends go out of the caller's buffer
(``sendmsg`` of the header and a memoryview, no copies); a receive that is posted when its frame
arrives lands directly in the caller's buffer (``recv_into`` a memoryview). Frames are matched by (context, tag) per peer, in
the order they were sent, as MPI matches by (communicator, tag, source).

A frame that arrives before its receive is posted stays in the kernel's socket buffer while
nothing else is expected from that peer, so the sender waits (TCP flow control), the way
MPI's rendezvous protocol makes a large send wait for its receive. Only when a receive with a
*different* tag is posted for that peer is the early frame read into a buffer of its own, so
that frames behind it can be reached; the receive that matches it later copies it out.

A frame larger than the receive it matches fails that receive (ValueError, raised by its
``test()``, as MPI reports a truncated message on its request) and is read past, so the frames
behind it still arrive. A peer whose connection breaks (it exited or was killed) fails every request that involves it
with ConnectionError, at once. :class:`SelfPeer` is a rank's link to itself (no socket).
"""

from __future__ import annotations

import socket
import struct
from collections import deque

import numpy as np

HEADER = struct.Struct("<IIQ")  # context, tag, payload bytes | dtype code << KIND_SHIFT
KIND_SHIFT = 56
_SIZE_MASK = (1 << KIND_SHIFT) - 1
#: The dtypes a frame names (its code: index + 1; 0: another dtype, or a sender that did not say).
KINDS = tuple(np.dtype(n) for n in ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                                    "uint64", "float16", "float32", "float64", "complex64", "complex128"))
_CODES = {d: i + 1 for i, d in enumerate(KINDS)}


def kind_code(dtype) -> int:
    """The header code of ``dtype`` (0 for one :data:`KINDS` does not list)."""
    return _CODES.get(dtype, 0)
_SPARE_BUFFERS = 8               # early-frame buffers kept per peer for reuse
_EMPTY = memoryview(b"")


class TCPRequest:
    """One send or receive; ``done`` once complete, ``error`` once its peer is gone."""

    __slots__ = ("_world", "_peer", "key", "view", "done", "error", "header", "sent", "nbytes", "kind")

    def __init__(self, world, peer, key, view):
        self._world, self._peer, self.key, self.view = world, peer, key, view
        self.done = False
        self.error = None
        self.header = b""  # sends: the frame header
        self.sent = 0      # sends: bytes of header + payload written so far
        self.nbytes = 0    # receives: the frame's payload bytes, once matched
        self.kind = 0      # receives: the sender's dtype code (KINDS), once matched

    def test(self) -> bool:
        """Progress every peer with pending work; True once this request is complete."""
        if not self.done:
            if self.error is None:
                self._world.progress()
            if self.error is not None:
                raise self.error
        return self.done

    def cancel(self) -> None:
        """Abandon the request: an unmatched receive is withdrawn; bytes already under way are discarded."""
        if not self.done:
            self._peer.cancel(self)
            self.done = True

    def received(self) -> tuple[int, np.dtype | None]:
        """A completed receive's payload bytes and the sender's dtype (None when the frame did not name one)."""
        return self.nbytes, KINDS[self.kind - 1] if self.kind else None


def as_bytes(buf: np.ndarray) -> memoryview:
    """The bytes of contiguous ``buf`` as a flat memoryview (no copy)."""
    return memoryview(buf.reshape(-1).view(np.uint8))


def _deliver(req: TCPRequest, frame, source: int, kind: int) -> None:
    """Complete receive ``req`` with a frame (of dtype code ``kind``) read (or sent to self) before it was posted."""
    req.nbytes, req.kind = len(frame), kind
    if len(frame) > len(req.view):
        req.error = _truncated(source, req.key, len(frame), len(req.view))
        return
    req.view[:len(frame)] = frame
    req.done = True


def _truncated(source: int, key, nbytes: int, room: int) -> ValueError:
    return ValueError(f"message from rank {source} with tag {key[1]} has {nbytes} bytes, more than the "
                      f"{room} bytes of the receive buffer")


class Peer:
    """The connection to one peer: its send queue, its posted receives, and the frame being read."""

    def __init__(self, world, rank: int, sock: socket.socket | None):
        self.world, self.rank, self.sock = world, rank, sock
        self.sends: deque[TCPRequest] = deque()
        self.posted: dict[tuple, deque] = {}      # (context, tag) -> receives in posting order
        self.nposted = 0
        self.early: dict[tuple, deque] = {}       # (context, tag) -> frames read before their receive
        self.early_kinds: dict[tuple, deque] = {}  # (context, tag) -> the dtype code of each of those frames
        self.spare: list[bytearray] = []          # buffers early frames were read into, for reuse
        self.header = bytearray(HEADER.size)
        self.header_got = 0
        self.pending = None                       # (key, nbytes, kind) of a parsed header waiting for a receive
        self.target: memoryview | None = None     # where the current payload goes
        self.target_got = 0
        self.target_req: TCPRequest | None = None  # None: into an early-frame buffer
        self.target_key = None
        self.target_kind = 0                      # the dtype code of the frame being read
        self.claim: TCPRequest | None = None      # a receive posted while its frame was being read aside
        self.error: ConnectionError | None = None

    @property
    def busy(self) -> bool:
        """True while this peer has sends queued, receives posted or a payload half read."""
        return bool(self.sends) or self.nposted > 0 or self.target is not None

    # --- sending -----------------------------------------------------------------------
    def isend(self, view: memoryview, key: tuple, kind: int = 0) -> TCPRequest:
        req = TCPRequest(self.world, self, key, view)
        if self.error is not None:
            req.error = self.error
            return req
        req.header = HEADER.pack(key[0], key[1], len(view) | kind << KIND_SHIFT)
        self.sends.append(req)
        if len(self.sends) == 1:
            self.push()
        return req

    def push(self) -> None:
        """Write queued frames until the socket would block."""
        sends, sock = self.sends, self.sock
        try:
            while sends:
                req = sends[0]
                header, view, sent = req.header, req.view, req.sent
                if sent < HEADER.size:
                    n = sock.sendmsg([memoryview(header)[sent:], view])
                else:
                    n = sock.send(view[sent - HEADER.size:])
                req.sent = sent = sent + n
                if sent < HEADER.size + len(view):
                    return
                req.done = True
                sends.popleft()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.broken(exc)

    # --- receiving ---------------------------------------------------------------------
    def irecv(self, view: memoryview, key: tuple) -> TCPRequest:
        req = TCPRequest(self.world, self, key, view)
        frames = self.early.get(key)
        if frames:
            frame, kinds = frames.popleft(), self.early_kinds[key]
            kind = kinds.popleft()
            if not frames:
                del self.early[key], self.early_kinds[key]
            _deliver(req, frame, self.rank, kind)
            self._recycle(frame)
            return req
        if self.error is not None:
            req.error = self.error
            return req
        if self.target is not None and self.target_req is None and self.target_key == key and self.claim is None:
            self.claim = req  # its frame is being read aside right now: it gets that frame, in order
            return req
        queue = self.posted.get(key)
        if queue is None:
            queue = self.posted[key] = deque()
        queue.append(req)
        self.nposted += 1
        return req

    def _match(self, key, nbytes, kind) -> bool:
        """Start reading the payload of frame ``(key, nbytes, kind)``; False to leave it in the socket for now."""
        if key[0] in self.world.retired:  # a dropped communicator's leftover: read it into a sink, deliver nothing
            if nbytes:
                self.target, self.target_req, self.target_key = memoryview(bytearray(nbytes)), None, None
                self.target_got = 0
            return True
        queue = self.posted.get(key)
        if queue:
            req = queue.popleft()
            self.nposted -= 1
            if not queue:
                del self.posted[key]
            req.nbytes, req.kind = nbytes, kind
            if nbytes > len(req.view):  # the receive fails; its frame is read into a sink, so the stream stays in step
                req.error = _truncated(self.rank, key, nbytes, len(req.view))
                self.target, self.target_req, self.target_key = memoryview(bytearray(nbytes)), None, None
                self.target_got = 0
                return True
            if not nbytes:
                req.done = True
                return True
            self.target, self.target_req = req.view[:nbytes], req
        elif self.nposted:  # a receive for another tag waits behind this frame: read it aside
            if not nbytes:
                self.early.setdefault(key, deque()).append(_EMPTY)
                self.early_kinds.setdefault(key, deque()).append(kind)
                return True
            self.target, self.target_req = memoryview(self._spare(nbytes))[:nbytes], None
        else:
            return False
        self.target_got, self.target_key, self.target_kind = 0, key, kind
        return True

    def _recycle(self, frame: memoryview) -> None:
        """Keep the buffer of a delivered early frame for the next one (the largest ones, when full)."""
        buf, spare = frame.obj, self.spare
        if not len(frame):
            return
        if len(spare) < _SPARE_BUFFERS:
            spare.append(buf)
        else:
            smallest = min(range(len(spare)), key=lambda i: len(spare[i]))
            if len(spare[smallest]) < len(buf):
                spare[smallest] = buf

    def _spare(self, nbytes: int) -> bytearray:
        """A buffer of at least ``nbytes`` for an early frame: the smallest spare one that fits, else a new one."""
        fits = [b for b in self.spare if len(b) >= nbytes]
        if fits:
            buf = min(fits, key=len)
            self.spare.remove(buf)
            return buf
        return bytearray(nbytes)

    def pull(self) -> None:
        """Read frames until the socket would block or nothing more is wanted from this peer."""
        sock = self.sock
        try:
            while True:
                if self.target is None:
                    if self.pending is None:
                        got = self.header_got
                        n = sock.recv_into(memoryview(self.header)[got:])
                        if not n:
                            raise ConnectionResetError("connection closed")
                        self.header_got = got = got + n
                        if got < HEADER.size:
                            continue
                        self.header_got = 0
                        context, tag, word = HEADER.unpack(self.header)
                        self.pending = ((context, tag), word & _SIZE_MASK, word >> KIND_SHIFT)
                    if not self._match(*self.pending):
                        return
                    self.pending = None
                    continue
                target, got = self.target, self.target_got
                n = sock.recv_into(target[got:])
                if not n:
                    raise ConnectionResetError("connection closed")
                self.target_got = got = got + n
                if got == len(target):
                    req = self.target_req
                    if req is not None:
                        req.done = True
                    elif self.claim is not None:
                        _deliver(self.claim, target, self.rank, self.target_kind)
                        self._recycle(target)
                        self.claim = None
                    elif self.target_key is not None:  # None: the bytes of a cancelled receive
                        self.early.setdefault(self.target_key, deque()).append(target)
                        self.early_kinds.setdefault(self.target_key, deque()).append(self.target_kind)
                    self.target = self.target_req = None
                    if not self.nposted:
                        return
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.broken(exc)

    # --- failure -----------------------------------------------------------------------
    def cancel(self, req: TCPRequest) -> None:
        """Withdraw ``req``; a payload already arriving into it is read into a discard buffer instead."""
        queue = self.posted.get(req.key)
        if queue is not None and req in queue:
            queue.remove(req)
            self.nposted -= 1
        elif req is self.claim:
            self.claim = None
            self.target_key = None  # its frame, once read, is dropped
        elif req is self.target_req:  # keep the stream in step: read the rest of its bytes into a sink
            self.target = memoryview(bytearray(len(self.target)))
            self.target_req = self.target_key = None
        elif req in self.sends and req.sent == 0:
            self.sends.remove(req)

    def broken(self, exc: Exception) -> None:
        """The connection failed: every request on it fails with one ConnectionError naming the peer."""
        self.error = ConnectionError(f"the connection to rank {self.rank} broke ({exc}): that rank exited or was "
                                     "killed")
        for req in self.sends:
            req.error = self.error
        for queue in self.posted.values():
            for req in queue:
                req.error = self.error
        for req in (self.target_req, self.claim):
            if req is not None:
                req.error = self.error
        self.sends.clear()
        self.posted.clear()
        self.nposted = 0
        self.target = self.target_req = self.claim = None


class SelfPeer:
    """Messages a rank sends to itself: matched in memory, the send copied at once."""

    busy = False
    pending = None   # no socket: nothing waits in one

    def __init__(self, world, rank: int):
        self.world, self.rank = world, rank
        self.posted: dict[tuple, deque] = {}
        self.early: dict[tuple, deque] = {}
        self.early_kinds: dict[tuple, deque] = {}

    def isend(self, view: memoryview, key: tuple, kind: int = 0) -> TCPRequest:
        req = TCPRequest(self.world, self, key, view)
        queue = self.posted.get(key)
        if queue:
            recv = queue.popleft()
            _deliver(recv, view, self.rank, kind)
        else:
            self.early.setdefault(key, deque()).append(memoryview(bytearray(view)))
            self.early_kinds.setdefault(key, deque()).append(kind)
        req.done = True
        return req

    def irecv(self, view: memoryview, key: tuple) -> TCPRequest:
        req = TCPRequest(self.world, self, key, view)
        frames = self.early.get(key)
        if frames:
            _deliver(req, frames.popleft(), self.rank, self.early_kinds[key].popleft())
        else:
            self.posted.setdefault(key, deque()).append(req)
        return req

    def cancel(self, req: TCPRequest) -> None:
        queue = self.posted.get(req.key)
        if queue is not None and req in queue:
            queue.remove(req)
