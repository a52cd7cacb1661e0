"""SIGKILL of one rank mid-run: the job ends without orphans, and the last checkpoint resumes to completion.

Serial tests that launch ``mpirun -n 2 python -m npddp.train`` with a checkpoint every 5 steps,
wait for the checkpoint file, SIGKILL one rank's python process (found in mpirun's process
tree by its PMI rank), and check that mpirun exits non-zero within seconds, that no rank
process of the job survives, that the checkpoint loads, and that ``--resume`` completes the run.
Rank 1 is a plain worker; rank 0 also writes the checkpoint, so killing it may interrupt a write.
"""

import os
import signal
import time

import pytest

from npddp.checkpoint import fileformat

#: watches the whole machine or times a job's end: never beside another test (run_all.sh: serial-alone)
pytestmark = pytest.mark.alone

#: Seconds from the SIGKILL to the end of mpirun that count as "ends the job".
EXIT_WITHIN = 10.0
EPOCHS, STEPS_PER_EPOCH = 2, 8192 // 96 + 1     # 86 steps per epoch, the last one partial
FLAGS = ["--train-samples", "8192", "--val-samples", "256", "--epochs", str(EPOCHS), "--batch-size", "96",
         "--checkpoint", "ck.h5", "--checkpoint-every", "5", "--quiet"]


@pytest.mark.parametrize("victim", [1, 0])
@pytest.mark.parametrize("backend", ["mpi", "ring"])
@pytest.mark.slow
def test_sigkill_of_one_rank_ends_the_job_and_the_checkpoint_resumes(launch, run_job, tmp_path, backend, victim):
    job = launch(["-m", "npddp.train", "--backend", backend, *FLAGS], n=2, cwd=tmp_path)
    ck = tmp_path / "ck.h5"
    deadline = time.monotonic() + 60
    while not ck.exists() and job.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)                                   # well into the run, between or during checkpoint writes
    pids = job.find_ranks()
    assert ck.exists() and job.proc.poll() is None and sorted(pids) == [0, 1], job.output
    killed_at = time.monotonic()
    os.kill(pids[victim], signal.SIGKILL)
    code = job.wait(60)
    leftovers = job.end()
    assert code is not None and code != 0, job.output
    assert job.exited_at - killed_at < EXIT_WITHIN, f"{job.exited_at - killed_at:.1f} s from the kill to the exit"
    assert not leftovers, f"rank processes left alive after mpirun ended: {leftovers}"

    saved = fileformat.read(ck)                       # loadable: the old file or the new one, never half
    assert 0 < saved.step < EPOCHS * STEPS_PER_EPOCH and saved.world_size == 2
    assert saved.step % 5 == 0 or saved.batches_done == 0

    resumed = run_job(["-m", "npddp.train", "--backend", backend, *FLAGS, "--resume"], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert resumed.stdout.splitlines()[-1].startswith(f"done: epoch {EPOCHS}/{EPOCHS}, step {EPOCHS * STEPS_PER_EPOCH},")
    final = fileformat.read(ck)
    assert (final.step, final.epochs_done, final.batches_done) == (EPOCHS * STEPS_PER_EPOCH, EPOCHS, 0)


@pytest.mark.parametrize("backend", ["ring", "naive", "mpi", "shm"])
@pytest.mark.slow
def test_a_hung_rank_makes_the_others_time_out_and_end_the_job(launch, tmp_path, backend):
    """SIGSTOP freezes rank 1 (a hang, not a crash): rank 0 raises TimeoutError after --timeout and aborts the job."""
    timeout = 1.0
    job = launch(["-m", "npddp.train", "--backend", backend, "--timeout", timeout, *FLAGS], n=2, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ck.h5").exists() and job.proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    pids = job.find_ranks()
    assert job.proc.poll() is None and sorted(pids) == [0, 1], job.output
    stopped_at = time.monotonic()
    os.kill(pids[1], signal.SIGSTOP)
    code = job.wait(60)
    leftovers = job.end()
    assert code is not None and code != 0, job.output
    assert timeout <= job.exited_at - stopped_at < timeout + EXIT_WITHIN, job.exited_at - stopped_at
    assert "[rank 0] unhandled exception, aborting all 2 ranks" in job.output
    assert f"TimeoutError: [rank 0] {backend} " in job.output and "rank 1" in job.output.split("TimeoutError")[-1]
    assert not leftovers
    assert fileformat.read(tmp_path / "ck.h5").step > 0
