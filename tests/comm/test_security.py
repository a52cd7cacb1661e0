"""The TCP world admits only this job's ranks: intruders, garbage and silent connections are dropped.

All probes on 127.0.0.1. In-process tests run each rank's rendezvous in a thread; the
end-to-end tests start ``python -m npddp.run`` beside an intruder or a second job on the same port.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from npddp.comm.transports import handshake
from npddp.comm.transports.rendezvous import LaunchEnv, RendezvousError, connect
from npddp.comm.transports.tcp import TCPWorld
from npddp.process.spawn import free_port
from tests.helpers.jobs import job_env

KEY = b"k" * 64


def rendezvous(size: int, port: int, key: bytes = KEY, timeout: float = 60.0) -> list:
    """Threads running every rank's rendezvous; call ``.join()`` on the returned list, results in ``.out``."""
    out: list = [None] * size
    threads = []
    for rank in range(size):
        def run(rank=rank):
            try:
                out[rank] = connect(LaunchEnv(rank, size, "127.0.0.1", port, 0, 1, key), timeout)
            except Exception as exc:  # noqa: BLE001  (reported by the test)
                out[rank] = exc
        threads.append(threading.Thread(target=run, daemon=True))
    for t in threads:
        t.start()
    return threads, out


def check_mesh(out: list) -> None:
    """Every rank formed a world, and a message from each rank to each other arrives intact."""
    assert not any(isinstance(o, Exception) for o in out), out
    worlds = [TCPWorld(r, len(out), socks, hosts) for r, (socks, hosts) in enumerate(out)]
    transports = [w.transport() for w in worlds]
    reqs, got = [], {}
    for me, t in enumerate(transports):
        for peer in range(len(worlds)):
            if peer != me:
                buf = got[(me, peer)] = np.zeros(4)
                reqs.append(t.irecv(buf, peer, 3))
                reqs.append(t.isend(np.full(4, 10.0 * me + peer), peer, 3))
    deadline = time.monotonic() + 30
    while not all(r.test() for r in reqs):
        assert time.monotonic() < deadline, "mesh messages never arrived"
    for (me, peer), buf in got.items():
        assert buf.tolist() == [10.0 * peer + me] * 4
    for w in worlds:
        w.close()


def wait_listening(port: int, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()  # itself dropped by the gate
            return
        except OSError:
            time.sleep(0.02)
    raise AssertionError(f"nobody listens on {port}")


@pytest.mark.parametrize("intruder_key", [b"", b"wrong" * 10, KEY[:-1]])
def test_an_intruder_claiming_a_rank_is_refused_and_named_in_one_line(intruder_key, capfd):
    port = free_port("127.0.0.1")
    # rank 0 first, then the intruder claims rank 1, then the real rank 1
    size = 2
    results: list = [None] * size

    def rank(r, key):
        try:
            results[r] = connect(LaunchEnv(r, size, "127.0.0.1", port, 0, 1, key), 60)
        except Exception as exc:  # noqa: BLE001
            results[r] = exc

    t0 = threading.Thread(target=rank, args=(0, KEY), daemon=True)
    t0.start()
    wait_listening(port)
    with pytest.raises(RendezvousError, match=r"refused this rank: is NPDDP_JOB_SECRET the same"):
        connect(LaunchEnv(1, size, "127.0.0.1", port, 0, 1, intruder_key), 10)
    t1 = threading.Thread(target=rank, args=(1, KEY), daemon=True)
    t1.start()
    t0.join(60)
    t1.join(60)
    check_mesh(results)
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "failed the job-secret check" in line]
    assert len(lines) == 1 and "dropped a connection from 127.0.0.1:" in lines[0], err


@pytest.mark.parametrize("probe", ["silent", "garbage", "huge", "closes", "half"])
def test_silent_garbage_and_half_connections_never_stall_or_end_the_rendezvous(probe, capfd):
    port = free_port("127.0.0.1")
    size = 3
    results: list = [None] * size

    def rank(r):
        try:
            results[r] = connect(LaunchEnv(r, size, "127.0.0.1", port, 0, 1, KEY), 60)
        except Exception as exc:  # noqa: BLE001
            results[r] = exc

    threads = [threading.Thread(target=rank, args=(0,), daemon=True)]
    threads[0].start()
    wait_listening(port)
    probes = []
    for _ in range(3):   # several at once: they must not add up
        s = socket.create_connection(("127.0.0.1", port))
        if probe == "garbage":
            s.sendall(os.urandom(4096))
        elif probe == "huge":
            s.sendall(b"\xff" * 64 * 1024)
        elif probe == "closes":
            s.close()
        elif probe == "half":
            s.sendall(b"\x00" * 10)
        probes.append(s)
    start = time.monotonic()
    threads += [threading.Thread(target=rank, args=(r,), daemon=True) for r in (1, 2)]
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(60)
    elapsed = time.monotonic() - start
    check_mesh(results)
    for s in probes:
        s.close()
    # the probes never delay the ranks past one handshake deadline (before: the whole 60 s timeout)
    assert elapsed < handshake.HANDSHAKE_S + 10, elapsed
    err = capfd.readouterr().err
    assert "Traceback" not in err and "MemoryError" not in err, err


def test_a_silent_connection_to_a_ranks_listener_is_dropped_and_the_mesh_forms():
    import npddp.comm.transports.rendezvous as rdv

    port = free_port("127.0.0.1")
    listeners = []
    original = rdv._listener

    def spy(host):   # note every rank's listener so a probe can knock on it
        sock = original(host)
        listeners.append(sock)
        return sock

    rdv._listener = spy
    try:
        threads, out = rendezvous(3, port)
        stop = time.monotonic() + 5
        silent = []
        while time.monotonic() < stop and not any(isinstance(o, tuple) for o in out):
            for sock in list(listeners):
                try:
                    addr = sock.getsockname()
                    if addr[1] and addr[1] != port:
                        silent.append(socket.create_connection(addr[:2], timeout=1))
                except OSError:
                    pass
            time.sleep(0.05)
        for t in threads:
            t.join(60)
    finally:
        rdv._listener = original
    check_mesh(out)
    for s in silent:
        s.close()


def test_a_wrong_rank_0_is_not_believed():
    """A process that listens on the master port without the secret cannot feed a rank its table."""
    port = free_port("127.0.0.1")
    fake = socket.socket()
    fake.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    fake.bind(("127.0.0.1", port))
    fake.listen(4)
    gate = handshake.Gate(fake, b"not the job's key", handshake_message_size(), "fake rank 0", log=open(os.devnull, "w"))
    threading.Thread(target=lambda: gate.accept(time.monotonic() + 10), daemon=True).start()
    with pytest.raises(RendezvousError, match="rank 0 at 127.0.0.1"):
        connect(LaunchEnv(1, 2, "127.0.0.1", port, 0, 1, KEY), 10)
    fake.close()


def handshake_message_size() -> int:
    from npddp.comm.transports.rendezvous import REGISTER
    return REGISTER.size


def test_without_a_secret_the_world_forms_on_loopback_only():
    with pytest.raises(RendezvousError, match="no job secret"):
        connect(LaunchEnv(1, 2, "10.255.255.1", 29400, 0, 1, b""), 1)
    threads, out = rendezvous(2, free_port("127.0.0.1"), key=b"")
    for t in threads:
        t.join(60)
    check_mesh(out)


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "*"])
def test_without_a_secret_listening_beyond_loopback_is_refused_before_any_socket(monkeypatch, address):
    monkeypatch.setenv("NPDDP_LISTEN_ADDR", address)
    port = free_port("127.0.0.1")
    for rank in (0, 1):       # every rank refuses, before it listens or connects
        with pytest.raises(RendezvousError, match="NPDDP_LISTEN_ADDR") as exc:
            connect(LaunchEnv(rank, 2, "127.0.0.1", port, 0, 1, b""), 1)
        assert "\n" not in str(exc.value) and "loopback" in str(exc.value)
    with socket.socket() as probe:   # rank 0 never bound the port
        probe.bind(("127.0.0.1", port))


def test_without_a_secret_a_loopback_listen_address_still_forms_the_world(monkeypatch):
    monkeypatch.setenv("NPDDP_LISTEN_ADDR", "127.0.0.1")
    threads, out = rendezvous(2, free_port("127.0.0.1"), key=b"")
    for t in threads:
        t.join(60)
    check_mesh(out)


def test_the_launcher_refuses_a_listen_address_beyond_loopback_without_a_secret(capsys, monkeypatch):
    from npddp.process.spawn import parse_args
    monkeypatch.delenv(handshake.SECRET_VARIABLE, raising=False)
    monkeypatch.setenv("NPDDP_LISTEN_ADDR", "0.0.0.0")
    argv = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", "29500", "x.py"]
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert exc.value.code == 2 and len(errors) == 1 and "NPDDP_LISTEN_ADDR='0.0.0.0'" in errors[0], errors
    monkeypatch.setenv(handshake.SECRET_VARIABLE, "shared-secret-of-the-job")
    assert parse_args(argv).secret == "shared-secret-of-the-job"     # with a secret it may listen anywhere


# ----------------------------------------------------------------------------- end to end, under the launcher

SCRIPT = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from npddp.comm import create
    if len(sys.argv) > 2 and os.environ["RANK"] == "1":
        time.sleep(float(sys.argv[2]))   # rank 0 listens until rank 1 has registered: keep it open that long
    comm = create("ring", timeout=60)
    value = float(sys.argv[1])
    x = np.full(1000, value * (comm.rank + 1))
    comm.allreduce(x)
    expected = value * comm.size * (comm.size + 1) / 2
    print(f"RESULT rank={comm.rank} ok={bool((x == expected).all())} value={x[0]}", flush=True)
""")

INTRUDER = textwrap.dedent("""
    import numpy as np
    import npddp.comm.transports.rendezvous as rendezvous
    from npddp.comm import create
    rendezvous._RETRY_S = 0.002   # knock fast: rank 0 listens only until the real ranks registered
    comm = create("ring", timeout=30)
    x = np.full(1000, 1e6)
    comm.allreduce(x)
    print("INTRUDER JOINED", flush=True)
""")


def test_an_intruder_started_first_never_joins_a_launched_job(tmp_path):
    (tmp_path / "job.py").write_text(SCRIPT)
    (tmp_path / "intruder.py").write_text(INTRUDER)
    port = free_port("127.0.0.1")
    intruder = subprocess.Popen([sys.executable, str(tmp_path / "intruder.py")], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                env=job_env(RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
    time.sleep(0.3)   # it is already knocking when the job starts, and rank 0 listens for a second at least
    job = subprocess.run([sys.executable, "-m", "npddp.run", "--nproc", "2", "--master-port", str(port),
                          str(tmp_path / "job.py"), "3", "1.0"], capture_output=True, text=True, timeout=120,
                         env=job_env())
    try:
        i_out, i_err = intruder.communicate(timeout=60)
    finally:
        intruder.kill()
    assert job.returncode == 0, job.stderr
    assert job.stdout.count("ok=True") == 2 and "ok=False" not in job.stdout, job.stdout
    assert "INTRUDER JOINED" not in i_out and intruder.returncode != 0, (i_out, i_err)
    assert "refused this rank" in i_err.strip().splitlines()[-1], i_err
    dropped = [line for line in job.stderr.splitlines() if "failed the job-secret check" in line]
    assert len(dropped) == 1 and "dropped a connection from 127.0.0.1" in dropped[0], job.stderr


@pytest.mark.slow
def test_two_jobs_on_the_same_port_never_mix(tmp_path):
    (tmp_path / "job.py").write_text(SCRIPT)
    for trial in range(3):
        port = free_port("127.0.0.1")
        jobs = [subprocess.Popen([sys.executable, "-m", "npddp.run", "--nproc", "2", "--master-port", str(port),
                                  str(tmp_path / "job.py"), str(value)], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=job_env(NPDDP_TIMEOUT="30"))
                for value in (1, 1000)]
        done = [(j.communicate(timeout=120), j.returncode) for j in jobs]
        for (out, err), code in done:
            if code == 0:   # a job that says it finished computed its own numbers only
                assert out.count("ok=True") == 2 and "ok=False" not in out, (out, err)
            else:
                assert "ok=False" not in out, (out, err)
        assert any(code == 0 for _, code in done), done


# ----------------------------------------------------------------------------- the launcher's secret

def test_the_launcher_gives_every_job_a_fresh_secret_and_its_ranks_the_same_one():
    from npddp.process.spawn import parse_args, rank_env
    a, b = parse_args(["--nproc", "2", "x.py"]), parse_args(["--nproc", "2", "x.py"])
    assert len(a.secret) == 64 and a.secret != b.secret
    envs = [rank_env(a, r, 29500, "job", environ={}) for r in range(2)]
    assert envs[0][handshake.SECRET_VARIABLE] == envs[1][handshake.SECRET_VARIABLE] == a.secret


def test_a_secret_file_must_be_private(tmp_path, capsys):
    from npddp.process.spawn import parse_args
    path = tmp_path / "secret"
    path.write_text("0123456789abcdef0123456789abcdef\n")
    path.chmod(0o644)
    with pytest.raises(SystemExit) as exc:
        parse_args(["--secret-file", str(path), "x.py"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2 and "readable or writable by others (mode 644)" in err and "chmod 600" in err, err
    path.chmod(0o600)
    assert parse_args(["--secret-file", str(path), "x.py"]).secret == "0123456789abcdef0123456789abcdef"


def test_several_machines_without_a_shared_secret_are_refused(capsys, monkeypatch):
    from npddp.process.spawn import parse_args
    monkeypatch.delenv(handshake.SECRET_VARIABLE, raising=False)
    with pytest.raises(SystemExit):
        parse_args(["--nnodes", "2", "--master-addr", "10.255.255.1", "--master-port", "29500", "x.py"])
    assert "needs a secret shared by every machine" in capsys.readouterr().err
    monkeypatch.setenv(handshake.SECRET_VARIABLE, "shared-secret-of-the-job")
    args = parse_args(["--nnodes", "2", "--master-addr", "10.255.255.1", "--master-port", "29500", "x.py"])
    assert args.secret == "shared-secret-of-the-job"
