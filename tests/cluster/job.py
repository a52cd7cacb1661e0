"""Small jobs the cluster tests run across emulated nodes: ``python tests/cluster/job.py WHAT [args]``."""

import os
import signal
import socket
import sys
import time

import numpy as np

from npddp.comm import create
from npddp.comm.node.memory import node_ids


def say(line: str) -> None:
    """One line in one write (atomic on a pipe), so the lines of ranks sharing stdout never interleave."""
    os.write(1, (line + "\n").encode())


def nodes() -> None:
    """Print ``rank host node-of-every-rank hier-ok auto-across-nodes auto-at-16MiB``; hier sums across the nodes."""
    comm = create("hier")
    ids = node_ids(create("ring"))
    auto = create("auto")
    buf = np.arange(1000, dtype=np.float64) + comm.rank
    comm.allreduce(buf)
    expected = comm.size * np.arange(1000.0) + sum(range(comm.size))
    say(f"RESULT {comm.rank} {socket.gethostname()} {','.join(map(str, ids))} {int(np.array_equal(buf, expected))} "
        f"{auto.across_nodes} {auto.algorithm_for(16 << 20, np.float32)}")


def shaped(nbytes: str) -> None:
    """Rank 0 prints the best of three timings of a ring all-reduce of ``nbytes`` bytes."""
    comm = create("ring")
    buf = np.ones(int(nbytes) // 4, dtype=np.float32)
    best = float("inf")
    for _ in range(3):
        comm.barrier()
        t = time.perf_counter()
        comm.allreduce(buf)
        best = min(best, time.perf_counter() - t)
    if comm.rank == 0:
        say(f"SECONDS {best:.6f}")


def kill(victim: str) -> None:
    """Rank ``victim`` SIGKILLs itself once every rank is in the loop; the others keep all-reducing."""
    comm = create("ring")
    buf = np.ones(1 << 16, dtype=np.float32)
    comm.allreduce(buf)
    if comm.rank == int(victim):
        os.kill(os.getpid(), signal.SIGKILL)
    while True:
        comm.allreduce(buf)


def sleep(pid_dir: str) -> None:
    """Write this rank's pid into ``pid_dir`` and sleep (until a signal ends it)."""
    rank = next((os.environ[name] for name in ("RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK") if name in os.environ), "0")
    with open(os.path.join(pid_dir, f"{rank}.pid.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(pid_dir, f"{rank}.pid.tmp"), os.path.join(pid_dir, f"{rank}.pid"))
    time.sleep(600)


if __name__ == "__main__":
    {"nodes": nodes, "shaped": shaped, "kill": kill, "sleep": sleep}[sys.argv[1]](*sys.argv[2:])
