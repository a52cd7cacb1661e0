"""The ring's blocking path (:meth:`npddp.comm.algorithms.ring.Ring.run`): a small pass step by step, no state machine.

It sends the same messages in the same order as the state machine, so a rank on one path meets
a rank on the other, and the bits agree with the non-blocking call's.
"""

import numpy as np
import pytest

from npddp.comm import create
from npddp.comm.algorithms import ring

from tests.helpers.ranks import world_raw

pytestmark = pytest.mark.mpi


def _x(n: int, rank: int, dtype) -> np.ndarray:
    return ((np.arange(n) * 7 + rank * 3) % 11 - 5).astype(dtype) / 4


def test_small_blocking_call_runs_without_state_machine(monkeypatch, assert_ranks_agree_on_all):
    comm = create("ring", world_raw())
    x = _x(256, comm.rank, np.float32)
    want = comm.iallreduce(x.copy(), "avg").wait()

    def refuse(*args, **kwargs):
        raise AssertionError("a small blocking ring call built the state machine")
    monkeypatch.setattr(ring, "RingWork", refuse)
    got = comm.allreduce(x, "avg", out=np.empty_like(x))
    assert np.array_equal(got, want)
    assert_ranks_agree_on_all([got])


def test_paths_meet_and_agree(assert_ranks_agree_on_all):
    comm = create("ring", world_raw())
    comm.chunk_bytes = 64   # 1000 float64: several chunks per step, the state machine's blocking use
    results = []
    for n, dtype in ((comm.size - 1, np.float64), (comm.size + 1, np.float32), (1000, np.float64)):
        a, b = _x(n, comm.rank, dtype), _x(n, comm.rank + 1, dtype)
        want_b = comm.iallreduce(b.copy()).wait()
        pending = comm.iallreduce(a)          # rank 0 runs b's call beside it (the state machine), the others
        if comm.rank != 0:                    # finish it first (the blocking path)
            pending.wait()
        got_b = comm.allreduce(b.copy())
        pending.wait()
        assert np.array_equal(got_b, want_b)
        results += [a, got_b]
    assert_ranks_agree_on_all(results)
