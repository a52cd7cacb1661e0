"""The suite keeps its limits and leaves nothing behind: in tests/run_all.sh a run over its limit ends with every
process it started, and so does a run whose runner is killed; a process waiting in the package's Watch still obeys
its own SIGTERM; the directory the ranks of a test share is removed after the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers.ranks import agreed_directory

#: watches the whole machine or times a job's end: never beside another test (run_all.sh: serial-alone)
pytestmark = pytest.mark.alone

ROOT = Path(__file__).resolve().parents[1]
#: A run that leaves processes everywhere: one in its process group, one in a session of its own, and itself
#: ignoring SIGTERM; it writes their pids (its own first) to the file named by its argument, then waits.
STUBBORN = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    same = subprocess.Popen(["sleep", "300"])
    away = subprocess.Popen(["sleep", "300"], start_new_session=True)
    with open(sys.argv[1] + ".part", "w") as f:
        f.write(f"{os.getpid()} {same.pid} {away.pid}")
    os.rename(sys.argv[1] + ".part", sys.argv[1])
    time.sleep(300)
""")


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie waiting for its reaper counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _catches_sigterm(pid: int, within_s: float = 60.0) -> None:
    """Wait until process ``pid`` has a handler for SIGTERM installed (a signal sent earlier would kill it)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/status") as f:
            caught = int(next(line for line in f if line.startswith("SigCgt:")).split()[1], 16)
        if caught >> (signal.SIGTERM - 1) & 1:
            return
        time.sleep(0.02)
    raise AssertionError(f"process {pid} never installed its SIGTERM handler")


def _runner(tmp_path: Path, limit_s: int, after: str = "") -> tuple[subprocess.Popen, Path]:
    """A bash process that sources run_all.sh and runs STUBBORN as one run of ``limit_s`` seconds."""
    script, pids = tmp_path / "stubborn.py", tmp_path / "pids"
    script.write_text(STUBBORN)
    body = (f'source tests/run_all.sh; run stubborn {limit_s} {sys.executable} {script} {pids}; '
            f'echo "failed: ${{failed[*]}}"; {after}')
    proc = subprocess.Popen(["bash", "-c", body], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "NPDDP_PART_GRACE_S": "1"}, start_new_session=True)
    return proc, pids


def _pids(path: Path, proc: subprocess.Popen, within_s: float = 60.0) -> list[int]:
    """The pids STUBBORN wrote, once it has written them."""
    deadline = time.monotonic() + within_s
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the run never started"
        time.sleep(0.05)
    return [int(p) for p in path.read_text().split()]


def _finish(proc: subprocess.Popen, pids: list[int]) -> str:
    """The runner's output; whatever is left of it and of ``pids`` is killed so no test leaves a process."""
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in [p for p in pids if _alive(p)]:
            os.kill(pid, signal.SIGKILL)
    return out


@pytest.mark.slow
def test_a_run_over_its_limit_is_stopped_with_every_process_it_started(tmp_path):
    started = time.monotonic()
    proc, path = _runner(tmp_path, limit_s=3)
    pids = _pids(path, proc)
    left = []
    try:
        proc.wait(timeout=60)
        left = [p for p in pids if _alive(p)]
    finally:
        out = _finish(proc, pids)
    assert proc.returncode == 0 and "stubborn: stopped at its limit of 3 s" in out, out
    assert "failed: stubborn" in out, out
    assert not left, f"still running after the run's end: {left}\n{out}"
    assert time.monotonic() - started < 45, out


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_killing_the_runner_ends_the_run_it_is_in(tmp_path, sig):
    proc, path = _runner(tmp_path, limit_s=300, after="echo went-on")
    pids = _pids(path, proc)
    left = []
    try:
        proc.send_signal(sig)
        proc.wait(timeout=60)
        left = [p for p in pids if _alive(p)]
    finally:
        out = _finish(proc, pids)
    assert proc.returncode == 128 + sig, out
    assert f"interrupted by {signal.Signals(sig).name}: stopping stubborn" in out and "went-on" not in out, out
    assert not left, f"still running after the runner's end: {left}\n{out}"



def test_a_run_that_selects_no_test_or_names_an_unknown_marker_fails():
    """A renamed test or marker must not drop coverage silently: no test selected (pytest's exit 5, passed on by
    mpirun and npddp.run) or a marker setup.cfg does not list (exit 4) fails the run."""
    none = '-m "slow and not slow" tests/test_optim.py'
    body = (f'source tests/run_all.sh; run plain 120 python -m pytest -q {none}; '
            f'run mpi 120 ./mpi_run.sh -n 2 python -m pytest -q --with-mpi {none}; '
            f'run tcp 120 python -m npddp.run --nproc 2 -m pytest -q -p no:pytest_mpi {none}; '
            f'run renamed 120 python -m pytest -q -m no_such_marker tests/test_optim.py; '
            f'run some 120 python -m pytest -q -k test_adamw_hand_computed_first_steps tests/test_optim.py; echo "failed: ${{failed[*]}}"')
    out = subprocess.run(["bash", "-c", body], cwd=ROOT, capture_output=True, text=True, timeout=300).stdout
    assert "failed: plain mpi tcp renamed\n" in out, out
    assert out.count("selected no test") == 3 and "=== renamed: exit 4" in out, out

def test_a_sigterm_ends_a_process_that_waits_in_watch(tmp_path):
    """Watch forwards the signal to its command and then delivers it to its own process, which must end."""
    marker = tmp_path / "child"
    code = textwrap.dedent(f"""
        import sys
        from npddp.process.cleanup import Watch
        watch = Watch(["sh", "-c", "echo $$ > {marker}; exec sleep 300"])
        print("returned", watch.run(), flush=True)
        print("went on after the SIGTERM", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (marker.exists() and marker.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    child = int(marker.read_text())
    try:
        _catches_sigterm(proc.pid)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if _alive(child):
            os.kill(child, signal.SIGKILL)
    assert proc.returncode == -signal.SIGTERM and "went on" not in out, out


def test_the_cleanup_command_still_exits_128_plus_n_after_cleaning(tmp_path):
    marker = tmp_path / "child"
    proc = subprocess.Popen([sys.executable, "-m", "npddp.process.cleanup", "run", "--", "sh", "-c",
                             f"echo $$ > {marker}; exec sleep 300"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (marker.exists() and marker.read_text().strip()):
        assert proc.poll() is None and time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    try:
        _catches_sigterm(proc.pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr.read()


def test_the_directory_every_rank_shares_is_removed_after_the_test():
    with agreed_directory() as path:
        (path / "written").write_text("by the test")
        assert path.is_dir() and path.name.startswith("npddp-test-")
    assert not path.exists()
