"""Agreeing across ranks (run under mpirun --with-mpi): one rank's error reaches all, text and flags
travel as NumPy buffers, for every backend."""

import pytest

from npddp.process.agree import agree, any_rank, share_text
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


@pytest.mark.mpi
@pytest.mark.parametrize("backend", BACKENDS)
def test_each_ranks_failure_reaches_every_rank_and_long_messages_are_cut(comm_world, assert_all_ranks, backend):
    comm = create(backend, comm_world)
    size, rank = comm.size, comm.rank
    seen = [agree(comm, f"cannot read x{failing}.npz: é" if rank == failing else None) for failing in range(size)]
    seen.append(agree(comm, "y" * 5000 if rank == size - 1 else None))
    expected = ["cannot read x0.npz: é"] + [f"(on rank {r}) cannot read x{r}.npz: é" for r in range(1, size)]
    expected.append("y" * 2048 if size == 1 else f"(on rank {size - 1}) " + "y" * 2048)
    assert_all_ranks(seen == expected, f"rank {rank} saw {seen}")
