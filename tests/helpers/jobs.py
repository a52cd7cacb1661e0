"""Jobs launched as subprocesses and watched from outside: the one mpirun lookup, the environment a job gets,
the rank processes below a launcher (found by walking ``/proc``), and a :class:`Job` that records them."""

from __future__ import annotations

import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from npddp.process import launchflags
from npddp.util import mpilibs

#: The repository root.
ROOT = Path(__file__).resolve().parents[2]

#: Variable prefixes of an enclosing MPI job (MPICH, Open MPI, Intel MPI).
MPI_JOB_PREFIXES = ("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_")


def outside_env() -> dict:
    """This environment without the variables of an enclosing MPI job."""
    return {k: v for k, v in os.environ.items() if not k.startswith(MPI_JOB_PREFIXES)}


def mpirun() -> str:
    """The mpirun beside the interpreter, else the first on PATH (Intel MPI's: the mpiexec beside it, as mpi_run.sh runs)."""
    beside = Path(sys.executable).parent / "mpirun"
    found = str(beside) if beside.exists() else shutil.which("mpirun")
    assert found, "no mpirun beside the interpreter or on PATH"
    return mpilibs.program(_library(found), found)


def job_env(**extra) -> dict:
    """This environment minus an enclosing MPI job's variables, one BLAS thread per rank, plus ``extra``."""
    skip = (*MPI_JOB_PREFIXES, "NPDDP_")
    launcher = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(skip) and k not in launcher}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(bare_launch_env(), **extra)
    return env


@functools.lru_cache(maxsize=4)
def _library(launcher: str) -> mpilibs.MPILibrary:
    """The MPI library behind a launcher (cached: it runs the launcher once)."""
    return launchflags.library_of(launcher)


def bare_launch_env() -> dict:
    """What a bare mpirun of this venv's MPI library needs to act as under mpi_run.sh (Open MPI: oversubscribe, root)."""
    beside = Path(sys.executable).parent / "mpirun"
    launcher = str(beside) if beside.exists() else shutil.which("mpirun")
    if launcher is None:
        return {}
    return mpilibs.launch_environment(_library(launcher), root=os.geteuid() == 0)


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time in clock ticks, state) of a process, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19]), fields[0]


def rank_of(pid: int) -> int | None:
    """The rank in a process's environment (PMI_RANK from MPICH's or Intel MPI's mpirun, OMPI_COMM_WORLD_RANK from
    Open MPI's, RANK from npddp.run), or None."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                if item.startswith((b"PMI_RANK=", b"OMPI_COMM_WORLD_RANK=", b"RANK=")):
                    return int(item.split(b"=", 1)[1])
    except (OSError, ValueError):
        pass
    return None


def descendants(root: int) -> list[int]:
    """Pids of every live process below ``root``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None:
                children.setdefault(st[0], []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


class Job:
    """A background ``mpirun`` job: timed output lines, and every python rank process it had."""

    def __init__(self, args, n: int, cwd, env: dict, launcher: str = "mpirun"):
        self.n = n
        if launcher == "mpirun":
            self.command = [mpirun(), "-n", str(n), sys.executable, *map(str, args)]
        else:
            self.command = [sys.executable, "-m", "npddp.run", "--nproc", str(n), *map(str, args)]
        self.proc = subprocess.Popen(self.command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[tuple[float, str]] = []
        self.ranks: dict[int, tuple[int, int]] = {}   # rank -> (pid, start time)
        self.exited_at: float | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def _watch(self) -> None:
        while self.proc.poll() is None:
            self.find_ranks()
            time.sleep(0.02)

    def find_ranks(self) -> dict[int, int]:
        """Record the rank processes below mpirun now; rank -> pid of those seen so far."""
        for pid in descendants(self.proc.pid):
            rank, st = rank_of(pid), _stat(pid)
            if rank is not None and st is not None and rank not in self.ranks:
                self.ranks[rank] = (pid, st[1])
        return {rank: pid for rank, (pid, _) in self.ranks.items()}

    def wait(self, timeout: float) -> int | None:
        """The exit status of mpirun, or None if it is still running after ``timeout`` seconds."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        self.exited_at = self.exited_at or time.monotonic()
        self._reader.join(10)
        return code

    def first(self, text: str) -> float | None:
        """Arrival time of the first output line containing ``text``."""
        return next((t for t, line in self.lines if text in line), None)

    @property
    def output(self) -> str:
        """Everything the job printed so far (stdout and stderr, interleaved)."""
        return "\n".join(line for _, line in self.lines)

    def alive(self) -> list[int]:
        """Pids of this job's rank processes that still run (zombies count as ended)."""
        out = []
        for pid, start in self.ranks.values():
            st = _stat(pid)
            if st is not None and st[1] == start and st[2] != "Z":
                out.append(pid)
        return out

    def end(self, grace: float = 5.0) -> list[int]:
        """Kill mpirun, give its rank processes ``grace`` seconds to go, then kill (by pid) and return those left."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        deadline = time.monotonic() + grace
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.02)
        leftovers = self.alive()
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        return leftovers


def run_job(args, n: int | None = 2, cwd=None, timeout: float = 120, **env) -> subprocess.CompletedProcess:
    """CompletedProcess of ``mpirun -n n python ARGS`` (n=None: plain ``python ARGS``) in :func:`job_env`."""
    command = [sys.executable, *map(str, args)]
    if n is not None:
        command = [mpirun(), "-n", str(n), *command]
    return subprocess.run(command, cwd=cwd, env=job_env(**env), capture_output=True, text=True, timeout=timeout,
                          check=False)
