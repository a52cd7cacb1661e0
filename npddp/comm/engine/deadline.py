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
