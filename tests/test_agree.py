"""Agreeing across ranks (run under mpirun --with-mpi): one rank's error reaches all, text and flags
travel as NumPy buffers, for every backend."""

import pytest

from npddp.agree import agree, any_rank, share_text
from npddp.comm import BACKENDS, create


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_first_ranks_error_text_and_flags_reach_every_rank(comm_world, assert_all_ranks, backend):
    comm = create(backend, comm_world)
    last = comm.size - 1
    got = [agree(comm, None),
           agree(comm, "bad file" if comm.rank == last else None),
           agree(comm, f"problem {comm.rank}"),
           share_text(comm, "naïve json {\"a\": [1, 2]}" if comm.rank == 0 else None),
           share_text(comm, "from the last" if comm.rank == last else "", root=last),
           any_rank(comm, comm.rank == last), any_rank(comm, False)]
    want = [None, f"(on rank {last}) bad file", "problem 0", "naïve json {\"a\": [1, 2]}", "from the last",
            True, False]
    assert_all_ranks(got == want, f"{got}")
