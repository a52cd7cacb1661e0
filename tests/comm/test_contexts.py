"""Every communicator has a message context of its own (TCP: agreed at create; MPI: a Dup).

Run under ``mpirun -n 2`` (``--with-mpi -m mpi``) and under ``python -m npddp.run --nproc 2``:
a communicator created after another timed out with frames of it still in flight returns
exact results on every rank, and dropping communicators retires their contexts.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from npddp.comm import create

from tests.helpers.ranks import TCP_MODE

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.mark.parametrize("backend", ["ring", "naive", "rd"])
def test_a_communicator_created_after_a_timeout_never_reads_the_abandoned_ones_frames(backend, assert_all_ranks):
    old = create(backend, timeout=0.5)
    rank, size = old.rank, old.size
    n = 1000
    if rank == size - 1:   # this rank alone calls the collective: its frames go out, nobody answers them
        try:
            old.allreduce(np.full(n, -7.0))
            timed_out = False
        except TimeoutError:
            timed_out = True
    else:
        timed_out = True
    new = create(backend, timeout=60)
    for step in range(3):  # the same tags again, from the start
        x = np.full(n, float(10 ** step * (rank + 1)))
        new.allreduce(x)
        expected = 10.0 ** step * size * (size + 1) / 2
        wrong = int(np.count_nonzero(x != expected))
        assert_all_ranks(timed_out and wrong == 0, f"rank {rank} step {step}: {wrong}/{n} wrong, timed out {timed_out}")


def test_many_communicators_created_and_dropped_keep_their_messages_apart(assert_all_ranks):
    results = []
    for i in range(40):
        comm = create("ring", timeout=60)
        x = np.full(5, float(comm.rank + i))
        comm.allreduce(x)
        results.append(x[0] == sum(r + i for r in range(comm.size)))
        del comm
    gc.collect()
    ok = all(results)
    if TCP_MODE:
        from npddp.comm.transports.world import world_from_env
        world = world_from_env(60).world
        ok = ok and len(world.retired) >= 39 and not any(k[0] in world.retired for p in world.peers for k in p.early)
    assert_all_ranks(ok, f"results {results}")


def test_tcp_contexts_are_agreed_even_when_one_rank_made_an_extra_transport(assert_all_ranks):
    if not TCP_MODE:
        pytest.skip("TCP contexts only (MPI's Dup gives contexts by itself)")
    from npddp.comm.transports.world import world_from_env
    world = world_from_env(60).world
    extra = world.transport() if world.rank == 0 else None   # rank 0 alone: its counter runs ahead
    comm = create("ring", timeout=60)
    x = np.full(3, float(comm.rank + 1))
    comm.allreduce(x)
    assert_all_ranks(x[0] == comm.size * (comm.size + 1) / 2 and extra is not comm, f"got {x}")


def test_a_message_nobody_received_on_a_dropped_communicator_never_reaches_the_next(assert_all_ranks):
    old = create("ring", timeout=60)
    rank, size = old.rank, old.size
    after, before = (rank + 1) % size, (rank - 1) % size
    old.send(np.full(3, -1, dtype=np.int64), after, tag=7)   # never received: this program "ended" first
    if not TCP_MODE:   # MPI: wait until the stray message has arrived here, as it has when a program ends late
        import time
        deadline = time.monotonic() + 10
        while not old.transport.unmatched_tags(before) and time.monotonic() < deadline:
            time.sleep(0.001)
    old.barrier()
    del old
    gc.collect()   # over MPI the context is freed here, and MPICH gives it to the next Dup
    new = create("ring", timeout=60)
    got = np.zeros(3, dtype=np.int64)
    if rank % 2 == 0:
        new.send(np.full(3, rank, dtype=np.int64), after, tag=7)
        new.recv(got, before, tag=7)
    else:
        new.recv(got, before, tag=7)
        new.send(np.full(3, rank, dtype=np.int64), after, tag=7)
    assert_all_ranks(got.tolist() == [before] * 3, f"rank {rank} received {got.tolist()} from rank {before}")
