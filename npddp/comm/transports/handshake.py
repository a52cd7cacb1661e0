"""Proof that a TCP connection belongs to this job: an HMAC-SHA256 challenge-response on a per-job secret.

Every connection of the TCP world (a rank registering at ``MASTER_PORT``, and every
rank-to-rank link) starts with three fixed-size messages, before anything it carries is used:

1. the side that accepted sends ``magic, version, nonce_a`` (16 fresh random bytes);
2. the side that connected answers ``nonce_c`` (fresh), its fixed-size message (a registration
   or a hello) and ``HMAC(secret, "C" | nonce_a | nonce_c | message)``;
3. the accepting side checks that tag (``hmac.compare_digest``) and answers
   ``HMAC(secret, "A" | nonce_c | nonce_a)``, which the connecting side checks in turn.

So both ends prove they hold the secret without sending it, a recorded exchange cannot be
replayed (each side's nonce is fresh), and the message is bound to the proof. Every length
here is fixed, so nothing is allocated from a number a stranger sent. A :class:`Gate` runs
the accepting side for many connections at once: one that fails the check, sends garbage,
closes, or stays silent past :data:`HANDSHAKE_S` is dropped with one line on stderr and never
delays the others by more than that. Payloads after the handshake are neither encrypted nor
authenticated per message (see docs/design/security.md).

The secret comes from ``NPDDP_JOB_SECRET`` (``python -m npddp.run`` makes one per job, or reads
``--secret-file``); without one the key is empty, which only proves the peer speaks this protocol.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import selectors
import socket
import struct
import sys
import time

from npddp.util import variables

MAGIC = b"NPDA"
VERSION = 1
HANDSHAKE_S = 3.0                         # seconds a connection may take to prove itself
SECRET_VARIABLE = variables.JOB_SECRET.name
_NONCE = 16
_TAG = hashlib.sha256().digest_size
CHALLENGE = struct.Struct(f"<4sI{_NONCE}s")          # magic, version, nonce_a
PROOF = struct.Struct(f"{_TAG}s")                     # the accepting side's answer


class HandshakeError(ConnectionError):
    """The other end did not prove it belongs to this job (one line: where and why)."""


def secret_from_env(environ=None) -> bytes:
    """The job's key from ``NPDDP_JOB_SECRET`` (b"" when unset)."""
    return variables.text(variables.JOB_SECRET, environ).encode()


def new_secret() -> str:
    """A fresh job secret: 32 random bytes as hex."""
    return secrets.token_hex(32)


def _tag(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def _answer(size: int) -> struct.Struct:
    """The connecting side's answer to a challenge, around a message of ``size`` bytes."""
    return struct.Struct(f"<{_NONCE}s{size}s{_TAG}s")


def _read(sock: socket.socket, n: int, deadline: float, what: str) -> bytes:
    buf, got = bytearray(n), 0
    view = memoryview(buf)
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise HandshakeError(f"timed out waiting for {what}")
        sock.settimeout(left)
        try:
            k = sock.recv_into(view[got:])
        except socket.timeout:
            continue
        except OSError as exc:
            raise HandshakeError(f"connection failed while waiting for {what} ({exc.strerror or exc})") from None
        if not k:
            raise HandshakeError(f"connection closed while waiting for {what}")
        got += k
    return bytes(buf)


def knock(sock: socket.socket, key: bytes, message: bytes, who: str, deadline: float) -> None:
    """The connecting side: answer the challenge with ``message`` and check the other end's proof.

    The challenge may take until ``deadline`` (the other end may be busy before it accepts);
    the proof, :data:`HANDSHAKE_S` after the answer.
    """
    magic, version, nonce_a = CHALLENGE.unpack(_read(sock, CHALLENGE.size, deadline, f"{who}'s challenge"))
    if magic != MAGIC or version != VERSION:
        raise HandshakeError(f"{who} does not speak this npddp handshake (magic {magic!r}, version {version})")
    nonce_c = secrets.token_bytes(_NONCE)
    sock.settimeout(HANDSHAKE_S)
    try:
        sock.sendall(_answer(len(message)).pack(nonce_c, message, _tag(key, b"C", nonce_a, nonce_c, message)))
        (proof,) = PROOF.unpack(_read(sock, PROOF.size, time.monotonic() + HANDSHAKE_S, f"{who}'s proof"))
    except (HandshakeError, OSError):
        raise HandshakeError(f"{who} refused this rank: is {SECRET_VARIABLE} the same on every rank "
                             "(python -m npddp.run --secret-file on every machine)?") from None
    if not hmac.compare_digest(proof, _tag(key, b"A", nonce_c, nonce_a)):
        raise HandshakeError(f"{who} is not a rank of this job (wrong proof of {SECRET_VARIABLE})")
    sock.settimeout(None)


class _Pending:
    """One accepted connection that has not proved itself yet."""

    __slots__ = ("sock", "addr", "nonce", "buf", "got", "deadline")

    def __init__(self, sock, addr, nonce, size):
        self.sock, self.addr, self.nonce = sock, addr, nonce
        self.buf, self.got = bytearray(size), 0
        self.deadline = time.monotonic() + HANDSHAKE_S


def _where(addr) -> str:
    try:
        return f"{addr[0]}:{addr[1]}"
    except (TypeError, IndexError):
        return str(addr)


class Gate:
    """The accepting side for a listening socket: yields connections that proved themselves, drops the rest."""

    def __init__(self, listener: socket.socket, key: bytes, message_size: int, name: str, log=None):
        self.listener, self.key, self.name = listener, key, name
        self.answer = _answer(message_size)
        self.log = sys.stderr if log is None else log
        self.dropped = 0
        self._pending: dict = {}
        self._sel = selectors.DefaultSelector()
        listener.setblocking(False)
        self._sel.register(listener, selectors.EVENT_READ)

    def accept(self, deadline: float):
        """The next connection that passed, as ``(socket, message, address)``; None once ``deadline`` passes."""
        while True:
            now = time.monotonic()
            for p in [p for p in self._pending.values() if p.deadline <= now]:
                self._drop(p, f"silent for {HANDSHAKE_S:g} s")
            if now >= deadline:
                return None
            wake = min([deadline] + [p.deadline for p in self._pending.values()])
            for sel_key, _ in self._sel.select(max(0.0, wake - now)):
                if sel_key.fileobj is self.listener:
                    self._open()
                    continue
                done = self._read(self._pending[sel_key.fileobj])
                if done is not None:
                    return done

    def _open(self) -> None:
        try:
            sock, addr = self.listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:   # e.g. the peer reset before accept: nothing to do
            self.log.write(f"npddp: {self.name}: accept failed ({exc.strerror or exc})\n")
            return
        nonce = secrets.token_bytes(_NONCE)
        p = _Pending(sock, addr, nonce, self.answer.size)
        self._pending[sock] = p
        try:
            sock.setblocking(False)
            sock.send(CHALLENGE.pack(MAGIC, VERSION, nonce))   # 24 bytes into an empty buffer: never blocks
        except OSError as exc:
            self._drop(p, f"closed at once ({exc.strerror or exc})")
            return
        self._sel.register(sock, selectors.EVENT_READ)

    def _read(self, p: _Pending):
        try:
            k = p.sock.recv_into(memoryview(p.buf)[p.got:])
        except (BlockingIOError, InterruptedError):
            return None
        except OSError as exc:
            self._drop(p, f"connection failed ({exc.strerror or exc})")
            return None
        if not k:
            self._drop(p, f"closed after {p.got} of {len(p.buf)} bytes of its answer")
            return None
        p.got += k
        if p.got < len(p.buf):
            return None
        nonce_c, message, tag = self.answer.unpack(p.buf)
        if not hmac.compare_digest(tag, _tag(self.key, b"C", p.nonce, nonce_c, message)):
            self._drop(p, f"failed the job-secret check (wrong {SECRET_VARIABLE}, or not an npddp rank)")
            return None
        self._forget(p)
        try:
            p.sock.setblocking(True)
            p.sock.settimeout(HANDSHAKE_S)
            p.sock.sendall(PROOF.pack(_tag(self.key, b"A", nonce_c, p.nonce)))
            p.sock.settimeout(None)
        except OSError as exc:
            p.sock.close()
            self.dropped += 1
            self.log.write(f"npddp: {self.name}: dropped {_where(p.addr)}: closed before the proof "
                           f"({exc.strerror or exc})\n")
            return None
        return p.sock, message, p.addr

    def _forget(self, p: _Pending) -> None:
        self._pending.pop(p.sock, None)
        try:
            self._sel.unregister(p.sock)
        except (KeyError, ValueError):
            pass

    def _drop(self, p: _Pending, why: str) -> None:
        self._forget(p)
        p.sock.close()
        self.dropped += 1
        self.log.write(f"npddp: {self.name}: dropped a connection from {_where(p.addr)}: {why}\n")
        self.log.flush()

    def close(self) -> None:
        """Drop every connection still proving itself (silently) and stop watching the listener."""
        for p in list(self._pending.values()):
            self._forget(p)
            p.sock.close()
        self._sel.close()
