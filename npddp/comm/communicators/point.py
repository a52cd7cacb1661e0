"""The Work handle of a hand-written backend's ``isend``/``irecv``: one transport request under a user tag.

It is not among the communicator's outstanding collectives (a barrier does not wait for it), and it
fails like a collective: past the timeout TimeoutError, on a broken connection ConnectionError, and
either way the communicator refuses later calls.
"""

from __future__ import annotations

import numpy as np

from npddp.comm.engine.call import Call
from npddp.comm.engine.deadline import Overdue


class PointWork:
    """Handle of one non-blocking send or receive; ``wait`` returns its buffer."""

    __slots__ = ("_call", "_request", "_buf", "_peer", "_is_recv", "_done")

    def __init__(self, call: Call, buf: np.ndarray, peer: int, is_recv: bool):
        self._call, self._buf, self._peer, self._is_recv = call, buf, peer, is_recv
        self._done = False
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
            self._done = True
        return self._buf
