"""Every rank's clock on rank 0's: the offset by ping-pong, and the job's common origin and token.

Clocks are ``time.perf_counter_ns``. Each rank measures its offset to rank 0 by ping-pong over the
communicator (:data:`PING_ROUNDS` rounds, the one with the smallest round trip wins); only ``rank``,
``size``, ``send`` and ``recv`` are used, under :data:`TAG`, the tracer's tag.
"""

from __future__ import annotations

import secrets
import time

import numpy as np

#: Ping-pong rounds per rank; the round with the smallest round trip gives the offset.
PING_ROUNDS = 32
#: The tag of the tracer's point-to-point messages (these and the events sent to rank 0).
TAG = 3917


def clock_offset(comm, rounds: int = PING_ROUNDS) -> tuple[int, int]:
    """(offset, round trip) in ns of this rank's clock to rank 0's (collective; rank 0 gets (0, 0)).

    Rank r sends its time, rank 0 answers with its own; the offset of the round with the
    smallest round trip is rank 0's time minus the midpoint of r's send and receive.
    """
    now = time.perf_counter_ns
    msg = np.zeros(1, dtype=np.int64)
    if comm.rank == 0:
        for peer in range(1, comm.size):
            for _ in range(rounds):
                comm.recv(msg, source=peer, tag=TAG)
                msg[0] = now()
                comm.send(msg, dest=peer, tag=TAG)
        return 0, 0
    best = (2**62, 0)
    for _ in range(rounds):
        t1 = now()
        msg[0] = t1
        comm.send(msg, dest=0, tag=TAG)
        comm.recv(msg, source=0, tag=TAG)
        t2 = now()
        best = min(best, (t2 - t1, int(msg[0]) - (t1 + t2) // 2))
    return best[1], best[0]


def job_origin(comm) -> tuple[int, int]:
    """(origin ns on rank 0's clock, job token): rank 0's values, on every rank."""
    now = time.perf_counter_ns()
    mine = np.array([now, secrets.randbits(62)], dtype=np.int64)
    if comm.rank == 0:
        for peer in range(1, comm.size):
            comm.send(mine, dest=peer, tag=TAG)
        return now, int(mine[1])
    comm.recv(mine, source=0, tag=TAG)
    return int(mine[0]), int(mine[1])
