"""The engine under every hand-written collective: tags, deadlines, scratch buffers and Work handles.

* :class:`Context` is what an algorithm sees of the communicator it runs in: its rank and size,
  the transport, the scratch pool and its tunables. :class:`Cost` is an algorithm's
  alpha-beta-gamma description, the one ``auto``, the tuner and the report's projection all read.
* :class:`TagSequence` gives each collective its own tag, the same on every rank, above the
  user tags; :class:`Call` is one collective in progress: its name, number and tag, the deadline
  of its waits, and blocking transfers under its tag (:meth:`Call.transfer`, :meth:`Call.exchange`).
* :class:`ScratchPool` lends reusable receive buffers, so steady-state collectives allocate nothing.
* :class:`P2PWork` is the Work handle of a collective driven by transport requests; its
  subclasses implement ``_advance(block)``. :class:`RoundWork` runs a schedule of rounds;
  :class:`DoneWork` is a collective that needed no messages.

Waiting. Every wait polls its request with ``test()`` and yields the CPU between polls (when
ranks outnumber cores, the rank we wait for gets to run); every ``CLOCK_EVERY`` polls it reads
the clock. A call's deadline starts at its first clock read, so a call that never waits long
never reads the clock. After ``SPIN_ROUNDS`` clock reads (about a millisecond) it naps
``NAP_S`` between rounds, so long waits leave the core to others. Past the deadline the wait
raises :class:`Overdue`, which the communicator turns into a TimeoutError naming the
operation and the ranks it waits for.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from npddp.comm import checks as c
from npddp.util import variables

#: Polls of a request between two reads of the clock.
CLOCK_EVERY = 64
#: Clock reads a wait spins through before it starts to nap between rounds of polls.
SPIN_ROUNDS = 16
#: Seconds of one nap: short beside a wait that has already lasted ~1 ms, long enough to let an
#: oversubscribed core run the rank being waited for.
NAP_S = 50e-6
_POLLS = range(CLOCK_EVERY)
_yield = os.sched_yield


class Cost(NamedTuple):
    """One all-reduce's alpha-beta-gamma terms: ``time = steps * alpha + sent * beta + reduced * gamma``."""

    steps: float    # messages one after another on the critical path
    sent: float     # bytes the busiest rank sends on the critical path
    reduced: float  # bytes it reduces on the critical path

    def time(self, alpha: float, beta: float, gamma: float = 0.0) -> float:
        """Seconds, for alpha (s per message), beta (s per byte sent) and gamma (s per byte reduced)."""
        return self.steps * alpha + self.sent * beta + self.reduced * gamma


class Context:
    """What an all-reduce algorithm sees of the communicator it runs in.

    ``chunk_bytes``: pipelined algorithms (ring steps, tree, chain broadcast) cut messages into
    chunks of at most this many bytes; ``window``: ring receives kept in flight; ``node``: the
    node's shared-memory group, when the communicator has one (else None).
    """

    __slots__ = ("rank", "size", "transport", "scratch", "chunk_bytes", "window", "node")

    def __init__(self, transport, scratch, chunk_bytes: int, window: int):
        self.rank, self.size, self.transport, self.scratch = transport.rank, transport.size, transport, scratch
        self.chunk_bytes, self.window, self.node = chunk_bytes, window, None


class TagSequence:
    """Tags for collectives: ``USER_TAG_LIMIT + (sequence % (COLLECTIVE_TAG_SPAN - 1))``, same order on all ranks.

    The last tag of the span is kept for aborts (:data:`npddp.comm.p2p.signed.CONTROL_TAG`)."""

    __slots__ = ("_seq", "count")

    def __init__(self):
        self._seq = 0
        self.count = 0  # tags handed out so far

    def next(self) -> int:
        """Tag of the next collective."""
        tag = c.USER_TAG_LIMIT + self._seq
        self._seq = (self._seq + 1) % (c.COLLECTIVE_TAG_SPAN - 1)
        self.count += 1
        return tag


class Overdue(Exception):
    """A wait passed its call's deadline; caught by the communicator and turned into a TimeoutError."""


class Call:
    """One collective (or send/recv) in progress: what to name in errors, its tag, and the deadline of its waits.

    ``owner`` is the communicator: it turns an overdue wait or a broken connection into the error
    to raise (``give_up``, ``fail``) and refuses later calls. ``transport`` is what the call's
    messages go through: the owner's transport, or a signed call's (:mod:`npddp.comm.p2p.signed`)
    while the argument check is on; each clock read asks the owner's ``watch`` (None when off)
    whether a peer has aborted.
    """

    __slots__ = ("owner", "transport", "operation", "number", "tag", "expires", "rounds", "scale", "signature")

    def __init__(self, owner, operation: str, number: int | None, tag: int):
        self.owner, self.transport = owner, owner.transport
        self.operation, self.number, self.tag = operation, number, tag
        self.expires = 0.0  # set at the first clock read
        self.rounds = 0     # clock reads so far
        self.scale = 0.0    # op avg: the factor (1/N) still to apply to the result; 0.0: none
        self.signature = None  # with the argument check on: what every rank must pass alike (signature.WORDS ints)

    def take_scale(self) -> float:
        """The average's factor (0.0: none), which the caller now applies itself, fused into its reduction."""
        scale, self.scale = self.scale, 0.0
        return scale

    def apply_scale(self, result: np.ndarray) -> None:
        """Apply what is left of the average's factor to the whole ``result`` (algorithms that do not fuse it)."""
        scale = self.take_scale()
        if scale:
            np.multiply(result, scale, out=result)

    def overdue(self) -> bool:
        """Read the clock (the first read starts the deadline); nap once the wait is long. True past the deadline."""
        now = time.monotonic()
        self.rounds += 1
        if self.owner.watch is not None:
            self.owner.heard_abort()
        if not self.expires:
            self.expires = now + self.owner.timeout
            return False
        if self.rounds > SPIN_ROUNDS:
            time.sleep(NAP_S)
        return now > self.expires

    def wait(self, request) -> None:
        """Complete ``request``, yielding the CPU between polls; Overdue past the deadline."""
        test = request.test
        while True:
            for _ in _POLLS:
                if test():
                    return
                _yield()
            if self.overdue():
                raise Overdue

    def wait_all(self, requests) -> None:
        """Complete every request, testing them all in turn (so any one may raise first); Overdue past the deadline."""
        pending = list(requests)
        while True:
            for _ in _POLLS:
                pending = [r for r in pending if not r.test()]
                if not pending:
                    return
                _yield()
            if self.overdue():
                raise Overdue

    def transfer(self, recvs=(), sends=()) -> None:
        """Post receives ``[(array, source)]`` and sends ``[(array, dest)]`` under this call's tag; wait for all."""
        transport, tag = self.transport, self.tag
        rreqs, sreqs = [], []
        try:
            rreqs += [(transport.irecv(a, source, tag), source) for a, source in recvs]
            sreqs += [(transport.isend(a, dest, tag), dest) for a, dest in sends]
            for request, _ in rreqs:
                self.wait(request)
            for request, _ in sreqs:
                self.wait(request)
        except Overdue:
            raise self.owner.give_up(self, rreqs, sreqs, (recvs, sends)) from None
        except ConnectionError as exc:
            raise self.owner.fail(self, exc, rreqs, sreqs, (recvs, sends)) from None
        except Exception:   # a mismatch found while waiting: the transport may still write the other buffers
            self.owner.strand(rreqs + sreqs, (recvs, sends))
            raise

    def exchange(self, got, send, peer: int) -> None:
        """Receive ``got`` from and send ``send`` to ``peer`` under this call's tag; wait for both."""
        transport, tag = self.transport, self.tag
        recv = transport.irecv(got, peer, tag)
        sent = transport.isend(send, peer, tag)
        try:
            self.wait(recv)
            self.wait(sent)
        except Overdue:
            raise self.owner.give_up(self, [(recv, peer)], [(sent, peer)], (got, send)) from None
        except ConnectionError as exc:
            raise self.owner.fail(self, exc, [(recv, peer)], [(sent, peer)], (got, send)) from None
        except Exception:   # a mismatch found while waiting
            self.owner.strand([(recv, peer), (sent, peer)], (got, send))
            raise

    def describe(self) -> str:
        """E.g. ``ring allreduce (collective #12, tag 16395)``."""
        what = f"collective #{self.number}, " if self.number is not None else ""
        return f"{self.owner.name} {self.operation} ({what}tag {self.tag})"

    def timeout_error(self, recv_from: Sequence[int], send_to: Sequence[int] = (),
                      arrive: Sequence[int] = ()) -> TimeoutError:
        """The error of this call, still waiting on messages from and to the given ranks (or for them to arrive)."""
        waits = []
        if recv_from:
            waits.append("to receive from " + _ranks(recv_from))
        if send_to:
            waits.append("to send to " + _ranks(send_to))
        if arrive:
            waits.append("for " + _ranks(arrive) + " to arrive")
        return TimeoutError(
            f"[rank {self.owner.rank}] {self.describe()} timed out after {self.owner.timeout:g} s waiting "
            f"{' and '.join(waits) or 'for its peers'}: a peer crashed, hangs, or called a different "
            f"collective ({variables.DEBUG.name}=1 checks that); this communicator is now unusable")


def _ranks(ranks: Sequence[int]) -> str:
    """``rank 3`` or ``ranks 1, 3``."""
    ranks = sorted(set(ranks))
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


class ScratchPool:
    """Receive buffers lent out and given back; a buffer is replaced only when too small."""

    __slots__ = ("_free", "nbuffers", "nbytes")

    def __init__(self):
        self._free: list[bytearray] = []
        self.nbuffers = 0  # buffers the pool owns, free and lent
        self.nbytes = 0    # their total size

    def acquire(self, nbytes: int) -> bytearray:
        """Lend the smallest free buffer of at least ``nbytes``; replace the largest free one if none fits."""
        free = self._free
        best = -1
        for i, b in enumerate(free):
            if len(b) >= nbytes and (best < 0 or len(b) < len(free[best])):
                best = i
        if best >= 0:
            return free.pop(best)
        if free:
            largest = max(range(len(free)), key=lambda i: len(free[i]))
            self.nbytes -= len(free.pop(largest))
            self.nbuffers -= 1
        buf = bytearray(max(nbytes, 1))
        self.nbytes += len(buf)
        self.nbuffers += 1
        return buf

    def release(self, buf: bytearray) -> None:
        """Take back a buffer lent by :meth:`acquire`."""
        self._free.append(buf)


class P2PWork:
    """Work handle of a collective driven by transport requests.

    Subclasses implement ``_advance(block)``: move the collective on (blocking on requests only
    if ``block``) and return True once it is complete, and ``_requests()``: the outstanding
    receive and send requests with their peers. While a handle is waited on and other handles
    of the same communicator are outstanding, all of them are polled, so handles may be waited
    on in any order without deadlock.
    """

    __slots__ = ("_call", "_active", "_result", "_done", "_abandoned")

    def __init__(self, call: Call, result: np.ndarray):
        self._call = call
        self._active = call.owner._active
        self._result = result
        self._done = self._abandoned = False
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

    def test(self) -> bool:
        """Advance as far as possible without blocking; True once complete."""
        if not self._done:
            if self._abandoned:
                raise self._call.owner.unusable()
            try:
                if self._advance(False):
                    self._complete()
            except ConnectionError as exc:
                raise self._call.owner.fail(self._call, exc) from None
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
                polls = 0
                while True:
                    for work in tuple(self._active):
                        work.test()
                    if self._done:
                        break
                    _yield()
                    polls += 1
                    if not polls % CLOCK_EVERY and call.overdue():
                        raise Overdue
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
