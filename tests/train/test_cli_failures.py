"""``python -m npddp.train`` when things go wrong during a run, and what a user sees while it runs,
launched under ``mpirun -n 2`` as subprocesses (serial tests that need a working mpirun).

Covered: a non-finite loss or gradient stops every rank with one line and exit 3, leaving the last
checkpoint; ``sys.exit`` on one rank ends the job with its status; a checkpoint or metrics write that
fails (a file-size limit standing in for a full disk) is one line and exit 4 with the previous file
intact and no temporary file; a missing MPI library is one line naming the fixes; temporary files of
a crashed writer are removed with one line; progress lines appear in a log; evaluate and load_model
reproduce the validation numbers of the run.
"""

import resource
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from npddp.checkpoint import fileformat
from tests.helpers.cli import LIMITED, TINY, clean_env, epoch_lines, error_line, mpirun_path, ok, train
from npddp.train.checkpoint.saving import load_model


@pytest.mark.parametrize("backend", ["mpi", "ring"], ids=["with-mpi-backend", "with-ring-backend"])
def test_a_nan_on_one_rank_stops_every_rank_with_exit_3_and_keeps_the_last_checkpoint(tmp_path, backend):
    proc = train(tmp_path, *TINY, "--backend", backend, "--checkpoint", "c.h5", "--checkpoint-every", "2",
                 "--metrics", "m.h5", "--inject-fault", "1:5:nan")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    line = error_line(proc)
    assert "training diverged at step 5 (epoch 1): the gradient of" in line and "NaN or infinite" in line
    assert "the last checkpoint c.h5 (step 4) is kept" in line and "--lr" in line
    assert "done:" not in proc.stdout
    saved = fileformat.read(tmp_path / "c.h5")
    assert saved.step == 4 and all(np.all(np.isfinite(v)) for v in saved.params.values())


def test_a_learning_rate_that_blows_up_is_stopped_instead_of_printing_nan(tmp_path):
    proc = train(tmp_path, *TINY[:-4], "--epochs", "4", "--lr", "50")           # float32
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "training diverged at step" in error_line(proc)
    assert "nan" not in "".join(epoch_lines(proc.stdout)).lower()


@pytest.mark.parametrize("backend", ["mpi", "ring"], ids=["with-mpi-backend", "with-ring-backend"])
def test_sys_exit_on_one_rank_ends_the_job_with_its_status(tmp_path, backend):
    start = time.monotonic()
    proc = train(tmp_path, *TINY, "--backend", backend, "--inject-fault", "1:3:exit", timeout=90)
    assert proc.returncode == 3 and time.monotonic() - start < 30, proc.stderr
    assert "[rank 1] exit status 3, ending all 2 ranks" in proc.stderr


#: The training CLI in a process whose SIGXFSZ is at its default, killing (CPython ignores it at start-up,
#: a host embedding Python or a wrapper that restores default dispositions does not).
DEFAULT_SIGXFSZ = """
import runpy, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
sys.argv[0] = "npddp.train"
runpy.run_module("npddp.train", run_name="__main__", alter_sys=True)
"""


def _limit_file_size() -> None:
    """In the child before exec: files of at most 12 kB."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (12000, 12000))


def test_a_file_size_limit_makes_a_write_fail_with_exit_4_even_where_sigxfsz_would_kill(tmp_path):
    command = [sys.executable, "-c", DEFAULT_SIGXFSZ, *TINY, "--epochs", "1", "--backend", "ring",
               "--checkpoint", "c.h5"]
    with socket.socket() as s:                 # one rank over TCP: no MPI shared-memory files, which the limit refuses
        s.bind(("127.0.0.1", 0))
        world = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(s.getsockname()[1])}
    proc = subprocess.run(command, cwd=tmp_path, env={**clean_env(), **world, "PYTHONDONTWRITEBYTECODE": "1"},
                          capture_output=True, text=True, timeout=120, preexec_fn=_limit_file_size)
    assert proc.returncode == 4, f"exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
    assert error_line(proc) == ("error: cannot write c.h5: File too large; there was no previous file, training "
                                 "stopped"), proc.stderr
    assert not (tmp_path / "c.h5").exists()


@pytest.mark.slow
def test_a_checkpoint_write_that_fails_is_one_line_exit_4_and_the_old_file_survives(tmp_path):
    ok(train(tmp_path, *TINY, "--checkpoint", "c.h5", "--max-steps", "5"))
    before = (tmp_path / "c.h5").read_bytes()
    command = [mpirun_path(), "-n", "2", sys.executable, "-c", LIMITED, "--checkpoint", "c.h5", "--resume"]
    proc = subprocess.run(command, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    line = error_line(proc)
    assert line.startswith("error: cannot write c.h5: File too large; the previous file is kept"), line
    assert (tmp_path / "c.h5").read_bytes() == before and fileformat.read(tmp_path / "c.h5").step == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.h5"]


@pytest.mark.slow
def test_a_missing_mpi_library_is_one_line_naming_the_fixes(tmp_path):
    """Under an MPI launcher a job needs MPI: one uncut line; one process with no launcher trains without it."""
    env = {**clean_env(), "MPI4PY_LIBMPI": str(tmp_path / "no" / "libmpi.so.12"), "PMI_SIZE": "2", "PMI_RANK": "0"}
    proc = subprocess.run([sys.executable, "-m", "npddp.train", "--epochs", "1"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    line = error_line(proc)
    assert line.startswith("error: cannot load the MPI library (") and str(tmp_path / "no" / "libmpi.so.12") in line
    assert 'pip install "npddp[mpich]"' in line and "a system MPI" in line
    assert "python -m npddp.run --nproc N -m npddp.train --backend auto" in line
    for code in ("sys.modules['mpi4py'] = None",
                 f"import os; os.environ['MPI4PY_LIBMPI'] = {str(tmp_path / 'no' / 'libmpi.so.12')!r}"):
        alone = (f"import sys; {code}; from npddp.train.cli.main import main; "
                 "sys.exit(main(['--epochs', '1', '--train-samples', '256', '--batch-size', '32', '--hidden', '8']))")
        proc = subprocess.run([sys.executable, "-c", alone], cwd=tmp_path, env=clean_env(), capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.splitlines()[-1].startswith("done: epoch 1/1"), proc.stderr


def test_temporary_files_left_by_a_crashed_writer_are_removed_with_one_line(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".c.h5.{socket.gethostname()}.{dead.pid}.0badc0de.npddp.tmp"
    stale.write_bytes(b"\0" * 4096)
    proc = ok(train(tmp_path, *TINY, "--epochs", "1", "--checkpoint", "c.h5"))
    assert proc.stderr.strip() == ("warning: removed 1 stale temporary file of c.h5 (4.0 KiB) left by an "
                                   "earlier run that crashed while writing it")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.h5"]


@pytest.mark.slow
def test_under_mpirun_a_log_shows_progress_lines_within_an_epoch(tmp_path):
    proc = ok(train(tmp_path, *TINY, "--log-every", "1e-6"))   # stderr is no terminal: auto -> log; a line a step
    lines = [line for line in proc.stdout.splitlines() if line.startswith("step ")]
    assert len(lines) >= 10 and proc.stderr == ""
    for field in ("/24  epoch ", "%)  loss ", " samples/s  elapsed ", "  ETA "):
        assert all(field in line for line in lines), lines[0]
    assert not [line for line in ok(train(tmp_path, *TINY, "--quiet", "--log-every", "0.001")).stdout.splitlines()
                if line.startswith("step ")]


@pytest.mark.slow
def test_evaluate_and_load_model_reproduce_the_runs_validation_numbers(tmp_path):
    run = ok(train(tmp_path, *TINY, "--checkpoint", "c.h5"))
    last = epoch_lines(run.stdout)[-1]
    val_loss, val_acc = last.split("val_loss ")[1].split()[0], last.split("val_acc")[1].split("%")[0].strip()
    one = subprocess.run([sys.executable, "-m", "npddp.evaluate", "c.h5"], cwd=tmp_path, env=clean_env(),
                         capture_output=True, text=True, timeout=60)
    two = subprocess.run([mpirun_path(), "-n", "2", sys.executable, "-m", "npddp.evaluate", "c.h5"], cwd=tmp_path,
                         env=clean_env(), capture_output=True, text=True, timeout=60)
    for proc, ranks in ((one, "1 rank"), (two, "2 ranks")):
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        assert proc.stdout.startswith("evaluate: c.h5 (step 24, mlp 64-16-10) on synthetic val, 96 rows, " + ranks)
        assert proc.stdout.rstrip().endswith(f"loss {val_loss}, accuracy {val_acc}%"), (proc.stdout, last)
    model = load_model(tmp_path / "c.h5")
    from npddp.train.cli.inputs import load_data

    ds, _ = load_data(fileformat.read(tmp_path / "c.h5").config)
    correct = np.mean(np.argmax(model.forward(ds.X_val.reshape(len(ds.X_val), -1)), axis=1) == ds.y_val)
    assert f"{100 * correct:.2f}" == val_acc
    bad = subprocess.run([sys.executable, "-m", "npddp.evaluate", "nope.h5"], cwd=tmp_path, env=clean_env(),
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr == "error: checkpoint 'nope.h5' does not exist\n"
