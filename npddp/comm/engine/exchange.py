"""The engine side of an all-to-all algorithm: blocks of a flat buffer, and the base class every one builds on.

An all-to-all algorithm (registered for the collective ``alltoall``) is an :class:`Exchange`: it
turns one call's per-destination blocks of the flat send buffer and per-source blocks of the flat
output into rounds of messages (:class:`~npddp.comm.engine.work.RoundWork`: each round's sends and
receives, then an action once they have completed). :meth:`Exchange.start` runs them after any
rounds the communicator puts first (the trade of an ``alltoallv``'s counts), so one schedule
serves the blocking and the non-blocking call. ``equal`` says every block has the same count (an
``alltoall``), which schedules that move several blocks in one message (Bruck's) need.
"""

from __future__ import annotations

import numpy as np

from npddp.comm.engine.work import DoneWork, RoundWork


def offsets(counts: np.ndarray) -> list[int]:
    """``size + 1`` offsets of blocks of ``counts`` elements laid end to end."""
    bounds = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=bounds[1:])
    return bounds.tolist()


def blocks(flat: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    """``flat`` cut into consecutive views of ``counts[i]`` elements each."""
    bounds = offsets(counts)
    return [flat[bounds[i]:bounds[i + 1]] for i in range(counts.size)]


class Exchange:
    """Base of the all-to-all algorithms: ``rounds`` is the schedule, ``start`` runs it."""

    def __init__(self, ctx):
        self.ctx = ctx

    def rounds(self, flat: np.ndarray, out: np.ndarray, send: np.ndarray, recv: np.ndarray, equal: bool) -> list:
        """Rounds ``(sends, receives, action)`` moving block j of ``flat`` (``send[j]`` elements) to rank j and block
        s of ``out`` (``recv[s]`` elements) from rank s; this rank's own block is already in place."""
        raise NotImplementedError

    def start(self, call, flat, out, send, recv, equal: bool, result, first=()):
        """Run ``first``'s rounds, then this algorithm's; the Work handle (a DoneWork where nothing moves)."""
        rounds = [*first, *self.rounds(flat, out, send, recv, equal)]
        return RoundWork(call, rounds, result) if rounds else DoneWork(result)


def pairwise_rounds(rank: int, size: int, sends: list, recvs: list) -> list[tuple]:
    """Rounds of the pairwise exchange: in round k send ``sends[rank + k]`` and receive ``recvs[rank - k]`` (blocks of
    no elements send nothing)."""
    rounds = []
    for k in range(1, size):
        dest, source = (rank + k) % size, (rank - k) % size
        out = [(sends[dest], dest)] if sends[dest].size else []
        into = [(recvs[source], source)] if recvs[source].size else []
        if out or into:
            rounds.append((out, into, None))
    return rounds
