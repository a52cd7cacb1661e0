"""A user's own script, protected by its first ``create``: a failure or a Ctrl-C on one rank ends the job at once.

Plain ``mpirun`` (no mpi_run.sh, no ``abort_on_exception`` call) and ``python -m npddp.run``:
an exception on rank 1 ends the job promptly with one line naming rank 1 and a non-zero exit;
over TCP the healthy peer says so in one line, not a traceback; a Ctrl-C of the whole job
prints one ``interrupted`` line and exits 130; the MPI segments of the failed job are gone.
"""

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from npddp.comm.engine.deadline import GRACE_S
from npddp.process.cleanup import Watch
from tests.helpers.jobs import job_env, mpirun

#: watches the whole machine or times a job's end: never beside another test (run_all.sh: serial-alone)
pytestmark = pytest.mark.alone

#: Seconds from the start of a job whose rank 1 fails at once to its end that count as "promptly"
#: (the job itself takes about 1 s on an idle machine; the bound leaves room for a loaded one).
ENDS_WITHIN = 30.0

SCRIPT = """
import sys, time
import numpy as np
from npddp.comm import create
comm = create(sys.argv[1])
sys.stdout.write(f"rank {comm.rank} ready\\n")   # one write: ranks share the pipe
sys.stdout.flush()
if sys.argv[2] == "raise" and comm.rank == 1:
    raise ValueError("boom on rank 1")
x = np.ones(1000)
while True:
    comm.allreduce(x)
    x[:] = 1
    if sys.argv[2] == "raise":
        break
    time.sleep(0.01)
print("passed", flush=True)
"""


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "user_script.py"
    path.write_text(SCRIPT)
    return path


def _command(launcher: str, script, backend: str, mode: str, n: int = 2) -> list[str]:
    if launcher == "mpirun":
        return [mpirun(), "-n", str(n), sys.executable, str(script), backend, mode]
    return [sys.executable, "-m", "npddp.run", "--nproc", str(n), str(script), backend, mode]


@pytest.mark.parametrize("launcher, backend", [("mpirun", "ring"), ("mpirun", "mpi"), ("npddp.run", "ring")])
def test_an_exception_on_rank_1_of_a_plain_script_ends_the_job_with_one_line_naming_it(script, launcher, backend):
    with tempfile.TemporaryFile("w+") as sink:
        watch = Watch(_command(launcher, script, backend, "raise"), env=job_env(), stdout=sink, stderr=sink,
                      text=True)                              # notes the /dev/shm files the job maps
        started = time.monotonic()
        code = watch.run()
        sink.seek(0)
        out = sink.read()
    took = time.monotonic() - started
    assert code == 1, out
    assert took < ENDS_WITHIN, f"{took:.1f} s"
    assert "passed" not in out and "ValueError: boom on rank 1" in out
    assert [line for line in out.splitlines() if line.startswith("[rank")] == \
        [f"[rank 1] unhandled exception, {'aborting' if launcher == 'mpirun' else 'ending'} all 2 ranks:"] + \
        ([] if launcher == "mpirun" else [line for line in out.splitlines() if line.startswith("[rank 0] ending: ")])
    assert out.count("Traceback") == 1, out                      # rank 1's; the healthy peer prints no traceback
    if launcher == "npddp.run":
        assert any("the connection to rank 1 broke" in line for line in out.splitlines()
                   if line.startswith("[rank 0] ending: ")) or "[rank 0]" not in out, out
    assert not [s for s in watch.seen if os.path.exists(s)], "the failed job left its MPI segments"


@pytest.mark.parametrize("launcher, backend", [("mpirun", "ring"), ("mpirun", "mpi"), ("npddp.run", "ring")])
def test_ctrl_c_of_the_whole_job_prints_one_interrupted_line_and_exits_130(script, launcher, backend):
    proc = subprocess.Popen(_command(launcher, script, backend, "run"), env=job_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while "".join(lines).count("ready") < 2:     # ranks share the pipe: their lines may interleave
            assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
            time.sleep(0.05)
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)       # what Ctrl-C in a terminal does: the whole foreground group
        code = proc.wait(60)
        reader.join(10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = "".join(lines)
    assert code == 130, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    assert len([line for line in out.splitlines() if "interrupted" in line]) == 1, out


EXIT_SCRIPT = """
import sys, time
import numpy as np
from npddp.comm import create
comm = create(sys.argv[1])
if comm.rank == 1:
    time.sleep(0.3)
    sys.exit(int(sys.argv[2]))
x = np.ones(1000)
while True:
    comm.allreduce(x)
"""


@pytest.mark.parametrize("launcher, backend", [("mpirun", "ring"), ("mpirun", "mpi"), ("npddp.run", "ring")])
def test_sys_exit_with_a_code_on_rank_1_of_a_plain_script_ends_the_job_with_that_code(tmp_path, launcher, backend):
    script = tmp_path / "exit_script.py"
    script.write_text(EXIT_SCRIPT)
    started = time.monotonic()
    done = subprocess.run(_command(launcher, script, backend, "3"), env=job_env(NPDDP_TIMEOUT="60"),
                          capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 3, done.stdout + done.stderr
    assert took < ENDS_WITHIN, f"{took:.1f} s (the others waited for their timeout)"


@pytest.mark.parametrize("launcher, backend, n", [("mpirun", "mpi", 2), ("mpirun", "mpi", 3), ("mpirun", "ring", 2),
                                                  ("mpirun", "ring", 3), ("npddp.run", "ring", 2)])
def test_a_rank_that_leaves_with_status_0_ends_the_ranks_still_waiting_for_it_with_one_line_naming_it(
        tmp_path, launcher, backend, n):
    script = tmp_path / "exit_script.py"
    script.write_text(EXIT_SCRIPT)
    started = time.monotonic()
    done = subprocess.run(_command(launcher, script, backend, "0", n), env=job_env(NPDDP_TIMEOUT="60"),
                          capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert took < ENDS_WITHIN, f"{took:.1f} s (the others waited for their timeout)"
    lines = [line for line in out.splitlines() if line.startswith("[rank")]
    waiting = [f"[rank {r}] ending: " for r in range(n) if r != 1]
    assert lines and all(any(line.startswith(w) and "rank 1" in line[len(w):] for w in waiting) for line in lines), out
    assert len(lines) == len({line.split("]")[0] for line in lines}), out      # one line per waiting rank at most
    assert "Traceback" not in out, out


#: Test ids of the backends ("mpi" alone would read as pytest-mpi's mark and skip the test without --with-mpi).
BACKEND_IDS = ["mpi-backend", "ring-backend"]

SPLIT_SCRIPT = """
import sys, time
import numpy as np
from npddp.comm import create
comm = create(sys.argv[1])
comm.allreduce(np.ones(10))
pair = comm.split(None if comm.rank == 1 else 0)
if comm.rank == 1:
    sys.exit(0)
x = np.ones(1000)
for step in range(4):
    if pair.rank == 1 and step == 2:
        time.sleep(float(sys.argv[2]))       # rank 0 waits longer than the grace, in a group without rank 1
    pair.allreduce(x)
    assert x[0] == 2, x[0]
    x[:] = 1
print(f"rank {comm.rank} passed", flush=True)
"""


@pytest.mark.parametrize("backend", ["mpi", "ring"], ids=BACKEND_IDS)
def test_ranks_still_working_in_a_group_without_the_rank_that_left_finish(tmp_path, backend):
    script = tmp_path / "split_script.py"
    script.write_text(SPLIT_SCRIPT)
    done = subprocess.run(_command("mpirun", script, backend, str(GRACE_S + 1.0), 3),
                          env=job_env(NPDDP_TIMEOUT="60"), capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "rank 0 passed" in out and "rank 2 passed" in out and "[rank" not in out, out


LAST_MESSAGES_SCRIPT = """
import sys, time
import numpy as np
from npddp.comm import create
comm = create(sys.argv[1])
if comm.rank == 2:
    time.sleep(float(sys.argv[2]))           # rank 0's gather still waits for rank 2 after rank 1 has left
rows = comm.gather(np.full(3, comm.rank, dtype=np.float64), root=0)
if comm.rank == 1:
    sys.exit(0)                              # its part of the gather is done: rank 0 needs it no more
big = np.full(4 << 20, comm.rank, dtype=np.float64)  # 32 MiB: still in flight as rank 2 leaves
if comm.rank == 2:
    comm.isend(big, 0, tag=5).wait()
    sys.exit(0)
assert rows[:, 0].tolist() == [0, 1, 2], rows
comm.irecv(big, 2, tag=5).wait()
assert (big == 2).all()
print("rank 0 passed", flush=True)
"""


@pytest.mark.parametrize("backend", ["mpi", "ring"], ids=BACKEND_IDS)
def test_a_job_whose_ranks_leave_one_by_one_after_their_last_messages_finishes(tmp_path, backend):
    script = tmp_path / "last_messages_script.py"
    script.write_text(LAST_MESSAGES_SCRIPT)
    done = subprocess.run(_command("mpirun", script, backend, "0.5", 3),
                          env=job_env(NPDDP_TIMEOUT="60"), capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "rank 0 passed" in out and "[rank" not in out, out


QUIET_SCRIPT = """
import sys
import numpy as np
from npddp.comm import create
comm = create(sys.argv[1])
for _ in range(20):
    comm.allreduce(np.ones(1000))
sys.exit(0)
"""


@pytest.mark.parametrize("backend", ["mpi", "ring"], ids=BACKEND_IDS)
def test_a_job_whose_ranks_all_exit_with_status_0_ends_quietly(tmp_path, backend):
    script = tmp_path / "quiet_script.py"
    script.write_text(QUIET_SCRIPT)
    done = subprocess.run(_command("mpirun", script, backend, "unused", 3), env=job_env(NPDDP_TIMEOUT="60"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout + done.stderr == "", done.stdout + done.stderr
