"""Waiting on requests: how often the clock is read, when a wait naps, and the exception past a deadline.

Waiting. Every wait polls its request with ``test()`` and yields the CPU between polls (when
ranks outnumber cores, the rank we wait for gets to run); every ``CLOCK_EVERY`` polls it reads
the clock. A call's deadline starts at its first clock read, so a call that never waits long
never reads the clock. After ``SPIN_ROUNDS`` clock reads (about a millisecond) it naps
``NAP_S`` between rounds, so long waits leave the core to others. Past the deadline the wait
raises :class:`Overdue`, which the communicator turns into a TimeoutError naming the
operation and the ranks it waits for.

Departures. Under MPI a rank that leaves the job normally tells every peer at its exit
(:class:`npddp.util.guard.Departures`). A wait looks at those notices at its clock reads once it
naps (never at a poll, never in a wait shorter than ``SPIN_ROUNDS`` clock reads).
A wait ends with ConnectionError naming a rank that left only when that rank is one the wait
needs (:meth:`Deadline.needs`: a member of the communicator of a collective, the peer of a send
or receive; world ranks) and the wait is still not complete ``GRACE_S`` after this wait first
saw the notice, so messages the rank sent before it left have time to arrive.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection

from npddp.util import variables
from npddp.util.guard import departures

#: Polls of a request between two reads of the clock.
CLOCK_EVERY = 64
#: Clock reads a wait spins through before it starts to nap between rounds of polls.
SPIN_ROUNDS = 16
#: Seconds of one nap: short beside a wait that has already lasted ~1 ms, long enough to let an
#: oversubscribed core run the rank being waited for.
NAP_S = 50e-6
#: Seconds a wait goes on after it first saw that a rank it needs has left (its last messages may be in flight).
GRACE_S = 2.0
_POLLS = range(CLOCK_EVERY)
_yield = os.sched_yield


class Overdue(Exception):
    """A wait passed its call's deadline; caught by the communicator and turned into a TimeoutError."""


class Deadline:
    """The clock side of waits (one wait, or every wait of one call): started by its first clock read.

    ``needs``: a function giving the world ranks the wait needs (default: none, so no departure ends it)."""

    __slots__ = ("expires", "rounds", "noticed", "_needs")

    def __init__(self, needs: Callable[[], Collection[int]] | None = None):
        self.expires = 0.0  # set at the first clock read
        self.rounds = 0     # clock reads so far
        self._needs = needs

    def needs(self) -> Collection[int]:
        """The world ranks this wait still needs (read only once a rank has left the job)."""
        return () if self._needs is None else self._needs()

    def past(self, timeout: float) -> bool:
        """Read the clock (the first read starts the deadline, ``timeout`` s on); nap once the wait is long.
        True past the deadline; ConnectionError once a rank this wait needs has left (see the module docstring)."""
        now = time.monotonic()
        self.rounds += 1
        if not self.expires:
            self.expires = now + timeout
            self.noticed = 0.0   # when this wait first saw that a rank it needs had left
            return False
        if self.rounds > SPIN_ROUNDS:   # a long wait: nap, and look whether a rank it needs has left
            time.sleep(NAP_S)
            job = departures()
            if job is not None and job.gone():
                self._check_departed(job.left, now)
        return now > self.expires

    def _check_departed(self, left: dict[int, float], now: float) -> None:
        """ConnectionError naming the first needed rank that has left, ``GRACE_S`` after this wait first saw it."""
        gone = sorted(set(left).intersection(self.needs()))
        if not gone:
            return
        if not self.noticed:
            self.noticed = now
        elif now - self.noticed > GRACE_S:
            raise ConnectionError(f"world rank {gone[0]} left the job (it exited normally) while this rank still "
                                  f"needed it")


def world_members(transport) -> list[int]:
    """The world ranks of ``transport``'s members when it runs over MPI (through any reordered view of it, whose
    ``inner`` it is), else none; read only once a rank has left the job."""
    job = departures()
    while getattr(transport, "inner", None) is not None:
        transport = transport.inner
    comm = getattr(transport, "comm", None) if transport.name == "mpi" else None
    return [] if job is None or comm is None else job.world_ranks(comm)


def wait_until(done: Callable[[], bool], overdue: Callable[[], bool], every: Callable[[], None] | None = None) -> None:
    """Poll ``done()``, yielding the CPU between polls, until it is true; every ``CLOCK_EVERY`` polls call
    ``overdue()`` (Overdue when it is true), then ``every()`` if given (e.g. a liveness check)."""
    while True:
        for _ in _POLLS:
            if done():
                return
            _yield()
        if overdue():
            raise Overdue
        if every is not None:
            every()


def timeout_text(what: str, timeout: float, waiting: str) -> str:
    """The one timeout message: ``what`` waited ``timeout`` s ``waiting``, and what it may mean."""
    return (f"{what} timed out after {timeout:g} s waiting {waiting}: a peer crashed, hangs, or called a different "
            f"collective ({variables.DEBUG.name}=1 checks that); this communicator is now unusable")
