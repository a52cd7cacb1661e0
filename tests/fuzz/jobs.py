"""Start a job of programs over MPI (``./mpi_run.sh``) or TCP (``python -m npddp.run``), watch it, collect every rank's files.

Every rank of a job runs the programs of one plan in turn (:mod:`tests.fuzz.executor`). The driver
watches the rank files appear: a program whose files are not all there ``wall`` seconds after the
previous one completed is a hang (the job is stopped); a job that exits before its last program is a
crash. Either way the job starts again after that program, so one failure costs one program.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

#: The repository root (the jobs run there, so ``tests.fuzz`` imports in every rank).
ROOT = Path(__file__).resolve().parents[2]
#: Seconds a job may take to start its first program beyond ``wall`` (imports, MPI start-up, the rendezvous).
STARTUP_S = 60.0
#: The variable that marks every process of one job, so none outlives it.
TOKEN = "NPDDP_FUZZ_JOB"


def command(transport: str, nproc: int, directory: Path) -> list:
    """The command line that starts ``nproc`` ranks of the executor over ``transport``."""
    rank = [sys.executable, "-m", "tests.fuzz.executor", str(directory)]
    if transport == "mpi":
        return [str(ROOT / "mpi_run.sh"), "-n", str(nproc), *rank]
    return [sys.executable, "-m", "npddp.run", "--nproc", str(nproc), "-m", "tests.fuzz.executor", str(directory)]


def environment(timeout: float, token: str) -> dict:
    """The job's environment: one BLAS thread, the timeout, exceptions caught by the executor, the token."""
    environ = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   NPDDP_TIMEOUT=str(timeout), NPDDP_ABORT_ON_EXCEPTION="0", PYTHONUNBUFFERED="1")
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    environ[TOKEN] = token
    for name in ("NPDDP_DEBUG", "NPDDP_CHECK_ARGS", "NPDDP_RANKS_PER_NODE", "NPDDP_TUNING", "NPDDP_AUTO_SHM"):
        environ.pop(name, None)
    return environ


def _sweep(token: str) -> None:
    """End every process still carrying this job's token (SIGKILL): ranks that left the job's group."""
    needle = f"{TOKEN}={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    os.kill(int(entry), signal.SIGKILL)
        except (OSError, ProcessLookupError):
            pass


def _stop(proc: subprocess.Popen, token: str) -> None:
    """SIGTERM to the job's process group, SIGKILL 10 s later, then any process left with its token."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(grace)
            break
        except subprocess.TimeoutExpired:
            continue
    _sweep(token)


def _complete(directory: Path, number: int, nproc: int) -> bool:
    return all((directory / f"{number}.{r}.json").exists() for r in range(nproc))


def _files(directory: Path, number: int, nproc: int) -> dict:
    out = {}
    for r in range(nproc):
        path = directory / f"{number}.{r}.json"
        if path.exists():
            out[r] = json.loads(path.read_text())
    return out


def unclean(files: dict) -> bool:
    """True when a rank ended the program with anything but the mismatch error: the job starts afresh after it."""
    return any(d["error"] is not None and not d["error"]["mismatch"] for d in files.values())


def _tail(path: Path, n: int = 600) -> str:
    return path.read_bytes()[-n:].decode(errors="replace").strip().replace("\n", " | ")


def run(transport: str, nproc: int, programs: list, timeout: float, wall: float, log=None, fresh: bool = True) -> list:
    """Run ``programs`` (``[seed, backend, perturbed]`` each) in jobs of ``nproc`` ranks; per program
    ``(files, missing)``: each rank's file, and why some are missing (``hang: ...``, ``crash: ...``).

    After a program that a rank ended with another error than the mismatch (a timeout, say) the job
    ends and a fresh one runs the rest, so what such an error leaves behind reaches no other program
    (``fresh=False``: the job goes on, to find what one failure leaves behind)."""
    results: list = [None] * len(programs)
    start = 0
    with tempfile.TemporaryDirectory(prefix="npddp-fuzz-") as tmp:
        directory = Path(tmp)
        while start < len(programs):
            for path in directory.iterdir():
                path.unlink()
            (directory / "plan.json").write_text(json.dumps(
                {"programs": programs, "timeout": timeout, "wall": wall, "start": start}))
            token = uuid.uuid4().hex
            output = directory / "job.log"
            with open(output, "wb") as out:
                proc = subprocess.Popen(command(transport, nproc, directory), cwd=ROOT, env=environment(timeout, token),
                                        stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            number, since, limit = start, time.monotonic(), wall + STARTUP_S
            while number < len(programs):
                if _complete(directory, number, nproc):
                    results[number] = (_files(directory, number, nproc), "")
                    number, since, limit = number + 1, time.monotonic(), wall
                    if fresh and unclean(results[number - 1][0]):
                        break
                    (directory / f"go.{number - 1}").touch()
                    continue
                if proc.poll() is not None:
                    time.sleep(0.2)           # files written just before the exit
                    if _complete(directory, number, nproc):
                        continue
                    results[number] = (_files(directory, number, nproc),
                                       f"crash: exit {proc.returncode}: {_tail(output)}")
                    number += 1
                    break
                if time.monotonic() - since > limit:
                    _stop(proc, token)
                    results[number] = (_files(directory, number, nproc), f"hang: no end after {limit:.0f} s")
                    number += 1
                    break
                time.sleep(0.02)
            (directory / "stop").touch()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                _stop(proc, token)
            _sweep(token)
            if log is not None and proc.returncode != 0 and number >= len(programs):
                log(f"job exited {proc.returncode} after its last program: {_tail(output, 300)}")
            start = number
    return results
