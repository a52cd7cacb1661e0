"""``python -m npddp.run``: the TCP launcher starts ranks, tags their output, and ends the whole job on any failure.

Jobs run as subprocesses watched from outside (``launch(..., launcher="npddp.run")``): a rank
killed mid-collective, a rank that exits with a code, Ctrl-C to the launcher, and a rank killed
while its peers wait in a shared-memory all-reduce all end every rank promptly, with no process
and no shared-memory segment left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from npddp.comm.node.names import PREFIX, SHM_DIR
from npddp.process.spawn import parse_args, rank_env
from npddp.util.env import JOIN_DIR_VARIABLE

from tests.helpers.jobs import job_env

#: watches the whole machine or times a job's end: never beside another test (run_all.sh: serial-alone)
pytestmark = pytest.mark.alone

WORKER = """
import os, sys, time
import numpy as np
from npddp.comm import create
comm = create(sys.argv[1], timeout=60)
print("ready", comm.rank, os.environ["LOCAL_RANK"], os.environ["OMP_NUM_THREADS"], flush=True)
x = np.ones(1 << 20, dtype=np.float32)
for step in range(100000):
    if step == 3 and comm.rank == 1 and sys.argv[2] == "exit":
        sys.exit(3)
    comm.allreduce(x)
    x[:] = 1
"""


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return path


def _segments(job_env_id=None) -> list[str]:
    return sorted(f for f in os.listdir(SHM_DIR) if f.startswith(PREFIX))


@pytest.mark.parametrize("backend", ["ring", "shm"])
@pytest.mark.slow
def test_a_killed_rank_ends_the_job_within_seconds_with_nothing_left_behind(launch, worker, backend):
    before = _segments()
    job = launch([worker, backend, "run"], n=3, launcher="npddp.run")
    deadline = time.monotonic() + 60
    while job.output.count("ready") < 3:
        assert time.monotonic() < deadline and job.proc.poll() is None, job.output
        time.sleep(0.05)
    time.sleep(0.3)
    victim = job.find_ranks()[1]
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    code = job.wait(timeout=30)
    assert code == 128 + signal.SIGKILL, job.output
    assert time.monotonic() - killed < 30
    assert "python -m npddp.run: rank 1 was killed by SIGKILL" in job.output
    assert not job.alive(), f"ranks still running: {job.alive()}"
    assert _segments() == before


def test_a_rank_that_exits_with_a_code_ends_the_job_with_that_code(launch, worker):
    job = launch([worker, "ring", "exit"], n=3, launcher="npddp.run")
    assert job.wait(timeout=60) == 3, job.output
    assert "rank 1 exited with code 3" in job.output and not job.alive()


LEAVER = f"""
import os, sys, time
import numpy as np
rank = int(os.environ["RANK"])
print("join directory", os.environ["{JOIN_DIR_VARIABLE}"], flush=True)
if rank == int(sys.argv[1]):
    if sys.argv[2] == "late":
        time.sleep(1.0)             # the others start joining first
    sys.exit(0)                     # leaves before joining the world
if sys.argv[2] == "never":
    time.sleep(0.5 * rank)          # a script that never communicates: ranks end at different times
    sys.exit(0)
from npddp.comm import create
comm = create("ring", timeout=120)
comm.allreduce(np.ones(4))
"""


@pytest.mark.parametrize("leaver, when", [(1, "early"), (0, "late"), (2, "early")])
def test_a_rank_that_exits_0_before_joining_ends_the_job_at_once(launch, tmp_path, leaver, when):
    """The others would wait for it until their timeout (120 s here); the launcher names it and stops them."""
    script = tmp_path / "leaver.py"
    script.write_text(LEAVER)
    started = time.monotonic()
    job = launch([script, leaver, when], n=3, launcher="npddp.run")
    code = job.wait(timeout=60)
    assert code == 1 and time.monotonic() - started < 30, job.output
    assert f"rank {leaver} exited with code 0 before joining the job" in job.output, job.output
    assert not job.alive() and _join_dirs_left(job) == []   # the launcher's join directory is gone too


def _join_dirs_left(job) -> list[str]:
    """The join directories this job's ranks were given (each prints its own) that still exist."""
    given = {line.split(" ", 2)[2] for line in job.output.splitlines() if line.startswith("join directory ")}
    assert given, job.output
    return sorted(path for path in given if os.path.exists(path))


@pytest.mark.slow
def test_ranks_that_never_communicate_may_end_at_different_times(launch, tmp_path):
    script = tmp_path / "leaver.py"
    script.write_text(LEAVER)
    job = launch([script, 0, "never"], n=3, launcher="npddp.run")
    assert job.wait(timeout=60) == 0, job.output
    assert "before joining" not in job.output and _join_dirs_left(job) == []


@pytest.mark.slow
def test_ctrl_c_reaches_every_rank(launch, worker):
    job = launch([worker, "ring", "run"], n=2, launcher="npddp.run")
    deadline = time.monotonic() + 60
    while job.output.count("ready") < 2:
        assert time.monotonic() < deadline and job.proc.poll() is None, job.output
        time.sleep(0.05)
    job.proc.send_signal(signal.SIGINT)
    assert job.wait(timeout=30) == 128 + signal.SIGINT, job.output
    assert "interrupted (SIGINT), stopping every rank" in job.output and not job.alive()
    # one line says so: the ranks, whose guard knows the launcher reports it, print no traceback
    assert "Traceback" not in job.output and "KeyboardInterrupt" not in job.output, job.output
    assert [line for line in job.output.splitlines() if "interrupted" in line] == \
        ["python -m npddp.run: interrupted (SIGINT), stopping every rank"], job.output


def test_every_rank_gets_its_place_one_thread_and_a_tag_on_its_lines(tmp_path):
    script = tmp_path / "env.py"
    script.write_text("import os\nprint(*(os.environ[k] for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', "
                      "'LOCAL_WORLD_SIZE', 'MASTER_ADDR', 'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS')))\n")
    env = {k: v for k, v in job_env().items() if not k.endswith("_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-m", "npddp.run", "--nproc", "3", "--prefix", str(script)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [f"[{r}] {r} 3 {r} 3 127.0.0.1 1 1" for r in range(3)]


@pytest.mark.parametrize("argv, text", [
    (["--nproc", "0", "x.py"], "--nproc 0 is out of range; valid: 1 or more"),
    (["--nnodes", "2", "--node-rank", "2", "--master-port", "5", "x.py"], "--node-rank 2 is out of range; valid: 0..1"),
    (["--nnodes", "2", "x.py"], "--master-port is required with --nnodes > 1"),
    (["--threads", "two", "x.py"], "--threads 'two' is out of range"),
    (["--nproc", "2"], "no program given"),
])
def test_bad_arguments_are_one_error_line_and_exit_2(argv, text):
    done = subprocess.run([sys.executable, "-m", "npddp.run", *argv], capture_output=True, text=True, timeout=30)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and last.startswith("python -m npddp.run: error: ") and text in last, done.stderr


def test_arguments_after_the_program_belong_to_the_program():
    args = parse_args(["--nproc", "4", "--threads", "2", "-m", "pytest", "-q", "--nproc", "-p", "x"])
    assert (args.nproc, args.threads, args.module, args.program) == (4, "2", "pytest", ["-q", "--nproc", "-p", "x"])
    args = parse_args(["--nnodes", "2", "--node-rank", "1", "--nproc=4", "--master-port", "29500", "train.py", "--lr",
                       "1"])
    env = rank_env(args, 2, 29500, "job", environ={})
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], args.program) == ("6", "8", "2", ["train.py", "--lr", "1"])
