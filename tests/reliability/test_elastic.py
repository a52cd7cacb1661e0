"""Elastic restarts: a SIGKILLed rank restarts the whole job, which resumes from its checkpoint.

``python -m npddp.run --max-restarts 2`` (and ``mpi_run.sh --max-restarts 2``) with
``npddp.train --resume auto``: one rank is SIGKILLed after the first checkpoint; the job exits 0
and its final parameters are bit-identical to those of a run that was never interrupted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from npddp.checkpoint import fileformat

from tests.helpers.jobs import job_env

#: watches the whole machine or times a job's end: never beside another test (run_all.sh: serial-alone)
pytestmark = pytest.mark.alone

ROOT = Path(__file__).resolve().parents[2]
FLAGS = ["-m", "npddp.train", "--backend", "ring", "--train-samples", "2048", "--val-samples", "128",
         "--epochs", "2", "--batch-size", "64", "--checkpoint", "ck.h5", "--checkpoint-every", "4", "--quiet"]


def _params(path) -> dict:
    saved = fileformat.read(path)
    return {name: np.asarray(value) for name, value in saved.params.items()}, saved.step


def _reference(tmp_path, launcher: list) -> tuple:
    ref = tmp_path / "ref"
    ref.mkdir()
    done = subprocess.run([*launcher, *FLAGS], cwd=ref, env=job_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return _params(ref / "ck.h5")


def _kill_one_rank_after_the_first_checkpoint(launch, tmp_path, launcher_name: str, args: list, victim: int = 1):
    job = launch(args, n=2, cwd=tmp_path, launcher=launcher_name)
    ck = tmp_path / "ck.h5"
    deadline = time.monotonic() + 120
    while not ck.exists() and job.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    pids = job.find_ranks()
    assert ck.exists() and job.proc.poll() is None and victim in pids, job.output
    os.kill(pids[victim], signal.SIGKILL)
    code = job.wait(300)
    leftovers = job.end()
    return code, job.output, leftovers


@pytest.mark.slow
def test_npddp_run_max_restarts_resumes_bit_identical_after_a_sigkill(launch, tmp_path, victim=0):
    """Rank 0 is the victim (it also writes the checkpoint); mpi_run.sh's test kills rank 1."""
    expected, steps = _reference(tmp_path, [sys.executable, "-m", "npddp.run", "--nproc", "2"])
    code, output, leftovers = _kill_one_rank_after_the_first_checkpoint(
        launch, tmp_path, "npddp.run", ["--max-restarts", "2", *FLAGS, "--resume", "auto"], victim)
    assert code == 0, output
    assert "restarting every rank (1 of 2, NPDDP_RESTART_COUNT=1)" in output, output
    assert not leftovers
    got, got_steps = _params(tmp_path / "ck.h5")
    assert got_steps == steps and got.keys() == expected.keys()
    for name in expected:
        assert np.array_equal(got[name], expected[name]), name


def test_a_failure_after_the_last_restart_is_final(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nos.write(1, f\"start {os.environ['NPDDP_RESTART_COUNT']}\\n\".encode())\n"
                      "sys.exit(5)\n")
    done = subprocess.run([sys.executable, "-m", "npddp.run", "--nproc", "2", "--max-restarts", "1", str(script)],
                          env=job_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 5
    assert sorted(done.stdout.split()) == sorted("start 0 start 0 start 1 start 1".split()), done.stdout
    assert done.stderr.strip().splitlines()[-1] == "python -m npddp.run: the job failed after 1 restart; giving up"


def test_bad_flags_are_not_restarted(tmp_path):
    done = subprocess.run([sys.executable, "-m", "npddp.run", "--nproc", "2", "--max-restarts", "3", "-m",
                           "npddp.train", "--epochs", "-1"], env=job_env(), capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert done.returncode == 2 and "restarting" not in done.stderr, done.stderr


@pytest.mark.slow
def test_resume_auto_starts_fresh_without_a_checkpoint_and_resumes_with_one(tmp_path):
    def run(epochs: int):
        args = [sys.executable, "-m", "npddp.run", "--nproc", "2", "-m", "npddp.train", "--backend", "ring",
                "--train-samples", "512", "--val-samples", "64", "--batch-size", "64", "--epochs", str(epochs),
                "--checkpoint", "ck.h5", "--resume", "auto", "--quiet"]
        done = subprocess.run(args, cwd=tmp_path, env=job_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        return fileformat.read(tmp_path / "ck.h5")

    one = run(1)                      # no checkpoint yet: a fresh start
    two = run(2)                      # the checkpoint exists: one more epoch on top of it
    assert (one.epochs_done, two.epochs_done, two.step) == (1, 2, 2 * one.step)


def _mpi_run() -> list:
    return ["bash", str(ROOT / "mpi_run.sh"), "-n", "2", "--", sys.executable]


@pytest.mark.slow
def test_mpi_run_max_restarts_resumes_bit_identical_after_a_sigkill(tmp_path):
    expected, steps = _reference(tmp_path, _mpi_run())
    cmd = ["bash", str(ROOT / "mpi_run.sh"), "-n", "2", "--max-restarts", "2", "--", sys.executable, *FLAGS,
           "--resume", "auto"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        ck = tmp_path / "ck.h5"
        deadline = time.monotonic() + 120
        while not ck.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        victim = _find_rank(proc.pid, 1)
        assert victim is not None and proc.poll() is None
        os.kill(victim, signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out
    assert "restarting every rank (1 of 2" in out, out
    got, got_steps = _params(tmp_path / "ck.h5")
    assert got_steps == steps
    for name in expected:
        assert np.array_equal(got[name], expected[name]), name


def _find_rank(root: int, rank: int) -> int | None:
    """The pid of the python process with ``rank`` among the descendants of ``root``."""
    from tests.helpers.jobs import descendants, rank_of
    for pid in descendants(root):
        if rank_of(pid) == rank:
            return pid
    return None
