"""The training CLI (``python -m npddp.train``) as a subprocess under mpirun, ``npddp.run`` or plain python, on tiny
data, and the environment such jobs get."""

import subprocess
import sys

from tests.helpers.jobs import mpirun, outside_env

# 384 rows, a global batch of 32: 12 steps per epoch on any world size that divides 32
TINY = ["--train-samples", "384", "--val-samples", "96", "--batch-size", "32", "--hidden", "16",
        "--epochs", "2", "--dtype", "float64"]
STEPS_PER_EPOCH = 12


def mpirun_path() -> str:
    """The mpirun beside the interpreter, else the first on PATH (:func:`tests.helpers.jobs.mpirun`)."""
    return mpirun()


def clean_env() -> dict:
    """This environment minus an enclosing MPI job's variables, one BLAS thread per rank."""
    return dict(outside_env(), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")


def train(cwd, *args, n=2, timeout=120, launcher="mpirun") -> subprocess.CompletedProcess:
    """Run the CLI on ``n`` ranks (n=None: plain python) in ``cwd``, under mpirun or ``npddp.run``."""
    command = [sys.executable, "-m", "npddp.train", *map(str, args)]
    if n is not None and launcher == "mpirun":
        command = [mpirun_path(), "-n", str(n), *command]
    elif n is not None:
        command = [sys.executable, "-m", "npddp.run", "--nproc", str(n), "-m", *command[2:]]
    return subprocess.run(command, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout)


def ok(proc) -> subprocess.CompletedProcess:
    """``proc``, once it has exited 0 (else fail with its output)."""
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def epoch_lines(stdout: str) -> list[str]:
    """The per-epoch lines of the CLI's output."""
    return [line for line in stdout.splitlines() if line.startswith("epoch ")]


def error_line(proc) -> str:
    """The one line a refused run prints on stderr (it must be one line starting "error: ")."""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


#: Runs the training CLI with writes limited to 12 kB per file from the moment MPI is initialised
#: (MPI's own shared-memory files must be created first): a checkpoint write then fails with EFBIG,
#: as on a full disk. SIGXFSZ is ignored so the write fails instead of killing the process.
LIMITED = """
import resource, runpy, signal, sys
from mpi4py import MPI
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (12000, 12000))
sys.argv[0] = "npddp.train"
runpy.run_module("npddp.train", run_name="__main__", alter_sys=True)
"""
