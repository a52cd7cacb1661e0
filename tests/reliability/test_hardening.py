"""Issue 22's items 5-9, each reproduced: the launcher under ``| head``, a killed peer under a
progress thread, leftover npddp segments, different sizes on ``shm``, and one-line errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from npddp.comm.transports import handshake
from npddp.comm.transports.rendezvous import REGISTER, TABLE_HEAD, LaunchEnv, RendezvousError, connect, _text
from npddp.process import cleanup
from npddp.process.spawn import free_port

from tests.helpers.jobs import job_env

#: watches the whole machine or times a job's end: never beside another test (run_all.sh: serial-alone)
pytestmark = pytest.mark.alone

KEY = b"s" * 64


def test_the_launcher_under_a_closed_pipe_runs_to_the_end(tmp_path):
    """Item 5: ``npddp.run --prefix script.py | head -2`` used to hang forever."""
    script = tmp_path / "chatty.py"
    script.write_text("for i in range(20000):\n    print('line', i)\n")
    proc = subprocess.Popen([sys.executable, "-m", "npddp.run", "--nproc", "2", "--prefix", str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=job_env())
    first = [proc.stdout.readline() for _ in range(2)]
    proc.stdout.close()                       # what head does after two lines
    try:
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
    err = proc.stderr.read().decode()
    assert all(line.startswith((b"[0] line", b"[1] line")) for line in first), first
    assert code == 0 and "Traceback" not in err, err


PEER_DIES = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    from npddp.comm import create
    comm = create(sys.argv[1], timeout=30, progress="thread")
    x = np.ones(8)
    comm.allreduce(x)                     # both alive: the node group is set up
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    start = time.monotonic()
    try:
        comm.iallreduce(np.ones(1 << 12)).wait()
        print("NO ERROR", flush=True)
    except (ConnectionError, TimeoutError) as exc:
        print(f"{type(exc).__name__} after {time.monotonic() - start:.1f} s: {exc}", flush=True)
""")


@pytest.mark.parametrize("backend", ["shm", "auto"])
def test_a_killed_peer_is_named_at_once_under_a_progress_thread(tmp_path, backend):
    """Item 6: with ``progress="thread"`` the killed peer was noticed only at the timeout, unnamed."""
    script = tmp_path / "dies.py"
    script.write_text(PEER_DIES)
    port = str(free_port("127.0.0.1"))
    procs = [subprocess.Popen([sys.executable, str(script), backend], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=job_env(RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                                                     LOCAL_WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                                                     MASTER_PORT=port, NPDDP_JOB_ID=f"t22{port}"))
             for r in range(2)]
    threading.Thread(target=procs[1].communicate, daemon=True).start()   # reaped at once, as a launcher does
    try:
        out, err = procs[0].communicate(timeout=60)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    line = out.strip().splitlines()[-1] if out.strip() else err
    assert line.startswith("ConnectionError after"), line
    assert "rank 1" in line and float(line.split()[2]) < 15, line   # the timeout is 30 s


def test_clean_finds_npddp_segments(tmp_path):
    """Item 7: ``cleanup clean`` looked only for MPI's names, never for npddp-* files."""
    path = tmp_path / "npddp-deadjob-ctrl"
    path.write_bytes(b"\0" * 4096)
    os.utime(path, (time.time() - 3600, time.time() - 3600))
    assert path in cleanup.orphans(60.0, directory=tmp_path)


def test_a_failed_jobs_npddp_segment_nobody_mapped_is_removed(tmp_path):
    """Item 7: a segment created by a rank that died before anyone (or the watch) mapped it stayed."""
    if not os.path.isdir(cleanup.SHM):
        pytest.skip(f"{cleanup.SHM} does not exist here")
    watch = cleanup.Watch(["sh", "-c", f'touch "{cleanup.SHM}/npddp-$NPDDP_JOB_ID-late"; exit 3'])
    code = watch.run()
    path = cleanup.SHM / f"npddp-{watch.job}-late"
    try:
        removed = watch.clean(code)
        assert code == 3 and not path.exists() and str(path) in [p for p, _ in removed]
    finally:
        path.unlink(missing_ok=True)


SIZES = textwrap.dedent("""
    import sys
    import numpy as np
    from npddp.comm import create
    comm = create(sys.argv[1], timeout=30)
    for n in (4, 3000000):                 # the small path and the large one
        x = np.ones(n + comm.rank)       # rank 1 passes one element more
        try:
            comm.allreduce(x)
            print("RESULT", x[:2].tolist(), flush=True)
        except ValueError as exc:
            print("ValueError", exc, flush=True)
        comm = create(sys.argv[1], timeout=30)
""")


def test_shm_with_different_sizes_raises_on_every_rank(tmp_path):
    """Item 8: ``shm`` with different sizes returned different results on different ranks."""
    script = tmp_path / "sizes.py"
    script.write_text(SIZES)
    done = subprocess.run([sys.executable, "-m", "npddp.run", "--nproc", "2", "--prefix", str(script), "shm"],
                          capture_output=True, text=True, timeout=120, env=job_env())
    lines = [line for line in done.stdout.splitlines() if "ValueError" in line or "RESULT" in line]
    assert len(lines) == 4 and all("ValueError" in line and "different sizes" in line for line in lines), done.stdout
    assert done.returncode == 0, done.stderr


def test_an_unresolvable_master_addr_is_one_line_and_exit_2(tmp_path):
    """Item 9: ``--master-addr nosuchhost.invalid`` was a gaierror traceback, exit 1."""
    done = subprocess.run([sys.executable, "-m", "npddp.run", "--nproc", "2", "--master-addr", "nosuchhost.invalid",
                           "x.py"], capture_output=True, text=True, timeout=60, env=job_env())
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "--master-addr 'nosuchhost.invalid' does not resolve" in done.stderr.strip().splitlines()[-1]


def test_a_huge_error_length_from_rank_0_is_refused_before_any_allocation():
    """Item 9: a frame length was allocated before any bound check (MemoryError)."""
    port = free_port("127.0.0.1")
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(2)
    gate = handshake.Gate(server, KEY, REGISTER.size, "rank 0 (test)")

    def evil_rank_0():  # holds the secret (a buggy or hostile member), then claims a 2 GiB error message
        got = gate.accept(time.monotonic() + 20)
        if got is not None:
            got[0].sendall(TABLE_HEAD.pack(b"NPDD", 1, 0, 2 ** 31))
            time.sleep(1)
            got[0].close()

    t = threading.Thread(target=evil_rank_0, daemon=True)
    t.start()
    with pytest.raises(RendezvousError, match="malformed rank table"):
        connect(LaunchEnv(1, 2, "127.0.0.1", port, 0, 1, KEY), 20)
    t.join(10)
    gate.close()
    server.close()


def test_a_non_utf8_name_is_text_not_a_crash():
    assert _text(b"\xff\xfehost\0\0") == "\ufffd\ufffdhost"


def test_a_reset_during_registration_is_dropped_and_the_job_forms(capfd):
    """Item 9: a bare ConnectionResetError during registration ended rank 0."""
    port = free_port("127.0.0.1")
    out: list = [None, None]

    def rank(r):
        try:
            out[r] = connect(LaunchEnv(r, 2, "127.0.0.1", port, 0, 1, KEY), 30)
        except Exception as exc:  # noqa: BLE001
            out[r] = exc

    t0 = threading.Thread(target=rank, args=(0,), daemon=True)
    t0.start()
    deadline = time.monotonic() + 20
    while True:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1)
            break
        except OSError:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    s.recv(handshake.CHALLENGE.size)
    s.sendall(b"\0" * 5)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")  # close with RST
    s.close()
    t1 = threading.Thread(target=rank, args=(1,), daemon=True)
    t1.start()
    t0.join(30)
    t1.join(30)
    assert all(isinstance(o, tuple) for o in out), out
    for socks, _ in out:
        for sock in socks:
            if sock is not None:
                sock.close()
    assert "dropped a connection from 127.0.0.1" in capfd.readouterr().err


STOPS = textwrap.dedent("""
    import os, signal
    import numpy as np
    from npddp.comm import create
    comm = create("ring", timeout=2)
    comm.allreduce(np.ones(4))
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    comm.allreduce(np.ones(4))        # rank 0 times out waiting for the stopped rank 1
""")


@pytest.mark.slow
def test_a_stopped_rank_is_named_as_the_cause(tmp_path):
    """Item 9: a rank stopped by SIGSTOP was blamed on rank 0, which only timed out waiting for it."""
    script = tmp_path / "stops.py"
    script.write_text(STOPS)
    done = subprocess.run([sys.executable, "-m", "npddp.run", "--nproc", "2", "--grace", "1", str(script)],
                          capture_output=True, text=True, timeout=120, env=job_env())
    assert done.returncode != 0
    verdict = [line for line in done.stderr.splitlines() if line.startswith("python -m npddp.run: rank")]
    assert verdict and verdict[0].startswith("python -m npddp.run: rank 1 is stopped"), done.stderr
