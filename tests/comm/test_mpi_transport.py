"""The MPI transport frees the communicators it makes (its own context, its splits) once it is collected."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from npddp.comm.transports.mpi import MPITransport

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.needs_mpi]


def test_the_communicators_a_transport_makes_are_freed_when_it_is_collected(comm_world, assert_all_ranks):
    from mpi4py import MPI
    problems = []
    for how in ("dup", "split", "split of a split"):
        parent = MPITransport(comm_world, dup=True)
        made = parent if how == "dup" else parent.split([r % 2 for r in range(parent.size)])
        if how == "split of a split":
            made = made.split([0] * made.size)
        comm = made.comm
        if comm == MPI.COMM_NULL:
            problems.append(f"{how}: no communicator made")
        del parent, made
        gc.collect()
        if comm != MPI.COMM_NULL:
            problems.append(f"{how}: its communicator was not freed")
    kept = MPITransport(comm_world, dup=True)
    kept.irecv(np.zeros(1), (kept.rank + 1) % kept.size, 5).cancel()   # an abandoned receive: keep the context
    comm = kept.comm
    del kept
    gc.collect()
    if comm == MPI.COMM_NULL:
        problems.append("a communicator with an abandoned request was freed")
    assert_all_ranks(not problems, "; ".join(problems))
