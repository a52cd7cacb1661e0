"""Process glue without MPI: exit statuses, the one-line message when
the MPI library cannot be loaded, and run_main's handling of SystemExit in a single process."""

import pytest

from npddp.process import job as launch


@pytest.mark.parametrize("code, status", [(None, 0), (0, 0), (3, 3), (256 + 4, 4), (-1, 255), ("text", 1),
                                          (True, 1)])
def test_exit_status_is_what_python_gives_systemexit(code, status):
    assert launch.exit_status(code) == status


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
