"""One collective call in progress: its tag, what to name in errors, and the deadline of its waits.

Every wait polls its request with ``Test`` and yields the CPU between polls; every
``CLOCK_EVERY`` polls it reads the clock. A call's deadline starts at its first clock read, so
a call that never waits long never reads the clock.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from . import _common as c

#: Polls of a request between two reads of the clock.
CLOCK_EVERY = 64
_POLLS = range(CLOCK_EVERY)


class TagSequence:
    """Tags for collectives: ``USER_TAG_LIMIT + (sequence % COLLECTIVE_TAG_SPAN)``, same order on all ranks."""

    __slots__ = ("_seq", "count")

    def __init__(self):
        self._seq = 0
        self.count = 0  # tags handed out so far

    def next(self) -> int:
        """Tag of the next collective."""
        tag = c.USER_TAG_LIMIT + self._seq
        self._seq = (self._seq + 1) % c.COLLECTIVE_TAG_SPAN
        self.count += 1
        return tag


class Overdue(Exception):
    """A wait passed its call's deadline; caught by the waiting engine and turned into a TimeoutError."""


class Call:
    """One collective (or send/recv) in progress: what to name in errors, and the deadline of its waits."""

    __slots__ = ("owner", "operation", "number", "tag", "expires")

    def __init__(self, owner, operation: str, number: int | None, tag: int):
        self.owner, self.operation, self.number, self.tag = owner, operation, number, tag
        self.expires = 0.0  # set at the first clock read

    def overdue(self) -> bool:
        """Read the clock; the first read starts the deadline. True once it has passed."""
        now = time.monotonic()
        if not self.expires:
            self.expires = now + self.owner.timeout
            return False
        return now > self.expires

    def wait(self, request) -> None:
        """Complete ``request``, yielding the CPU between polls; Overdue past the deadline."""
        while True:
            for _ in _POLLS:
                if request.Test():
                    return
                os.sched_yield()  # when ranks outnumber cores, let the rank we wait for run
            if self.overdue():
                raise Overdue

    def describe(self) -> str:
        """E.g. ``ring allreduce (collective #12, tag 16395)``."""
        what = f"collective #{self.number}, " if self.number is not None else ""
        return f"{self.owner.name} {self.operation} ({what}tag {self.tag})"

    def timeout_error(self, recv_from: Sequence[int], send_to: Sequence[int]) -> TimeoutError:
        """The error of this call, still waiting on messages from and to the given ranks."""
        waits = []
        if recv_from:
            waits.append("to receive from " + _ranks(recv_from))
        if send_to:
            waits.append("to send to " + _ranks(send_to))
        return TimeoutError(
            f"[rank {self.owner.rank}] {self.describe()} timed out after {self.owner.timeout:g} s waiting "
            f"{' and '.join(waits) or 'for its peers'}: a peer crashed, hangs, or called a different "
            "collective (NPDDP_DEBUG=1 checks that); this communicator is now unusable")


def _ranks(ranks: Sequence[int]) -> str:
    """``rank 3`` or ``ranks 1, 3``."""
    ranks = sorted(set(ranks))
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
