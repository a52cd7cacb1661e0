"""Start-up check that MPI's traffic between two nodes crosses the emulated link: a ping-pong no faster than the rate.

    mpiexec -n 2 python -m npddp.cluster.probe --rate 1e9      # ranks on two nodes; exit 3 if too fast
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

#: Seconds one way of the ping-pong takes at the link rate; the message is clamped to 64 KiB .. 32 MiB.
_PROBE_S = 0.05
#: A transfer faster than this share of what the link allows did not cross it.
_SLACK = 0.8


def message_bytes(rate: float) -> int:
    return int(min(max(rate / 8 * _PROBE_S, 64 << 10), 32 << 20))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m npddp.cluster.probe", description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, required=True, help="the link rate in bits/s")
    args = p.parse_args(argv)
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    n = message_bytes(args.rate)
    buf = np.zeros(n, dtype=np.uint8)
    best = float("inf")
    for _ in range(2):
        comm.Barrier()
        t = time.perf_counter()
        if comm.rank == 0:
            comm.Send(buf, 1)
            comm.Recv(buf, 1)
        elif comm.rank == 1:
            comm.Recv(buf, 0)
            comm.Send(buf, 0)
        best = min(best, time.perf_counter() - t)
    allowed = 2 * n * 8 / args.rate
    if comm.rank == 0 and best < _SLACK * allowed:
        print(f"npddp.cluster: MPI traffic between node0 and node1 did not cross the emulated link: 2 x {n} bytes took "
              f"{best * 1e3:.1f} ms, the link allows no less than {allowed * 1e3:.1f} ms (MPICH used shared memory? "
              "keep UCX_TLS=tcp,self and FI_PROVIDER=tcp as npddp.cluster sets them)", file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
