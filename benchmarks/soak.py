"""Soak test: many all-reduces in a row must leave every rank's resident memory flat.

    mpirun -n 2 python benchmarks/soak.py                      # mpi and ring: 10,000 x 4 KiB, 10 x 256 MiB
    mpirun -n 4 python benchmarks/soak.py --backends ring --small 2000 --large 3 --large-size 16M

Per backend: a warm-up (one checked all-reduce per size, then ``WARMUP_SMALL`` small and
``WARMUP_LARGE`` large ones, so scratch buffers, ring plans, MPI's own buffers and the C
allocator's heap have settled), then the baseline resident set size (RSS), then the small phase
(``--small`` in-place all-reduces of ``--small-size`` bytes of float32) and the large phase
(``--large`` of ``--large-size``). RSS is read from ``/proc/self/statm`` after each phase on
every rank; one MPI all-gather brings all readings to rank 0, which prints RSS before and
after every phase and the growth over the baseline (the largest over ranks). After the last
reading, one all-reduce of exact values per size is checked (``wrong`` counts the elements that
differ); it runs after the readings because its own temporary arrays would show up in them.

Exit status (the same on every rank): 0 when no rank grew by more than ``--max-growth``
bytes and no result was wrong; 1 otherwise; 2 for bad arguments. ``--inject-leak SIZE`` keeps
SIZE more bytes per phase alive, a testing aid that proves the check can fail.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder, so `benchmarks` imports as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import os
import time

import numpy as np
from mpi4py import MPI

from npddp import comm as npcomm
from npddp.process.job import abort_on_exception

from benchmarks import _common as bc

PHASES = ("small", "large")
WARMUP_SMALL, WARMUP_LARGE = 20, 3
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """This process's resident set size now (Linux ``/proc/self/statm``; elsewhere the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _size(text: str) -> int:
    try:
        value = bc.parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if value < 4:
        raise argparse.ArgumentTypeError(f"must be at least 4 bytes (one float32), got {value}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def build_parser(verbose: bool = True):
    """The command-line parser; only a ``verbose`` one prints."""
    p = bc.RankParser(prog="soak.py", verbose=verbose,
                      description="Repeat all-reduces and check that resident memory stays flat.")
    p.add_argument("--backends", default="mpi,ring",
                   help=f"comma-separated backends (default: %(default)s; valid: {', '.join(npcomm.BACKENDS)})")
    p.add_argument("--small", type=_count, default=10_000, help="small all-reduces per backend (default 10000)")
    p.add_argument("--small-size", type=_size, default=4096, help="bytes of each small one (default 4K)")
    p.add_argument("--large", type=_count, default=10, help="large all-reduces per backend (default 10)")
    p.add_argument("--large-size", type=_size, default=256 << 20, help="bytes of each large one (default 256M)")
    p.add_argument("--max-growth", type=_size, default=16 << 20,
                   help="largest RSS growth over the baseline a rank may show (default 16M)")
    p.add_argument("--inject-leak", type=_count_size, default=0, metavar="SIZE",
                   help="testing aid: keep SIZE more bytes alive after every phase (default 0)")
    return p


def _count_size(text: str) -> int:
    return 0 if text.strip() == "0" else _size(text)


def parse_args(argv, verbose: bool = True):
    """Parsed and checked arguments; SystemExit(2) after one message (if verbose) otherwise."""
    parser = build_parser(verbose)
    args = parser.parse_args(argv)
    args.backends = tuple(b.strip() for b in args.backends.split(","))
    bad = [b for b in args.backends if b not in npcomm.BACKENDS]
    if bad or not args.backends:
        parser.error(f"--backends: unknown backend {bad[0] if bad else ''!r}; valid: {', '.join(npcomm.BACKENDS)}")
    return args


def exact(n: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s input of a checked all-reduce: small integers, exact in float32 for any order of sums."""
    return ((np.arange(n) + rank) % 13).astype(np.float32)


def checked(comm, n: int) -> int:
    """One all-reduce of exact values; the number of wrong elements."""
    x = exact(n, comm.rank)
    comm.allreduce(x)
    want = sum(exact(n, r) for r in range(comm.size))
    return int(np.count_nonzero(x != want))


def soak(comm, args, leak: list) -> tuple[list[int], list[float], int]:
    """Warm up, then run both phases; (RSS at baseline and after each phase, phase seconds, wrong elements)."""
    small = np.ones(args.small_size // 4, dtype=np.float32)   # (small_size / 4,)
    large = np.ones(args.large_size // 4, dtype=np.float32)   # (large_size / 4,)
    checked(comm, small.size), checked(comm, large.size)     # the allocator sees the check's temporaries first
    for _ in range(WARMUP_SMALL):
        comm.allreduce(small, "max")
    for _ in range(WARMUP_LARGE):                             # MPI may allocate lazily, on the second call
        comm.allreduce(large, "max")
    readings, seconds = [rss_bytes()], []
    for phase in PHASES:
        buf, count = (small, args.small) if phase == "small" else (large, args.large)
        t0 = time.perf_counter()
        for _ in range(count):
            comm.allreduce(buf, "max")      # max: the values stay put however often it runs
        seconds.append(time.perf_counter() - t0)
        if args.inject_leak:
            leak.append(np.ones(args.inject_leak, dtype=np.uint8))
        readings.append(rss_bytes())
    return readings, seconds, checked(comm, small.size) + checked(comm, large.size)


def main(argv=None) -> int:
    """Run the soak on COMM_WORLD; the exit status."""
    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    args = parse_args(sys.argv[1:] if argv is None else argv, verbose=rank == 0)
    if rank == 0:
        print(f"# soak: {n} ranks, backends {','.join(args.backends)}; small phase {args.small} x "
              f"{bc.format_size(args.small_size)}, large phase {args.large} x {bc.format_size(args.large_size)}; "
              f"allowed RSS growth {bc.format_size(args.max_growth)}", flush=True)
        print(f"# {'backend':<8} {'phase':<9} {'calls':>6} {'seconds':>8} {'RSS before':>11} {'RSS after':>10} "
              f"{'growth':>9}   (MiB, largest over ranks; growth over the post-warm-up baseline)", flush=True)
    failed = False
    leak: list = []
    for name in args.backends:
        sub = world.Dup()
        readings, seconds, wrong = soak(npcomm.create(name, sub), args, leak)
        sub.Free()
        mine = np.array([*readings, wrong], dtype=np.int64)         # (1 + phases + 1,)
        table = np.empty((n, mine.size), dtype=np.int64)            # (ranks, 1 + phases + 1)
        world.Allgather(mine, table)
        times = np.empty((n, len(PHASES)))                          # (ranks, phases)
        world.Allgather(np.array(seconds), times)
        rss, wrong_all = table[:, :-1], int(table[:, -1].sum())     # (ranks, 1 + phases)
        growth = rss - rss[:, :1]                                   # (ranks, 1 + phases) over the baseline
        bad = bool(growth.max() > args.max_growth) or wrong_all > 0
        failed |= bad
        if rank == 0:
            print(report(name, args, rss, growth, times.max(axis=0), wrong_all, bad), flush=True)
    return 1 if failed else 0


def report(name, args, rss, growth, seconds, wrong, bad) -> str:
    """Rank 0's lines for one backend: one per phase, then the verdict."""
    mib = 1 / 2**20
    lines = []
    for i, phase in enumerate(PHASES, start=1):
        calls = args.small if phase == "small" else args.large
        lines.append(f"  {name:<8} {phase:<9} {calls:>6} {seconds[i - 1]:>8.2f} {rss[:, i - 1].max() * mib:>11.1f} "
                     f"{rss[:, i].max() * mib:>10.1f} {growth[:, i].max() * mib:>+9.2f}")
    worst = int(growth.max(axis=1).argmax())
    lines.append(f"# {name}: largest growth over the baseline {growth.max() * mib:+.2f} MiB (rank {worst}), "
                 f"{wrong} wrong: {'FAIL' if bad else 'ok'}")
    return "\n".join(lines)


if __name__ == "__main__":
    abort_on_exception()
    sys.exit(main())
