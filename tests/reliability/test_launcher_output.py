"""``python -m npddp.run``'s output and leftovers: whole lines, a closed pipe ends nothing, no join directory left.

Two ranks printing lines in pieces never mix them on one line (with or without ``--prefix``);
``| head`` exiting early lets the job run to its quiet end; a launcher killed by SIGKILL
leaves its join directory only until the next launch, which never removes a live job's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers.jobs import job_env

#: watches the whole machine or times a job's end: never beside another test (run_all.sh: serial-alone)
pytestmark = pytest.mark.alone

LINES = """
import os, sys
rank = os.environ["RANK"]
for i in range(int(sys.argv[1])):
    for piece in ("OK rank ", rank, " iters ", str(i), " bad 0", "\\n"):
        sys.stdout.write(piece)      # unbuffered (-u): one write per piece
"""

SLEEPER = """
import sys, time
print("ready", flush=True)
time.sleep(float(sys.argv[1]))
"""


def _launcher(*args) -> list[str]:
    return [sys.executable, "-m", "npddp.run", "--nproc", "2", *map(str, args)]


def _join_dirs(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.startswith("npddp-join-"))


@pytest.mark.parametrize("prefix", [[], ["--prefix"]])
def test_lines_of_two_ranks_printed_in_pieces_never_mix(tmp_path, prefix):
    script = tmp_path / "lines.py"
    script.write_text(LINES)
    done = subprocess.run(_launcher(*prefix, script, 3000), capture_output=True, text=True, timeout=120,
                          env=job_env(TMPDIR=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    tag = {0: "[0] " if prefix else "", 1: "[1] " if prefix else ""}
    expected = {f"{tag[r]}OK rank {r} iters {i} bad 0" for r in (0, 1) for i in range(3000)}
    assert len(lines) == 6000 and set(lines) == expected, [line for line in lines if line not in expected][:5]


def test_a_closed_pipe_ends_the_job_quietly_without_prefix(tmp_path):
    script = tmp_path / "lines.py"
    script.write_text(LINES)
    proc = subprocess.Popen(_launcher(script, 20000), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=job_env(TMPDIR=str(tmp_path)))
    head = [proc.stdout.readline() for _ in range(3)]   # what `| head -3` reads, then it exits
    proc.stdout.close()
    try:
        err = proc.stderr.read().decode()
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert all(line.startswith(b"OK rank ") for line in head), head
    assert code == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert _join_dirs(tmp_path) == []


def test_a_sigkilled_launchers_join_directory_goes_at_the_next_launch_and_a_live_ones_stays(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    env = job_env(TMPDIR=str(tmp_path))
    live = subprocess.Popen(_launcher(script, 60), stdout=subprocess.PIPE, env=env)
    killed = subprocess.Popen(_launcher(script, 60), stdout=subprocess.PIPE, env=env)
    try:
        for proc in (live, killed):
            assert proc.stdout.readline().startswith(b"ready")
        before = _join_dirs(tmp_path)
        assert len(before) == 2, before
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        time.sleep(0.5)
        assert _join_dirs(tmp_path) == before       # its ranks died with it; nobody removed the directory
        done = subprocess.run(_launcher(script, 0), capture_output=True, timeout=120, env=env)
        assert done.returncode == 0, done.stderr
        left = _join_dirs(tmp_path)
        assert len(left) == 1 and left[0] in before, left    # the live job's: its launcher holds it
        assert live.poll() is None
    finally:
        for proc in (live, killed):
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
    assert _join_dirs(tmp_path) == []
