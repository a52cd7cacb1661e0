"""Work handles of hand-written collectives.

* :class:`P2PWork` is the Work handle of a collective driven by transport requests; its
  subclasses implement ``_advance(block)``. :class:`RoundWork` runs a schedule of rounds;
  :class:`DoneWork` is a collective that needed no messages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from npddp.comm.engine.call import Call
from npddp.comm.engine.deadline import CLOCK_EVERY, Overdue, wait_until


class P2PWork:
    """Work handle of a collective driven by transport requests.

    Subclasses implement ``_advance(block)``: move the collective on (blocking on requests only
    if ``block``) and return True once it is complete, and ``_requests()``: the outstanding
    receive and send requests with their peers. While a handle is waited on and other handles
    of the same communicator are outstanding, all of them are polled, so handles may be waited
    on in any order without deadlock. ``test()`` moves on the handles started before it too (a
    call may need them: shared memory's node barriers count in call order), and every
    ``CLOCK_EVERY`` tests reads its call's clock as a wait does: a peer's abort raises its
    CollectiveMismatchError, and a loop of tests past the deadline raises the TimeoutError.
    """

    __slots__ = ("_call", "_active", "_result", "_done", "_abandoned", "_tests")

    def __init__(self, call: Call, result: np.ndarray):
        self._call = call
        self._active = call.owner._active
        self._result = result
        self._done = self._abandoned = False
        self._tests = 0   # test() calls that found it incomplete
        self._active.append(self)

    def _advance(self, block: bool) -> bool:
        """Progress the collective; True once complete."""
        raise NotImplementedError

    def _requests(self) -> tuple[list, list]:
        """Outstanding ``[(request, peer)]`` receives and sends."""
        raise NotImplementedError

    def _release(self) -> None:
        """Give back scratch buffers; called once, on completion."""

    def _complete(self) -> None:
        self._done = True
        self._active.remove(self)
        self._release()
        self._call.apply_scale(self._result)

    def _start(self) -> None:
        """Post what can be posted at once (subclasses call it last in ``__init__``)."""
        try:
            if self._advance(False):
                self._complete()
        except ConnectionError as exc:
            raise self._call.owner.fail(self._call, exc) from None

    def _step(self) -> None:
        """Advance as far as possible without blocking (no clock read); complete it if done."""
        if not self._done:
            if self._abandoned:
                raise self._call.owner.unusable()
            try:
                if self._advance(False):
                    self._complete()
            except ConnectionError as exc:
                raise self._call.owner.fail(self._call, exc) from None

    def test(self) -> bool:
        """Advance this call and those started before it as far as possible without blocking; True once complete.

        Every ``CLOCK_EVERY`` tests that find it incomplete read the call's clock: a peer's abort raises its
        CollectiveMismatchError, and past the deadline (started at the first read) a TimeoutError."""
        if self._done:
            return True
        if self._abandoned:
            raise self._call.owner.unusable()
        for work in tuple(self._active):   # the earlier calls first: this one may wait on them
            if work is self:
                break
            work._step()
        self._step()
        if not self._done:
            self._tests += 1
            if not self._tests % CLOCK_EVERY:
                call = self._call
                try:
                    if call.overdue():
                        raise call.owner.give_up(call, *self._requests())
                except ConnectionError as exc:
                    raise call.owner.fail(call, exc) from None
        return self._done

    def _test_all(self) -> bool:
        """Advance every handle of the communicator (any may be the one a peer waits on); True once this one is done."""
        for work in tuple(self._active):
            work._step()
        return self._done

    def wait(self) -> np.ndarray:
        """Drive the collective to completion; return its result array."""
        if self._done:
            return self._result
        if self._abandoned:
            raise self._call.owner.unusable()
        call = self._call
        try:
            if len(self._active) == 1:
                self._advance(True)
                self._complete()
            else:
                wait_until(self._test_all, call.overdue)
        except Overdue:
            raise call.owner.give_up(call, *self._requests()) from None
        except ConnectionError as exc:
            raise call.owner.fail(call, exc) from None
        return self._result


class DoneWork:
    """Work handle of a collective that needed no messages."""

    __slots__ = ("_result",)

    def __init__(self, result: np.ndarray):
        self._result = result

    def test(self) -> bool:
        """Always True."""
        return True

    def wait(self) -> np.ndarray:
        """Return the result array."""
        return self._result


class RoundWork(P2PWork):
    """Runs rounds in order: post a round's receives and sends, wait for all, run its action.

    A round is ``(sends, recvs, action)``: sends as ``(array, dest)`` pairs, receives as
    ``(array, source)`` pairs, and a callable (or None) run once all of them have completed.
    """

    __slots__ = ("_rounds", "_next", "_reqs", "_on_release")

    def __init__(self, call: Call, rounds: Sequence[tuple], result: np.ndarray,
                 on_release: Callable[[], None] | None = None):
        super().__init__(call, result)
        self._rounds = rounds
        self._next = 0
        self._reqs = None
        self._on_release = on_release
        self._start()

    def _advance(self, block):
        call = self._call
        transport, tag = call.transport, call.tag
        while True:
            if self._reqs is None:
                if self._next == len(self._rounds):
                    return True
                sends, recvs, _ = self._rounds[self._next]
                self._reqs = [transport.irecv(a, source, tag) for a, source in recvs]
                self._reqs += [transport.isend(a, dest, tag) for a, dest in sends]
            for request in self._reqs:
                if block:
                    call.wait(request)
                elif not request.test():
                    return False
            action = self._rounds[self._next][2]
            if action is not None:
                action()
            self._reqs = None
            self._next += 1

    def _requests(self):
        if self._reqs is None:
            return [], []
        sends, recvs, _ = self._rounds[self._next]
        nrecv = len(recvs)
        return (list(zip(self._reqs[:nrecv], (s for _, s in recvs))),
                list(zip(self._reqs[nrecv:], (d for _, d in sends))))

    def _release(self):
        if self._on_release is not None:
            self._on_release()
