"""``./mpi_run.sh`` stops through its own pid: a SIGTERM or SIGINT ends the job within seconds and is never
followed by a restart; a SIGKILL of it takes mpirun and the ranks along."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.jobs import descendants, job_env, rank_of

ROOT = Path(__file__).resolve().parents[2]
SLEEPER = """
import time
from mpi4py import MPI
print("ready", MPI.COMM_WORLD.Get_rank(), flush=True)
time.sleep(60)
"""


def _start(tmp_path, *options):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    proc = subprocess.Popen(["bash", str(ROOT / "mpi_run.sh"), "-n", "2", *options, "--", sys.executable, str(script)],
                            env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    seen = ""
    while seen.count("ready") < 2:                           # mpirun may mix the ranks' lines
        line = proc.stdout.readline()
        assert line, seen
        seen += line
    ranks = [pid for pid in descendants(proc.pid) if rank_of(pid) is not None]
    assert len(ranks) == 2, ranks
    return proc, ranks


def _gone_within(pids, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not [p for p in pids if os.path.exists(f"/proc/{p}") and _state(p) != "Z"]:
            return True
        time.sleep(0.05)
    return False


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_the_wrapper_stops_the_job_within_seconds_and_never_restarts(tmp_path, sig, code):
    proc, ranks = _start(tmp_path, "--max-restarts", "2")
    try:
        started = time.monotonic()
        proc.send_signal(sig)                   # its own pid only, not the group
        out, _ = proc.communicate(timeout=30)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code, out
    assert took < 15, f"{took:.1f} s"
    assert "restarting" not in out, out
    assert _gone_within(ranks, 10), ranks


def test_a_sigkill_of_the_wrapper_takes_mpirun_and_the_ranks_along(tmp_path):
    for options in ((), ("--max-restarts", "2")):
        proc, ranks = _start(tmp_path, *options)
        below = descendants(proc.pid)
        try:
            proc.kill()
            proc.wait(10)
            assert _gone_within(below, 15), [p for p in below if _state(p) not in ("gone", "Z")]
        finally:
            for pid in below:
                if _state(pid) not in ("gone", "Z"):
                    os.kill(pid, signal.SIGKILL)
