"""Node barriers and CPUs: a rank whose wait finds the rank it waits for on its own CPU moves to a CPU no rank uses.

Two ranks that wait by yielding never sleep, so the kernel, which spreads tasks mostly when they
wake, can leave them taking turns on one CPU while another idles (about twice the time of a
call). These tests drive one rank's :class:`NodeSync` against peers' control lines written by
hand, in this process.
"""

import os

import numpy as np
import pytest

from npddp.comm.node import memory
from npddp.comm.node.memory import CPU, LINE, SEQ, NodeSync

pytestmark = pytest.mark.skipif(memory._GETCPU is None or memory.usable_cpus() < 2,
                                reason="needs sched_getcpu, sched_setaffinity and two CPUs (Linux)")


class _Call:
    """A call whose clock reads let peer 1 arrive at barrier ``seq`` (so a wait ends whatever it did first)."""

    def __init__(self, words, seq: int):
        self.words, self.seq = words, seq

    def overdue(self) -> bool:
        self.words[LINE + SEQ] = self.seq
        return False


def _sync(ranks: int = 2) -> NodeSync:
    """Local rank 0 of ``ranks``, allowed to move off a shared CPU."""
    sync = NodeSync(np.zeros(ranks * LINE, dtype=np.int64), 0, list(range(ranks)))
    sync.spread = True
    return sync


def test_a_wait_for_a_peer_on_the_same_cpu_moves_this_rank_to_another_and_restores_its_affinity(monkeypatch):
    before, real, calls = os.sched_getaffinity(0), os.sched_setaffinity, []

    def spy(pid, cpus):
        real(pid, cpus)
        calls.append((set(cpus), memory._GETCPU()))
    monkeypatch.setattr(memory.os, "sched_setaffinity", spy)
    for _ in range(20):   # the kernel may move this thread between reading its CPU and the wait: try again
        sync, cpu = _sync(), memory._GETCPU()
        sync.words[LINE + CPU] = cpu
        sync.wait(1, _Call(sync.words, 1))
        if calls:
            break
    assert calls, "no wait moved off the CPU the rank it waited for had noted"
    (narrowed, ran_on), (restored, _) = calls
    assert narrowed == {ran_on} and ran_on != cpu and ran_on in before, "moved at once to a CPU no rank noted"
    assert sync.words[CPU] == ran_on, "and noted it"
    assert restored == before and os.sched_getaffinity(0) == before


def test_a_wait_for_a_peer_on_another_cpu_stays():
    sync = _sync()
    sync.words[LINE + CPU] = 10_000
    assert not sync.leave_shared_cpu(1)
    assert 0 <= sync.words[CPU] < 10_000, "the wait noted its own CPU"


def test_a_wait_that_ends_at_once_notes_nothing():
    sync = _sync()
    sync.words[LINE + CPU] = memory._GETCPU()
    sync.words[LINE + SEQ] = 1
    sync.wait(1, _Call(sync.words, 1))
    assert sync.words[CPU] == -1


def test_no_move_when_every_cpu_is_noted_by_a_rank(monkeypatch):
    moves = []
    monkeypatch.setattr(memory.os, "sched_setaffinity", lambda pid, cpus: moves.append(set(cpus)))
    allowed = sorted(os.sched_getaffinity(0))
    sync = _sync(len(allowed) + 1)
    cpu = memory._GETCPU()
    for i, noted in enumerate([cpu, *(c for c in allowed if c != cpu)], 1):
        sync.words[i * LINE + CPU] = noted
    assert not sync.leave_shared_cpu(1) and moves == []


def test_moves_that_leave_the_ranks_together_back_off_and_time_apart_starts_over(monkeypatch):
    moves = []
    monkeypatch.setattr(memory.os, "sched_setaffinity", lambda pid, cpus: moves.append(set(cpus)))
    sync = _sync()

    def shared_wait():
        sync.words[LINE + CPU] = memory._GETCPU()   # the rank waited for is (still) on ours
        return sync.leave_shared_cpu(1)
    moved = [shared_wait() for _ in range(16)]
    assert [i for i, m in enumerate(moved) if m] == [0, 2, 5, 10], "1, 2, 4 shared waits let pass between moves"
    assert len(moves) == 8, "each move narrows the affinity to one CPU, then restores it"
    sync.words[LINE + CPU] = -2
    assert not any(sync.leave_shared_cpu(1) for _ in range(memory._MOST_SKIPPED))
    assert shared_wait(), "after as many waits apart as the longest pause, the first shared wait moves"


def test_more_ranks_than_cpus_never_move():
    ranks = memory.usable_cpus() + 1
    assert not NodeSync(np.zeros(ranks * LINE, dtype=np.int64), 0, list(range(ranks))).spread
    assert NodeSync(np.zeros(2 * LINE, dtype=np.int64), 0, [0, 1]).spread
