"""The receives a communicator posts for its peers' aborts go with it: none is left on the group it ran over.

Over MPI they stay posted while the communicator lives (:class:`~npddp.comm.engine.abort.AbortWatch`);
left posted on a group the user passed (``MPI.COMM_WORLD``), they would take the aborts of a later
communicator on that group and hold the group until ``MPI_Finalize``, which MPICH reports as
``Builtin communicator ... has pending N references``.
"""

from __future__ import annotations

import gc
import time

import numpy as np
import pytest

from npddp.comm import create
from npddp.comm.communicators.p2p import P2PCommunicator
from npddp.comm.engine.abort import ABORT_WORDS, CONTROL_TAG
from npddp.comm.algorithms.ring import Ring

_PROBE_S = 10.0


class Posted:
    """A receive that never completes; ``cancelled`` once withdrawn."""

    def __init__(self):
        self.cancelled = False

    def test(self) -> bool:
        return False

    def cancel(self) -> None:
        self.cancelled = True


class Silent:
    """Rank 0 of two whose peer never sends; every receive it posts is kept in ``posted``."""

    name, rank, size = "silent", 0, 2

    def __init__(self):
        self.posted: list[Posted] = []

    def irecv(self, buf, source, tag):
        self.posted.append(Posted())
        return self.posted[-1]


def test_a_collected_communicator_cancels_the_receives_it_posted_for_aborts():
    transport = Silent()
    comm = P2PCommunicator(transport, Ring, "ring")
    comm.check_args = True
    assert comm.watch.heard() is None   # the first look posts one receive per peer
    assert len(transport.posted) == 1 and not transport.posted[0].cancelled
    del comm
    gc.collect()
    assert transport.posted[0].cancelled


@pytest.mark.mpi(min_size=2)
@pytest.mark.needs_mpi
@pytest.mark.parametrize("backend", ["ring", "shm"])
def test_no_receive_stays_posted_on_the_users_group_once_its_communicator_is_gone(backend, comm_world,
                                                                                 assert_all_ranks):
    """An abort-sized message sent on the group afterwards is still there to probe, not taken by a stale receive."""
    group = comm_world.Dup()   # the user's group, passed as it is
    rank, size = group.Get_rank(), group.Get_size()
    comm = create(backend, group)
    comm.allreduce(np.ones(1009))
    assert comm.watch.heard() is None   # post the receives for aborts, as a wait that lasts does
    del comm
    gc.collect()
    group.Barrier()
    peer = (rank + 1) % size
    note = np.full(ABORT_WORDS, rank, dtype=np.int64)
    send = group.Isend(note, peer, CONTROL_TAG)
    source = (rank - 1) % size
    deadline = time.monotonic() + _PROBE_S
    seen = False
    while not seen and time.monotonic() < deadline:
        seen = group.Iprobe(source, CONTROL_TAG)
    if seen:
        group.Recv(np.empty(ABORT_WORDS, dtype=np.int64), source, CONTROL_TAG)
    else:
        send.Cancel()
    send.Wait()
    group.Barrier()
    if seen:
        group.Free()
    assert_all_ranks(seen, f"rank {source}'s message on the control tag was taken by a receive left posted")
