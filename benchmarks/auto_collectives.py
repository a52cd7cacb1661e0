"""``auto``'s all-gather and reduce-scatter against the best registered algorithm, per size: the 1.1x check.

    mpirun -n 2 python benchmarks/auto_collectives.py                       # 1 KiB to 64 MiB, factor 4
    mpirun -n 3 python benchmarks/auto_collectives.py -b 1K -e 1M --budget 0.2

For each collective and size it times ``ring:NAME`` for every algorithm ``auto`` may pick (the
registry's ``auto``-eligible entries) and ``auto`` itself, interleaved in rounds (benchmarks/collectives.py's
method, its size convention: the whole vector), and prints auto's pick, the fastest candidate, and
auto's median time over the fastest's; ``miss`` marks a ratio above ``--goal`` (default 1.1). Exit 0 whether
or not auto met the goal (a measurement, not a test); 1 only when a result was wrong.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder, so `benchmarks` imports as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse

from mpi4py import MPI

from benchmarks import _common as bc
from benchmarks import collectives as sweep
from npddp.comm.algorithms import registry
from npddp.comm.communicators.choice import DEFAULTS
from npddp.process.job import abort_on_exception

GOAL = 1.1


def build_parser(verbose: bool) -> argparse.ArgumentParser:
    """The command-line parser; only a ``verbose`` one prints."""
    p = bc.RankParser(verbose=verbose, description="auto's all-gather and reduce-scatter over the best candidate's time.")
    p.add_argument("--collectives", default=",".join(DEFAULTS), help="comma-separated (default %(default)s)")
    p.add_argument("-b", "--minbytes", default="1K", help="smallest whole-vector size (default 1K)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest (default 64M)")
    p.add_argument("-f", "--factor", default="4", help="size factor (default 4)")
    p.add_argument("--iters", default="12", help="timed iterations per size and row (default 12)")
    p.add_argument("--rounds", default="3", help="rounds, the rows in turn (default 3)")
    p.add_argument("--budget", default="0.3", help="seconds per size and row (default 0.3)")
    p.add_argument("--goal", type=float, default=GOAL, help="auto's ratio to the best to meet (default 1.1)")
    return p


def candidates(collective: str) -> tuple:
    """The rows of one collective: each algorithm auto may pick, as ``ring:NAME``, then ``auto``."""
    return (*(f"ring{sweep.CHOSEN}{name}" for name in registry.names(collective, auto=True)), "auto")


def ratios(rows: list[dict]) -> list[tuple]:
    """``(bytes, auto's pick, best row, best time s, auto time s, ratio)`` per size of one collective's rows."""
    out = []
    for nbytes in dict.fromkeys(r["bytes"] for r in rows):
        here = [r for r in rows if r["bytes"] == nbytes]
        auto = next(r for r in here if r["backend"] == "auto")
        best = min((r for r in here if r["backend"] != "auto"), key=lambda r: r["time_median_s"])
        out.append((nbytes, auto["algorithm"], best["algorithm"], best["time_median_s"], auto["time_median_s"],
                    auto["time_median_s"] / best["time_median_s"]))
    return out


def main(argv=None) -> int:
    """Sweep each collective, print auto's ratio per size (rank 0); 1 when a result was wrong."""
    argv = sys.argv[1:] if argv is None else list(argv)
    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    a = build_parser(rank == 0).parse_args(argv)
    wrong = 0
    for collective in (c.strip() for c in a.collectives.split(",")):
        cfg = sweep.parse_config(["--collective", collective, "--backends", ",".join(candidates(collective)),
                                  "-b", a.minbytes, "-e", a.maxbytes, "-f", a.factor, "--iters", a.iters,
                                  "--rounds", a.rounds, "--budget", a.budget, "--dtype", "float32"],
                                 verbose=rank == 0)
        harness = world.Dup()
        try:
            rows, _ = sweep.run_sweep(cfg, harness)
        finally:
            harness.Free()
        wrong += sum(r["wrong"] for r in rows)
        if rank == 0:
            print(f"# {collective}, N = {n}: auto's median time over the fastest candidate's "
                  f"({', '.join(candidates(collective)[:-1])})")
            print(f"# {'size':>9} {'auto picks':>10} {'fastest':>9} {'best us':>10} {'auto us':>10} {'ratio':>6}")
            for nbytes, pick, best, t_best, t_auto, ratio in ratios(rows):
                miss = "  miss" if ratio > a.goal else ""
                print(f"  {bc.format_size(nbytes):>9} {pick:>10} {best:>9} {t_best * 1e6:10.1f} {t_auto * 1e6:10.1f} "
                      f"{ratio:6.2f}{miss}", flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    abort_on_exception()
    sys.exit(main())
