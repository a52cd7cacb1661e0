"""The small-message floor: a plain loop of all-reduces per backend beside MPI's own, as a program calls them.

Run it with MPI (N = 2 is the table of docs/results/2026-12-02-performance.md)::

    mpirun -n 2 python benchmarks/floor.py
    mpirun -n 2 python benchmarks/floor.py --sizes 1K --columns raw,mpi,mpi/unchecked,mpi/inf --rounds 9

Each column is one way to all-reduce (sum, float32) the same two arrays, ``x`` into ``y``, in a
plain loop with nothing else in it:

* ``raw``: ``MPI.COMM_WORLD.Allreduce(x, y)`` through mpi4py, outside npddp.
* ``mpi``, ``auto``, ``shm``, ``rd``, ``ring``: ``comm.allreduce(x, out=y)`` of ``create(name)``
  with default settings; ``rd/tcp``, ``ring/tcp`` over the tcp transport.
* ``rabenseifner``, ``tree``: the other hand-written algorithms, as ``rd`` and ``ring`` are run.
* ``auto/mpi``: ``auto`` pinned to MPI's own all-reduce (its check, then MPI's call), as ``auto`` runs it.
* ``mpi/unchecked`` (``check_args=False``), ``mpi/inf`` (and ``timeout=inf`` too): what the
  ``mpi`` backend's argument check and deadline cost.
* ``bare-rd``, ``bare-ring``: the messages of ``rd`` and ``ring`` at N = 2 and nothing else, over
  mpi4py (``Isend``/``Irecv``/``Waitall`` and the add): what the algorithms' own messages cost.
  ``bare-rd/tcp``, ``bare-ring/tcp``: the same over npddp's tcp transport (its requests polled).

Method. Every column's communicator is built first. Then ``--rounds`` rounds; in each, every
size and every column in turn (the first column one later each round) runs a barrier, then
``calls`` all-reduces timed together; its time per call is the maximum over ranks. ``calls`` is
sized once per size and column from warm-up calls to take about ``--block`` seconds. A table
per size gives each column's median over rounds, its spread (min-max, in percent of the
median) and the ratio to ``raw``; with ``auto`` among the columns, a last line gives ``auto``'s
median over the smallest median of every other column except the ``bare-`` and ``mpi/`` ones
(raw MPI and every algorithm as its own backend). Each column's result is checked once against NumPy's.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import time

import numpy as np
from mpi4py import MPI

from benchmarks import _common as bc
from npddp import comm as npcomm

COLUMNS = ("raw", "mpi", "mpi/unchecked", "mpi/inf", "auto", "shm", "rd", "ring", "rabenseifner", "tree",
           "auto/mpi",
           "bare-rd", "bare-ring",
           "rd/tcp", "ring/tcp", "bare-rd/tcp", "bare-ring/tcp")
DEFAULT_COLUMNS = "raw,mpi,auto,shm,rd,ring,bare-rd,bare-ring,rd/tcp,ring/tcp,bare-rd/tcp,bare-ring/tcp"


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    p = bc.RankParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1K,64K,1M", help="bytes per rank, comma-separated (default 1K,64K,1M)")
    p.add_argument("--columns", type=bc.names(COLUMNS), default=bc.names(COLUMNS)(DEFAULT_COLUMNS),
                   help=f"comma-separated from {', '.join(COLUMNS)}")
    p.add_argument("--rounds", type=bc.int_at_least(1), default=7, help="interleaved rounds (default 7)")
    p.add_argument("--block", type=float, default=0.05, help="seconds of one timed block (default 0.05)")
    p.add_argument("--json", default=None, help="write the medians and spreads to this JSON file (rank 0)")
    return p


class Bare:
    """The messages of a two-rank ``rd`` (whole buffer each way) or ``ring`` (half each way, twice), then the add."""

    def __init__(self, kind: str, world, transport=None):
        self.kind, self.world, self.transport = kind, world, transport
        self.peer = 1 - world.Get_rank()
        self.tmp = None

    def allreduce(self, x, out):
        """One all-reduce of ``x`` into ``out`` by the bare messages."""
        if self.tmp is None or self.tmp.shape != x.shape:
            self.tmp = np.empty_like(x)
        if self.kind == "rd":
            self._exchange(x, self.tmp)
            np.add(x, self.tmp, out=out)
            return out
        h = x.size // 2
        mine, theirs = (slice(0, h), slice(h, None)) if self.peer else (slice(h, None), slice(0, h))
        self._exchange(x[theirs], self.tmp[mine])           # reduce-scatter: send their half, get mine
        np.add(x[mine], self.tmp[mine], out=out[mine])
        self._exchange(out[mine], out[theirs])              # all-gather: send my half, get theirs
        return out

    def _exchange(self, send, recv):
        if self.transport is None:
            MPI.Request.Waitall([self.world.Irecv(recv, self.peer, 7), self.world.Isend(send, self.peer, 7)])
            return
        t = self.transport
        r, s = t.irecv(recv, self.peer, 7), t.isend(send, self.peer, 7)
        while not r.test():
            pass
        while not s.test():
            pass


def build(column: str, world, tcp):
    """The communicator-like object (``allreduce(x, out=y)``) of ``column``."""
    if column == "raw":
        return None
    if column.startswith("bare-"):
        kind, _, over = column[5:].partition("/")
        return Bare(kind, world, tcp.transport() if over == "tcp" else None)
    name, _, variant = column.partition("/")
    if variant == "tcp":
        return npcomm.create(name, tcp.transport())
    if variant == "mpi":
        comm = npcomm.create(name)
        comm.pin("mpi")
        return comm
    if variant == "unchecked":
        return npcomm.create(name, check_args=False)
    if variant == "inf":
        return npcomm.create(name, check_args=False, timeout=float("inf"))
    return npcomm.create(name)


def loop(obj, world, x, y, calls: int) -> float:
    """Seconds per call of ``calls`` all-reduces of ``x`` into ``y`` after a barrier (this rank's clock)."""
    world.Barrier()
    if obj is None:
        reduce = world.Allreduce
        t = time.perf_counter()
        for _ in range(calls):
            reduce(x, y)
    else:
        reduce = obj.allreduce
        t = time.perf_counter()
        for _ in range(calls):
            reduce(x, out=y)
    return (time.perf_counter() - t) / calls


def main(argv=None) -> int:
    world = MPI.COMM_WORLD
    args = build_parser().parse_args(argv)
    sizes = [bc.parse_size(s) for s in args.sizes.split(",")]
    columns = list(args.columns)
    n, rank = world.Get_size(), world.Get_rank()
    if any(c.startswith("bare-") for c in columns) and n != 2:
        columns = [c for c in columns if not c.startswith("bare-")]
    tcp = bc.tcp_world(world) if any(c.endswith("/tcp") for c in columns) else None
    objs = {c: build(c, world, tcp) for c in columns}
    arrays = {}
    calls = {}
    for nbytes in sizes:
        count = max(1, nbytes // 4)
        x = np.full(count, rank + 1, dtype=np.float32)
        y = np.zeros(count, dtype=np.float32)
        arrays[nbytes] = x, y
        for col in columns:
            loop(objs[col], world, x, y, 3)
            if not np.all(y == n * (n + 1) / 2):
                raise SystemExit(f"{col} at {nbytes} B gave a wrong sum")
            t = loop(objs[col], world, x, y, 20)
            k = np.array([max(5, int(args.block / max(t, 1e-7)))])
            world.Bcast(k, root=0)
            calls[nbytes, col] = int(k[0])
    times = {key: [] for key in calls}
    for r in range(args.rounds):
        order = columns[r % len(columns):] + columns[:r % len(columns)]
        for nbytes in sizes:
            x, y = arrays[nbytes]
            for col in order:
                t = np.array([loop(objs[col], world, x, y, calls[nbytes, col])])
                world.Allreduce(MPI.IN_PLACE, t, op=MPI.MAX)
                times[nbytes, col].append(float(t[0]))
    picks = {b: objs["auto"].algorithm_for(b, np.float32) for b in sizes} if "auto" in objs else {}
    if rank == 0:
        report(sizes, columns, times, n, args, picks)
    return 0


def report(sizes, columns, times, n: int, args, picks: dict) -> None:
    """Print one table per size; write the JSON when asked."""
    load = open("/proc/loadavg").read().split()[:3] if Path("/proc/loadavg").exists() else []
    print(f"# floor: N={n}, float32 sum, {args.rounds} rounds, MPI {MPI.Get_library_version().splitlines()[0]}"
          f"{', load ' + ' '.join(load) if load else ''}")
    out = {}
    for nbytes in sizes:
        raw = float(np.median(times[nbytes, "raw"])) if (nbytes, "raw") in times else None
        print(f"\n{bc.format_size(nbytes):>6}  {'column':<14} {'median us':>10} {'spread %':>9} {'x raw':>7}")
        for col in columns:
            t = np.asarray(times[nbytes, col])
            med = float(np.median(t))
            spread = 100 * (t.max() - t.min()) / med
            ratio = f"{med / raw:7.2f}" if raw else ""
            print(f"{'':6}  {col:<14} {med * 1e6:10.2f} {spread:9.0f} {ratio}")
            out[f"{nbytes}/{col}"] = {"median_us": med * 1e6, "min_us": t.min() * 1e6, "max_us": t.max() * 1e6}
        rivals = [c for c in columns if c != "auto" and not c.startswith(("bare-", "mpi/", "auto/"))]
        if "auto" in columns and rivals:
            best = min(rivals, key=lambda c: float(np.median(times[nbytes, c])))
            ratio = float(np.median(times[nbytes, "auto"]) / np.median(times[nbytes, best]))
            print(f"{'':6}  auto (runs {picks[nbytes]}) / best ({best}): {ratio:.2f}")
            out[f"{nbytes}/auto-over-best"] = {"ratio": ratio, "best": best, "auto_runs": picks[nbytes]}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(main())
