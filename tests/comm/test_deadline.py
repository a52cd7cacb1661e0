"""Serial tests of the one deadline loop (npddp.comm.engine.deadline) every hand-written wait runs."""

import time

import pytest

from npddp.comm.engine.deadline import CLOCK_EVERY, Deadline, Overdue, timeout_text, wait_until

pytestmark = pytest.mark.filterwarnings("error")


def test_a_wait_that_completes_reads_no_clock():
    deadline, polls = Deadline(), []

    def done():
        polls.append(1)
        return len(polls) == 3
    wait_until(done, lambda: deadline.past(0.0))
    assert len(polls) == 3 and deadline.rounds == 0 and deadline.expires == 0.0


def test_the_deadline_starts_at_the_first_clock_read_and_raises_past_it():
    deadline = Deadline()
    start = time.monotonic()
    with pytest.raises(Overdue):
        wait_until(lambda: False, lambda: deadline.past(0.05))
    assert time.monotonic() - start >= 0.05
    assert deadline.expires >= start + 0.05 and deadline.rounds >= 2


def test_every_runs_once_per_clock_read():
    reads, calls = [], []

    def overdue():
        reads.append(1)
        return len(reads) == 4
    with pytest.raises(Overdue):
        wait_until(lambda: False, overdue, lambda: calls.append(1))
    assert len(reads) == 4 and len(calls) == 3 and CLOCK_EVERY > 1


def test_the_timeout_message_names_the_wait_the_seconds_and_the_debug_switch():
    text = timeout_text("[rank 1] ring allreduce (collective #3, tag 16387)", 2.5, "to receive from rank 0")
    assert text.startswith("[rank 1] ring allreduce (collective #3, tag 16387) timed out after 2.5 s waiting to receive")
    assert "NPDDP_DEBUG=1" in text and text.endswith("this communicator is now unusable")
