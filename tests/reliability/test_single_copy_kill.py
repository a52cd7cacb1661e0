"""A rank SIGKILLed while a peer reads its private buffer by a single-copy transfer: the job ends promptly.

The worker all-reduces a private 8 MiB buffer in a loop on a shared-memory backend with
single-copy transfers on at that size. On rank 0 the read of a peer's memory is wrapped so that
one read announces itself and pauses before it starts; the test SIGKILLs rank 1 then, so the read
runs against a process that is gone. The launcher must end the job within seconds (it stops
rank 0, or rank 0's read fails first with ConnectionError naming the dead process), and no rank
process and no segment may remain. A read of a process that has died raises that ConnectionError
(checked on its own, without a launcher).
"""

import os
import signal
import time

import pytest

from npddp.comm.node import cma
from npddp.comm.node.names import PREFIX, SHM_DIR

#: watches the whole machine or times a job's end: never beside another test (run_all.sh: serial-alone)
pytestmark = pytest.mark.alone

EXIT_WITHIN = 10.0

WORKER = r'''
import sys, time
import numpy as np
from npddp.comm import create
from npddp.comm.node import allreduce, cma
from npddp.process.job import abort_on_exception

abort_on_exception()
comm = create(sys.argv[1])
comm.node.single_copy_bytes = 1 << 20
assert comm.node.single_copy, comm.node.single_copy_off
x = np.zeros(2 << 20, dtype=np.float32)   # 8 MiB, private
comm.allreduce(x)
if comm.rank == 0:
    real, calls = cma.read, [0]
    def announced(pid, remote, into):
        calls[0] += 1
        if calls[0] == 3:
            print("IN-READ", pid, flush=True)
            time.sleep(1.0)  # the harness kills the peer now
        real(pid, remote, into)
    allreduce.cma.read = announced
print("ready", comm.rank, flush=True)
while True:
    comm.allreduce(x)
'''


def _segments() -> set[str]:
    return {f for f in os.listdir(SHM_DIR) if f.startswith(PREFIX)}


@pytest.mark.skipif(bool(cma.why_not()), reason=f"single-copy transfers are off here: {cma.why_not()}")
@pytest.mark.parametrize("launcher, backend", [("mpirun", "shm"), ("npddp.run", "auto")])
@pytest.mark.slow
def test_a_rank_killed_during_a_single_copy_read_ends_the_job(launch, tmp_path, launcher, backend):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    before = _segments()
    job = launch([worker, backend], n=2, launcher=launcher)
    deadline = time.monotonic() + 60
    while job.first("IN-READ") is None:
        assert time.monotonic() < deadline and job.proc.poll() is None, job.output
        time.sleep(0.01)
    ranks = job.find_ranks()
    victim = ranks[1]
    assert f"IN-READ {victim}" in job.output  # rank 0 is about to read the victim's memory
    killed = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    code = job.wait(60)
    leftovers = job.end()
    assert code is not None and code != 0, job.output
    assert job.exited_at - killed < EXIT_WITHIN, f"{job.exited_at - killed:.1f} s from the kill to the exit"
    assert not leftovers, f"rank processes left alive: {leftovers}"
    assert _segments() <= before, f"segments left behind: {sorted(_segments() - before)}"


@pytest.mark.skipif(bool(cma.why_not()), reason=f"single-copy transfers are off here: {cma.why_not()}")
def test_reading_or_writing_a_dead_process_raises_connection_error():
    import numpy as np
    data = np.arange(1 << 16, dtype=np.float64)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: say it is ready, then wait to be killed
        os.close(r)
        os.write(w, b"x")
        time.sleep(60)
        os._exit(0)
    os.close(w)
    try:
        assert os.read(r, 1) == b"x"
        got = np.zeros_like(data)
        cma.read(pid, data.ctypes.data, got)  # alive: the same address in the forked child holds the same data
        assert np.array_equal(got, data)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.close(r)
    time.sleep(0.05)
    for move in (cma.read, cma.write):  # the zombie (and, after the wait, no process at all)
        with pytest.raises(ConnectionError, match=f"process {pid} on this node has died"):
            move(pid, data.ctypes.data, np.zeros(8))
    os.waitpid(pid, 0)
    with pytest.raises(ConnectionError, match=f"process {pid}"):
        cma.read(pid, data.ctypes.data, np.zeros(8))
