"""The training CLI's error agreement: an error seen on any rank reaches every rank, so all exit together.

Run under ``mpirun -n K python -m pytest --with-mpi``.
"""

import pytest

BACKENDS = ("mpi", "ring", "naive")


@pytest.mark.mpi
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_rank_gets_the_first_failing_ranks_message(comm_world, assert_all_ranks, backend):
    from npddp.comm import create
    from npddp.train import agree

    comm = create(backend, comm_world)
    size, rank = comm.size, comm.rank
    seen = []
    for failing in range(size):                    # one rank fails
        seen.append(agree(comm, f"cannot read x{failing}.npz: é" if rank == failing else None))
    seen.append(agree(comm, None))                 # nobody fails
    seen.append(agree(comm, f"rank {rank} failed"))  # everybody fails: rank 0's message wins
    seen.append(agree(comm, "y" * 5000 if rank == size - 1 else None))  # long messages are cut
    expected = ["cannot read x0.npz: é"] + [f"(on rank {r}) cannot read x{r}.npz: é" for r in range(1, size)]
    expected += [None, "rank 0 failed"]
    tail = "y" * 2048 if size == 1 else f"(on rank {size - 1}) " + "y" * 2048
    ok = seen[:-1] == expected and seen[-1] == tail
    assert_all_ranks(ok, f"rank {rank} saw {seen[:-1]}")
