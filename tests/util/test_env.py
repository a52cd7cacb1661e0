"""The process environment: launcher, rank, size, ranks per node and thread settings from the variables launchers set."""

import pytest

from npddp.util import env


@pytest.mark.parametrize("environ, rank, size", [
    ({}, 0, 1), ({"PMI_RANK": "3", "PMI_SIZE": "4"}, 3, 4),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, 1, 2),
    ({"PMIX_RANK": "5", "PMIX_SIZE": "6"}, 5, 6),
    ({"RANK": "2", "WORLD_SIZE": "8"}, 2, 8), ({"PMI_RANK": "x"}, 0, 1),
    ({"SLURM_PROCID": "3", "SLURM_NTASKS": "4"}, 0, 1)])   # an allocation, not a launched rank
def test_rank_and_size_come_from_the_launchers_environment(environ, rank, size):
    assert (env.world_rank(environ), env.world_size(environ)) == (rank, size)


@pytest.mark.parametrize("environ, expected", [
    ({}, None), ({"RANK": "0", "WORLD_SIZE": "2"}, "tcp"), ({"RANK": "0"}, None),
    ({"PMI_RANK": "0", "PMI_SIZE": "2"}, "mpi"), ({"MPI_LOCALNRANKS": "2"}, "mpi"),
    ({"RANK": "0", "WORLD_SIZE": "2", "PMI_SIZE": "2"}, "mpi"), ({"OMPI_COMM_WORLD_SIZE": "2"}, "mpi"),
    ({"PMIX_RANK": "1"}, "mpi"), ({"SLURM_NTASKS": "4"}, None)])
def test_the_launcher_is_named_by_its_variables(environ, expected):
    assert env.launcher(environ) == expected
    assert env.launched_by_mpi(environ) == (expected == "mpi")


@pytest.mark.parametrize("environ, expected", [
    ({}, None), ({"LOCAL_WORLD_SIZE": "3"}, (3, "LOCAL_WORLD_SIZE")), ({"MPI_LOCALNRANKS": "2"}, (2, "MPI_LOCALNRANKS")),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "4", "MPI_LOCALNRANKS": "2"}, (2, "MPI_LOCALNRANKS")),
    ({"LOCAL_WORLD_SIZE": "0"}, None), ({"LOCAL_WORLD_SIZE": "two"}, None)])
def test_ranks_per_node_come_from_the_first_valid_variable(environ, expected):
    assert env.local_size(environ) == expected


@pytest.mark.parametrize("environ, expected", [
    ({}, None), ({"OMP_NUM_THREADS": "2"}, (2, "OMP_NUM_THREADS")),
    ({"OPENBLAS_NUM_THREADS": "3", "OMP_NUM_THREADS": "1"}, (3, "OPENBLAS_NUM_THREADS")),
    ({"OMP_NUM_THREADS": "0", "MKL_NUM_THREADS": "4"}, (4, "MKL_NUM_THREADS")), ({"OMP_NUM_THREADS": " "}, None)])
def test_the_thread_setting_is_the_first_positive_thread_variable(environ, expected):
    assert env.thread_setting(environ) == expected


@pytest.mark.parametrize("environ, expected", [
    ({}, ""), ({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2",
               "SLURM_STEP_NODELIST": "vm"}, "slurm job 7 step 1"),
    ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "NPDDP_JOB_ID": "ab12"}, "npddp.run job ab12"),
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "NPDDP_JOB_ID": "ab12"}, ""),   # each machine its own id
    ({"RANK": "1", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "r9"}, "torchrun run r9")])
def test_the_jobs_identity_is_what_every_rank_of_it_shares(environ, expected):
    assert env.job_identity(environ) == expected
