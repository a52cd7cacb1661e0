"""A failure on one rank ends the whole job within seconds, with a non-zero exit and no process left behind.

Serial tests that launch ``mpirun`` jobs: ``--inject-fault`` in the training CLI on 2 and 3
ranks for the mpi and ring backends, and :func:`npddp.process.job.abort_on_exception` on its own
(an exception before MPI is even imported, a Ctrl-C or a ``sys.exit(3)`` on one rank while the
others wait in a collective, and the single-process default it keeps).
"""

import pytest

from npddp.checkpoint import fileformat

#: watches the whole machine or times a job's end: never beside another test (run_all.sh: serial-alone)
pytestmark = pytest.mark.alone

#: Seconds from the failing rank's report to the end of mpirun that count as "ends the job".
EXIT_WITHIN = 10.0
TINY = ["--train-samples", "960", "--val-samples", "96", "--batch-size", "48", "--hidden", "32", "--epochs", "2"]


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("backend", ["mpi", "ring"])
@pytest.mark.slow
def test_an_injected_fault_on_rank_1_at_step_5_ends_every_rank_within_seconds(launch, tmp_path, backend, n):
    job = launch(["-m", "npddp.train", "--backend", backend, "--inject-fault", "1:5", *TINY], n=n, cwd=tmp_path)
    code = job.wait(120)
    leftovers = job.end()
    reported = job.first("[rank 1] unhandled exception, aborting all")
    assert code is not None and code != 0, job.output
    assert reported is not None, job.output
    assert "InjectedFault: --inject-fault 1:5: rank 1, step 5" in job.output
    assert job.exited_at - reported < EXIT_WITHIN, f"{job.exited_at - reported:.1f} s from the fault to the exit"
    assert len(job.ranks) == n and not leftovers, f"rank processes {sorted(job.ranks)}; left alive: {leftovers}"
    assert "done:" not in job.output


def test_the_fault_fires_exactly_at_its_step_and_rank(run_job, tmp_path):
    """One process, fault at step 3 of 40: the checkpoint written after step 2 is the last, the exit status 1."""
    proc = run_job(["-m", "npddp.train", *TINY, "--inject-fault", "0:3", "--checkpoint", "c.h5",
                    "--checkpoint-every", "2"], n=None, cwd=tmp_path)
    assert proc.returncode == 1 and "InjectedFault: --inject-fault 0:3: rank 0, step 3" in proc.stderr
    assert fileformat.read(tmp_path / "c.h5").step == 2


LAUNCH_SNIPPET = """
import os, signal, sys, time
from npddp.process.job import abort_on_exception
abort_on_exception()
from npddp.util.env import world_rank
mode, rank = sys.argv[1], world_rank()   # PMI_RANK (MPICH, Intel MPI), OMPI_COMM_WORLD_RANK (Open MPI)
if mode == "before-mpi" and rank == 1:
    raise ValueError("failed before importing MPI")
from mpi4py import MPI
from npddp.comm import create
comm = create(sys.argv[2], MPI.COMM_WORLD)
if rank == 1:
    time.sleep(0.2)
    if mode == "ctrl-c":
        signal.signal(signal.SIGINT, signal.default_int_handler)   # a background shell may have ignored it
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(60)
    if mode == "exception":
        raise ValueError("boom on rank 1")
    if mode == "exit":
        sys.exit(3)
    if mode == "exit-in-main":
        from npddp.process.job import run_main

        def main(argv):
            raise SystemExit(4)
        run_main(main)
comm.barrier()
print("passed the barrier", flush=True)
"""

LAUNCH_CASES = [("before-mpi", "mpi", "ValueError: failed before importing MPI", None),
                ("ctrl-c", "mpi", "[rank 1] interrupted, aborting all", 130),
                ("ctrl-c", "ring", "[rank 1] interrupted, aborting all", 130),
                ("exception", "ring", "[rank 1] unhandled exception, aborting all", 1),
                # sys.exit on one rank: MPI's finalize would wait for the others forever (mpi) or
                # until the timeout (ring); the job ends at once with that exit status
                ("exit", "mpi", "[rank 1] exit status 3, ending all 3 ranks", 3),
                ("exit", "ring", "[rank 1] exit status 3, ending all 3 ranks", 3),
                ("exit-in-main", "mpi", "[rank 1] exit status 4 (SystemExit), ending all 3 ranks", 4)]


@pytest.mark.parametrize("mode, backend, text, status", LAUNCH_CASES)
def test_abort_on_exception_ends_every_rank_waiting_in_a_collective(launch, tmp_path, mode, backend, text, status):
    script = tmp_path / "snippet.py"
    script.write_text(LAUNCH_SNIPPET)
    job = launch([script, mode, backend], n=3, cwd=tmp_path)
    code = job.wait(60)
    leftovers = job.end()
    assert code is not None and code != 0, job.output
    assert status is None or code == status, (code, job.output)
    assert text in job.output and "passed the barrier" not in job.output, job.output
    assert job.exited_at - job.lines[0][0] < EXIT_WITHIN
    assert not leftovers


def test_a_single_process_keeps_pythons_own_exception_and_ctrl_c_behaviour(run_job, tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(LAUNCH_SNIPPET.replace("if rank == 1:", "if rank == 0:"))
    raised = run_job([script, "exception", "ring"], n=None, cwd=tmp_path)
    assert raised.returncode == 1 and raised.stderr.rstrip().endswith("ValueError: boom on rank 1")
    assert "aborting" not in raised.stderr
    interrupted = run_job([script, "ctrl-c", "ring"], n=None, cwd=tmp_path)
    assert interrupted.returncode in (-2, 130) and "KeyboardInterrupt" in interrupted.stderr
    assert "aborting" not in interrupted.stderr
