"""Start-up check that MPI's traffic between two nodes crosses the emulated link: a ping-pong no faster than the rate.

    mpiexec -n 2 python -m mpi4py -m npddp.cluster.probe --rate 1e9   # ranks on two nodes; exit 3 on a bypass

The ranks must be on two hosts, node0's ``eth0`` must count at least the bytes of the
ping-pong, and on a shaped link the ping-pong must take at least 0.8 of what the rate allows.
Rank 0 prints one line on stderr: the library (from MPI_Get_library_version), the time and what
the rate allows; on a bypass, the network variables of that library that keep it on the links.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time

import numpy as np

from npddp.cluster import launch
from npddp.cluster.topology import DEVICE

#: Seconds one way of the ping-pong takes at the link rate; the message is clamped to 64 KiB .. 32 MiB.
_PROBE_S = 0.05
#: A transfer faster than this share of what the link allows did not cross it.
_SLACK = 0.8
#: Round trips timed (the best counts).
ROUNDS = 2
#: Bytes of a host name the probe compares.
_HOST_BYTES = 256


def message_bytes(rate: float | None) -> int:
    """The ping-pong's message: :data:`_PROBE_S` of the rate, 1 MiB on an unshaped link."""
    return 1 << 20 if rate is None else int(min(max(rate / 8 * _PROBE_S, 64 << 10), 32 << 20))


def _rate(text: str) -> float | None:
    return None if text == "none" else float(text)


def peer_host(comm) -> str:
    """Rank 1's host name, received by rank 0 in a fixed-size byte buffer (no pickling); "" on other ranks."""
    name = np.zeros(_HOST_BYTES, dtype=np.uint8)
    if comm.rank == 1:
        raw = socket.gethostname().encode()[:_HOST_BYTES]
        name[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        comm.Send(name, 0)
    elif comm.rank == 0:
        comm.Recv(name, 1)
    return name.tobytes().rstrip(b"\0").decode(errors="replace")


def link_bytes(device: str = DEVICE) -> int | None:
    """Bytes ``device`` of this process's network namespace has sent and received (None without such a device)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, sep, counters = line.partition(":")
            if sep and name.strip() == device:
                fields = counters.split()
                return int(fields[0]) + int(fields[8])
    return None


def ping_pong(comm, n: int) -> float:
    """The best of :data:`ROUNDS` round trips of ``n`` bytes between ranks 0 and 1, in seconds."""
    buf = np.zeros(n, dtype=np.uint8)
    best = float("inf")
    for _ in range(ROUNDS):
        comm.Barrier()
        t = time.perf_counter()
        if comm.rank == 0:
            comm.Send(buf, 1)
            comm.Recv(buf, 1)
        elif comm.rank == 1:
            comm.Recv(buf, 0)
            comm.Send(buf, 0)
        best = min(best, time.perf_counter() - t)
    return best


def setting(lib: launch.MpiLibrary) -> str:
    """``lib``'s network variables as ``NAME=value`` words: what keeps its traffic between nodes on the links."""
    return " ".join(f"{name}={value}" for name, value in lib.network_env.items())


def verdict(lib: launch.MpiLibrary, hosts: tuple[str, str], n: int, seconds: float, rate: float | None,
            carried: int | None) -> tuple[bool, str]:
    """Whether the ping-pong crossed the link, and the line saying so (naming what to set when it did not).

    ``carried``: the bytes node0's link counted during the ping-pong (None: not measured); it must
    be at least what the ping-pong sent and received, and the time at least what the rate allows.
    """
    allowed = 0.0 if rate is None else 2 * n * 8 / rate
    timing = f"2 x {n} bytes took {seconds * 1e3:.1f} ms" + (
        "" if rate is None else f", the link allows no less than {allowed * 1e3:.1f} ms")
    if hosts[0] == hosts[1]:
        return False, (f"npddp.cluster: {lib.name}'s launcher put both probe ranks on {hosts[0]}, not on node0 and "
                       "node1 (it did not follow the host file)")
    bypass = None
    if carried is not None and carried < 2 * n * ROUNDS:
        bypass = f"{DEVICE} carried {carried} of the {2 * n * ROUNDS} bytes sent and received"
    elif seconds < _SLACK * allowed:
        bypass = timing
    if bypass:
        return False, (f"npddp.cluster: {lib.name}'s traffic between {hosts[0]} and {hosts[1]} did not cross the "
                       f"emulated link: {bypass} ({lib.name} used shared memory across the nodes? set "
                       f"{setting(lib)}, as npddp.cluster does where the environment chose nothing)")
    return True, f"npddp.cluster: {lib.name} between {hosts[0]} and {hosts[1]}: {timing}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m npddp.cluster.probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=_rate, required=True, help="the link rate in bits/s, or none (unshaped)")
    args = p.parse_args(argv)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    n = message_bytes(args.rate)
    other = peer_host(comm)
    before = link_bytes()
    seconds = ping_pong(comm, n)
    after = link_bytes()
    if comm.rank != 0:
        return 0
    carried = None if before is None or after is None else after - before
    ok, line = verdict(launch.library_for(MPI.Get_library_version()), (socket.gethostname(), other), n, seconds,
                       args.rate, carried)
    print(line, file=sys.stderr, flush=True)
    return 0 if ok else launch.PROBE_REFUSED


if __name__ == "__main__":
    sys.exit(main())
