"""The TCP transport in one process: two or three ranks' worlds connected over loopback, driven by hand.

Matching by tag in any order, frames that arrive before their receive, zero-byte and large
messages, buffers never copied on the send side, cancelling, a broken peer, and the
rendezvous's errors (bad variables, nobody at the master port, mismatched world sizes).
"""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest

from npddp.comm.transports.launch_env import LaunchEnv, launch_env
from npddp.comm.transports.rendezvous import RendezvousError, connect
from npddp.comm.transports.tcp import TCPWorld


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_worlds(n: int, timeout: float = 20.0) -> list[TCPWorld]:
    """``n`` connected worlds, one per rank, all in this process (each rank's rendezvous in a thread)."""
    port, results, errors = free_port(), [None] * n, []

    def join(rank):
        try:
            env = LaunchEnv(rank, n, "127.0.0.1", port, rank, n)
            socks, hosts = connect(env, timeout)
            results[rank] = TCPWorld(rank, n, socks, hosts)
        except Exception as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def drive(requests, seconds: float = 10.0) -> None:
    """Test every request until all are done (progress happens inside test())."""
    deadline = time.monotonic() + seconds
    while not all([r.test() for r in requests]):
        assert time.monotonic() < deadline, "requests never completed"


@pytest.fixture
def pair():
    worlds = make_worlds(2)
    yield [w.transport() for w in worlds]
    for w in worlds:
        w.close()


def test_messages_match_by_tag_whatever_order_receives_are_posted(pair):
    a, b = pair
    sizes = {5: 3, 9: 70_000, 2: 0, 7: 1}       # tag -> elements (zero-byte and ~280 KB frames too)
    sent = {tag: np.arange(n, dtype=np.float32) + tag for tag, n in sizes.items()}
    sends = [a.isend(sent[tag], 1, tag) for tag in sizes]
    got = {tag: np.full(n, -1, dtype=np.float32) for tag, n in sizes.items()}
    recvs = [b.irecv(got[tag], 0, tag) for tag in sorted(sizes, reverse=True)]  # another order than sent
    drive(sends + recvs)
    assert all(np.array_equal(got[tag], sent[tag]) for tag in sizes)


def test_same_tag_frames_arrive_in_order_even_when_read_early(pair):
    a, b = pair
    frames = [np.full(50_000, i, dtype=np.int64) for i in range(6)]
    sends = [a.isend(f, 1, 4) for f in frames]
    other = np.zeros(1, dtype=np.int64)
    late = b.irecv(other, 0, 8)                        # a receive for another tag forces tag 4 to be read aside
    sends.append(a.isend(np.array([42]), 1, 8))
    drive([late] + sends[-1:])
    got = [np.empty(50_000, dtype=np.int64) for _ in frames]
    drive([b.irecv(g, 0, 4) for g in got] + sends)
    assert other[0] == 42 and [int(g[0]) for g in got] == list(range(6)) and all((g == g[0]).all() for g in got)


def test_a_large_send_waits_for_its_receive_and_is_never_copied(pair):
    a, b = pair
    big = np.arange(8 << 20, dtype=np.uint8)           # 8 MiB: more than the socket buffers hold
    send = a.isend(big, 1, 1)
    for _ in range(50):
        send.test()
    assert not send.done                               # flow control: the frame waits in the kernel for its receive
    out = np.empty_like(big)
    drive([b.irecv(out, 0, 1), send])
    assert np.array_equal(out, big)


def test_messages_to_self_and_contexts_stay_apart():
    world = TCPWorld(0, 1, [None], ["self"])
    t1, t2 = world.transport(), world.transport()
    x, y = np.zeros(3), np.zeros(3)
    drive([t1.isend(np.ones(3), 0, 1), t2.isend(np.full(3, 2.0), 0, 1)])  # same tag, two contexts
    drive([t2.irecv(y, 0, 1), t1.irecv(x, 0, 1)])
    assert x.tolist() == [1.0] * 3 and y.tolist() == [2.0] * 3


def test_a_frame_larger_than_its_receive_buffer_is_an_error(pair):
    a, b = pair
    send = a.isend(np.zeros(10), 1, 3)
    with pytest.raises(ValueError, match="80 bytes, more than the 40 bytes"):
        drive([b.irecv(np.zeros(5), 0, 3), send])


def test_a_frame_larger_than_its_receive_fails_that_receive_only_and_the_stream_stays_in_step(pair):
    a, b = pair
    too_small, out = b.irecv(np.zeros(5), 0, 3), np.zeros(4)
    after = b.irecv(out, 0, 3)
    sends = [a.isend(np.zeros(10), 1, 3), a.isend(np.arange(4.0), 1, 3)]
    with pytest.raises(ValueError, match="80 bytes, more than the 40 bytes"):
        drive([too_small, *sends])
    drive([after, *sends])
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_cancelled_receive_leaves_the_stream_in_step(pair):
    a, b = pair
    doomed = b.irecv(np.zeros(4), 0, 6)
    doomed.cancel()
    out = np.zeros(4)
    drive([a.isend(np.arange(4.0), 1, 6), b.irecv(out, 0, 6)])
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0] and doomed.done


def test_a_peer_that_goes_away_fails_its_requests_at_once():
    worlds = make_worlds(3)
    t0 = worlds[0].transport()
    waiting = t0.irecv(np.zeros(4), 2, 1)
    other = t0.irecv(np.zeros(4), 1, 1)
    worlds[2].close()
    t_start = time.monotonic()
    with pytest.raises(ConnectionError, match="connection to rank 2 broke"):
        while not waiting.test():
            assert time.monotonic() - t_start < 5
    assert not other.test()                            # rank 1 is still fine
    for w in worlds[:2]:
        w.close()


@pytest.mark.parametrize("env, text", [
    ({"WORLD_SIZE": "2", "MASTER_PORT": "1"}, "RANK is not set"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_PORT": "1"}, "RANK='2' is out of range; valid: 0..1"),
    ({"RANK": "0", "WORLD_SIZE": "zero", "MASTER_PORT": "1"}, "WORLD_SIZE='zero'"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}, "MASTER_PORT='70000' is out of range; valid: 1..65535"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_PORT is not set"),
    ({"RANK": "0", "WORLD_SIZE": "4", "MASTER_PORT": "5", "LOCAL_WORLD_SIZE": "5"}, "LOCAL_WORLD_SIZE='5'"),
])
def test_bad_launcher_variables_name_the_variable_and_its_range(env, text):
    with pytest.raises(ValueError, match=text.replace("(", r"\(").replace(")", r"\)")):
        launch_env(env)


def test_a_rank_that_cannot_reach_rank_0_fails_with_one_line_naming_the_address():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(RendezvousError) as info:
        connect(LaunchEnv(1, 2, "127.0.0.1", port, 1, 2), timeout=0.5)
    text = str(info.value)
    assert time.monotonic() - t0 < 5 and "\n" not in text
    assert text.startswith(f"[rank 1] tcp rendezvous: could not reach rank 0 at 127.0.0.1:{port}")


def test_ranks_with_different_world_sizes_are_refused():
    port, errors = free_port(), []

    def join(rank, size):
        try:
            connect(LaunchEnv(rank, size, "127.0.0.1", port, 0, 1), timeout=5)
        except RendezvousError as exc:
            errors.append(str(exc))

    threads = [threading.Thread(target=join, args=a) for a in ((0, 2), (1, 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 2 and all("rank 1 has WORLD_SIZE=3 but rank 0 has WORLD_SIZE=2" in e for e in errors)


@pytest.mark.mpi(min_size=2)
@pytest.mark.needs_mpi
def test_a_tcp_world_inside_an_mpi_job_agrees_bit_for_bit_with_the_mpi_transport(values, assert_all_ranks):
    """Under mpirun without RANK/MASTER_*, MPI carries rank 0's address; the same ring adds in the same order."""
    from npddp.comm import create
    over_tcp, over_mpi = create("ring", transport="tcp"), create("ring", transport="mpi")
    rng = np.random.default_rng(over_tcp.rank)
    x = rng.standard_normal(300_001).astype(np.float32)     # float sums: the order of additions shows in the bits
    a, b = over_tcp.allreduce(x, out=np.empty_like(x)), over_mpi.allreduce(x, out=np.empty_like(x))
    ok = over_tcp.transport.name == "tcp" and over_tcp.size == over_mpi.size and a.tobytes() == b.tobytes()
    assert_all_ranks(ok, "ring over tcp and over mpi differ")
