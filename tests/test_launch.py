"""Process glue without MPI: exit statuses, the launcher's rank and size, the one-line message when
the MPI library cannot be loaded, and run_main's handling of SystemExit in a single process."""

import pytest

from npddp import launch


@pytest.mark.parametrize("code, status", [(None, 0), (0, 0), (3, 3), (256 + 4, 4), (-1, 255), ("text", 1),
                                          (True, 1)])
def test_exit_status_is_what_python_gives_systemexit(code, status):
    assert launch.exit_status(code) == status


@pytest.mark.parametrize("environ, rank, size", [
    ({}, 0, 1), ({"PMI_RANK": "3", "PMI_SIZE": "4"}, 3, 4),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, 1, 2),
    ({"RANK": "2", "WORLD_SIZE": "8"}, 2, 8), ({"PMI_RANK": "x"}, 0, 1)])
def test_rank_and_size_come_from_the_launchers_environment(environ, rank, size):
    assert (launch.launched_rank(environ), launch.launched_size(environ)) == (rank, size)


def test_the_exit_codes_are_distinct_and_documented():
    codes = [launch.EXIT_OK, launch.EXIT_FAILED, launch.EXIT_USAGE, launch.EXIT_DIVERGED, launch.EXIT_WRITE]
    assert codes == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("error, start", [
    (RuntimeError("cannot load MPI library\nlibmpi.so.12: cannot open shared object file"),
     "cannot load the MPI library (libmpi.so.12: cannot open shared object file);"),
    (ImportError("No module named 'mpi4py'"), "mpi4py cannot be imported (No module named 'mpi4py')")])
def test_a_missing_mpi_is_a_job_error_naming_both_fixes(monkeypatch, error, start):
    import npddp.comm

    def create(*args, **kwargs):
        raise error
    monkeypatch.setattr(npddp.comm, "create", create)
    with pytest.raises(launch.JobError) as info:
        launch.open_communicator("mpi")
    text = str(info.value)
    assert info.value.code == 2 and text.startswith(start) and "\n" not in text
    assert 'pip install "npddp[mpich]"' in text and "python -m npddp.run" in text


def test_other_runtime_errors_are_not_mistaken_for_a_missing_mpi(monkeypatch):
    import npddp.comm

    def create(*args, **kwargs):
        raise RuntimeError("something else")
    monkeypatch.setattr(npddp.comm, "create", create)
    with pytest.raises(RuntimeError, match="something else"):
        launch.open_communicator("mpi")


def test_run_main_in_a_single_process_returns_the_status_and_lets_systemexit_through(monkeypatch):
    import sys

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    monkeypatch.setattr(sys, "exit", sys.exit)
    assert launch.run_main(lambda argv: 3) == 3
    with pytest.raises(SystemExit) as info:
        launch.run_main(lambda argv: sys.exit(5))
    assert info.value.code == 5
