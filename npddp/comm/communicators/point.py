"""The Work handle of a hand-written backend's ``isend``/``irecv``: one transport request under a user tag.

It is not among the communicator's outstanding collectives (a barrier does not wait for it), and it
fails like a collective: past the timeout TimeoutError, on a broken connection ConnectionError, and
either way the communicator refuses later calls. A receive's message is checked against its buffer once
in (:func:`~npddp.comm.status.check_received`: the sender's dtype where the transport carries it, whole
elements, no more than fits) and its :class:`~npddp.comm.status.Status`, if one was given, filled.
"""

from __future__ import annotations

import numpy as np

from npddp.comm.engine.call import Call
from npddp.comm.engine.deadline import Overdue
from npddp.comm.signature import CollectiveMismatchError
from npddp.comm.status import Status, check_received


class PointWork:
    """Handle of one non-blocking send or receive; ``wait`` returns its buffer."""

    __slots__ = ("_call", "_request", "_buf", "_peer", "_is_recv", "_done", "_status")

    def __init__(self, call: Call, buf: np.ndarray, peer: int, is_recv: bool, status: Status | None = None):
        self._call, self._buf, self._peer, self._is_recv = call, buf, peer, is_recv
        self._done = False
        self._status = status
        transport = call.transport
        try:
            post = transport.irecv if is_recv else transport.isend
            self._request = post(buf, peer, call.tag)
        except ConnectionError as exc:
            raise call.owner.fail(call, exc) from None

    def _pairs(self) -> tuple[list, list]:
        """``([(request, peer)] receives, sends)`` for the owner's error paths."""
        pair = [(self._request, self._peer)]
        return (pair, []) if self._is_recv else ([], pair)

    def test(self) -> bool:
        """True once the message has been sent (buffer reusable) or received (buffer filled)."""
        if not self._done:
            owner = self._call.owner
            if owner._failure is not None:
                raise owner.unusable()
            try:
                self._done = self._request.test()
            except ConnectionError as exc:
                raise owner.fail(self._call, exc, *self._pairs(), self._buf) from None
            except CollectiveMismatchError:   # a peer's abort heard meanwhile: as it is
                raise
            except ValueError as exc:   # a message longer than the buffer
                raise self._refused(exc) from None
            if self._done and self._is_recv:
                self._check()
        return self._done

    def wait(self) -> np.ndarray:
        """Block until :meth:`test` is true (at most the owner's timeout); return the buffer."""
        if not self._done:
            call = self._call
            if call.owner._failure is not None:
                raise call.owner.unusable()
            try:
                call.wait(self._request)
            except Overdue:
                raise call.owner.give_up(call, *self._pairs(), self._buf) from None
            except ConnectionError as exc:
                raise call.owner.fail(call, exc, *self._pairs(), self._buf) from None
            except CollectiveMismatchError:   # a peer's abort heard while waiting: as it is
                raise
            except ValueError as exc:   # a message longer than the buffer
                raise self._refused(exc) from None
            self._done = True
            if self._is_recv:
                self._check()
        return self._buf

    def _where(self) -> str:
        """``[rank 1] ring recv``: what an error names first."""
        call = self._call
        return f"[rank {call.owner.rank}] {call.owner.name} {call.operation}"

    def _refused(self, exc: ValueError) -> ValueError:
        """The transport's error (naming the sender and tag) of a message longer than the buffer, with this rank."""
        self._done = True
        return ValueError(f"{self._where()}: {exc}")

    def _check(self) -> None:
        """The message against the buffer (ValueError when it does not fit); the status filled."""
        received = getattr(self._request, "received", None)   # optional on a transport's request
        nbytes, dtype = received() if received is not None else (None, None)
        check_received(self._buf, nbytes, dtype, self._peer, self._call.tag, self._status, self._where())
