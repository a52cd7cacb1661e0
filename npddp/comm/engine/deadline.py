"""Waiting on requests: how often the clock is read, when a wait naps, and the exception past a deadline.

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
from collections.abc import Callable

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


class Overdue(Exception):
    """A wait passed its call's deadline; caught by the communicator and turned into a TimeoutError."""


class Deadline:
    """The clock side of waits (one wait, or every wait of one call): started by its first clock read."""

    __slots__ = ("expires", "rounds")

    def __init__(self):
        self.expires = 0.0  # set at the first clock read
        self.rounds = 0     # clock reads so far

    def past(self, timeout: float) -> bool:
        """Read the clock (the first read starts the deadline, ``timeout`` s on); nap once the wait is long.
        True past the deadline."""
        now = time.monotonic()
        self.rounds += 1
        if not self.expires:
            self.expires = now + timeout
            return False
        if self.rounds > SPIN_ROUNDS:
            time.sleep(NAP_S)
        return now > self.expires


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
