"""A collective's sweep across emulated nodes (``python -m npddp.cluster``), summarised against the link rate.

    python benchmarks/cluster_study.py --nodes 2 --ranks-per-node 1 --rate 1gbit -b 1K -e 64M --out study/
    python benchmarks/cluster_study.py --collective allgather --nodes 2 --rate 1gbit -b 1K -e 16M --out study/
    python benchmarks/cluster_study.py --summarize study/ar_2x1_1gbit.csv --rate 1gbit   # an existing sweep
    python benchmarks/cluster_study.py --nodes 4 -b 1K -e 256K --calls 50 --iters 20 --out study/  # small sizes
    python benchmarks/cluster_study.py --ddp --nodes 2 --rate 1gbit --out study/          # DDP, seed model sizes

Each configuration runs ``benchmarks/collectives.py`` inside the cluster (``--launcher mpi``:
MPI's own call, in npddp's ``mpi`` backend and in a bare mpi4py loop (``raw``), and every
hand-written backend over both transports, MPI point-to-point and TCP) and prints, per size,
the median time of each backend (in place where the collective has that form, else out of
place), the ring's bus bandwidth as a share of the link rate (busbw / rate; the ring puts
busbw_factor x size on each link: 2(N-1)/N for all-reduce, (N-1)/N for all-gather,
reduce-scatter and all-to-all, 1 for broadcast), and ``auto``'s time over the fastest fixed
algorithm on the same transport. ``--collective`` picks the collective (default allreduce).
Every rank shares this machine's cores: figures are only as good as the link, not the CPU,
is the bottleneck (rates of 1 Gbit/s and below on a 2-core box), and the machine's load is
part of every number.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import busbw_factor, offered  # noqa: E402
from benchmarks._costmodel import fit_alpha_beta  # noqa: E402
from benchmarks.columns import COLLECTIVES  # noqa: E402
from npddp.cluster.shaping import parse_rate  # noqa: E402

FIXED = ("ring", "rd", "rabenseifner", "tree")
#: The backends swept when --backends is not given: every fixed all-reduce algorithm; for the other collectives, whose
#: fixed backends all run the same schedule today, the ring and the naive one.
DEFAULT_BACKENDS = {"allreduce": "mpi,ring,rd,rabenseifner,tree,auto,hier"}
OTHERS_DEFAULT = "mpi,ring,naive,auto"
#: The second fit starts here: below it a 1 Gbit/s token bucket lets a message through faster than the rate.
FIT_FROM = 256 << 10


def run_sweep(args, path: Path) -> int:
    """One sweep inside a fresh cluster; the harness's exit code."""
    cmd = [sys.executable, "-m", "npddp.cluster", "--nodes", str(args.nodes), "--ranks-per-node",
           str(args.ranks_per_node), "--rate", args.rate, "--launcher", "mpi", "--",
           sys.executable, str(ROOT / "benchmarks" / "collectives.py"), "--collective", args.collective,
           "--backends", args.backends,
           "--transports", "mpi,tcp", "-b", args.minbytes, "-e", args.maxbytes, "-f", str(args.factor),
           "--iters", str(args.iters), "--budget", str(args.budget), "--calls", str(args.calls), "--csv", str(path)]
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def read(path: Path) -> tuple[dict, str]:
    """((bytes, backend, transport) -> median seconds in place, or out of place where the collective has no in-place
    form; the collective)."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    place = "inplace" if any(r["place"] == "inplace" for r in rows) else "outofplace"
    times = {(int(r["bytes"]), r["backend"], r["transport"]): float(r["time_median_s"]) for r in rows
             if r["place"] == place}
    return times, (rows[0]["collective"] if rows else "allreduce")


def summarize(path: Path, rate: float | None, world: int) -> list[str]:
    """The table's lines: per size, times, the ring's share of the link rate, auto over the best fixed."""
    times, collective = read(path)
    factor = busbw_factor(collective, world)
    by_size = defaultdict(dict)
    for (n, backend, transport), t in times.items():
        by_size[n][backend if transport == "mpi" else f"{backend}/tcp"] = t
    names = [b for b in ("raw", "mpi", *FIXED, "naive", "auto", "hier") for b in (b, f"{b}/tcp")
             if any(b in v for v in by_size.values())]
    head = f"{'bytes':>10} " + " ".join(f"{b:>16}" for b in names)
    head += "   ring share (mpi, tcp)   auto/best (mpi, tcp)"
    lines = [f"# {collective}: median ms; share = ({factor:g} x bytes / time) / link rate", head]
    for n in sorted(by_size):
        row = by_size[n]
        cells = " ".join(f"{row[b] * 1e3:16.3f}" if b in row else f"{'-':>16}" for b in names)
        share = []
        for key in ("ring", "ring/tcp"):
            share.append(f"{factor * n * 8 / row[key] / rate:.2f}" if rate and key in row else "-")
        ratio = []
        for suffix in ("", "/tcp"):
            best = min((row[f + suffix] for f in FIXED if f + suffix in row), default=None)
            auto = row.get("auto" + suffix)
            ratio.append(f"{auto / best:.2f}" if best and auto else "-")
        lines.append(f"{n:>10} {cells}   {share[0]:>6} {share[1]:>6}            {ratio[0]:>6} {ratio[1]:>6}")
    return lines


def fit_network(path: Path, rate: float | None, world: int, min_bytes: int = 0) -> list[str]:
    """Per fixed algorithm and transport: the alpha-beta fit of its in-place times at the sweep's sizes >= min_bytes.

    Each algorithm is fitted with its own steps and bytes (``benchmarks/_costmodel.py``), so alpha is the
    network's per-message latency and bandwidth what it sees (bytes/s); ``bandwidth / rate`` is the link's share.
    """
    times, collective = read(path)
    times = {key: t for key, t in times.items() if key[0] >= min_bytes}
    lines = [f"# alpha-beta fit per algorithm, sizes >= {min_bytes} B (T = steps x alpha + bytes sent / bandwidth; "
             "weighted by 1/T)",
             f"{'algorithm':>16} {'alpha us':>9} {'bandwidth Gbit/s':>16} {'bw / rate':>9} {'rel rms':>8} {'sizes':>6}"]
    for transport in ("mpi", "tcp"):
        for name in (FIXED if collective == "allreduce" else ("ring", "naive")):
            pts = sorted((n, t) for (n, b, tr), t in times.items() if b == name and tr == transport)
            if len({n for n, _ in pts}) < 2 or world < 2:
                continue
            fit = fit_alpha_beta([n for n, _ in pts], [t for _, t in pts], collective, world, name)
            gbit = fit.bandwidth * 8 / 1e9
            share = f"{fit.bandwidth * 8 / rate:.2f}" if rate else "-"
            label = name if transport == "mpi" else f"{name}/tcp"
            lines.append(f"{label:>16} {fit.alpha * 1e6:9.1f} {gbit:16.3f} {share:>9} {fit.rel_rms:8.2f} {len(pts):6d}")
    return lines


def run_ddp(args, path: Path) -> int:
    """The DDP benchmark of the seed models inside a fresh cluster; the harness's exit code."""
    cmd = [sys.executable, "-m", "npddp.cluster", "--nodes", str(args.nodes), "--ranks-per-node",
           str(args.ranks_per_node), "--rate", args.rate, "--launcher", "mpi", "--",
           sys.executable, str(ROOT / "benchmarks" / "ddp.py"), "--models", "tiny,small,medium", "--syncs", "overlap",
           "--backends", "ring", "--no-comm", "--steps", "3", "--warmup", "1", "--rounds", "1", "--csv", str(path)]
    print("+", " ".join(cmd), flush=True)
    return subprocess.call(cmd)


def summarize_ddp(path: Path, rate: float | None, world: int) -> list[str]:
    """Per model: step with and without communication, the measured share, and 2(N-1)/N x bytes / rate beside it."""
    rows = defaultdict(dict)
    with open(path) as f:
        for row in csv.DictReader(f):
            rows[row["model"], int(row["params"])][row["backend"]] = row
    lines = ["# step ms (median); comm share measured = comm_ms / step (ring) and 1 - step(none) / step(ring); "
             "predicted = t / (t + step(none)), t = 2(N-1)/N x gradient bytes / rate",
             f"{'model':>8} {'params':>10} {'grad MB':>8} {'step none':>10} {'step ring':>10} {'comm_ms':>9} "
             f"{'share':>6} {'1-none/ring':>11} {'pred ms':>8} {'pred share':>10}"]
    for (model, params), by in sorted(rows.items(), key=lambda kv: kv[0][1]):
        ring, none = by.get("ring"), by.get("none")
        if not ring or not none:
            continue
        nbytes = float(ring["comm_bytes"])
        step, base = float(ring["step_ms"]), float(none["step_ms"])
        pred = 2 * (world - 1) / world * nbytes * 8 / rate * 1e3 if rate else float("nan")
        lines.append(f"{model:>8} {params:>10} {nbytes / 1e6:8.1f} {base:10.1f} {step:10.1f} "
                     f"{float(ring['comm_ms']):9.1f} {float(ring['comm_fraction']):6.2f} {1 - base / step:11.2f} "
                     f"{pred:8.1f} {pred / (pred + base):10.2f}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--ranks-per-node", type=int, default=1)
    p.add_argument("--rate", default="1gbit", help="tc rate or none (default: 1gbit)")
    p.add_argument("--collective", default="allreduce", choices=COLLECTIVES)
    p.add_argument("--backends", default="", help=f"comma-separated backends (default: {DEFAULT_BACKENDS['allreduce']} "
                   f"for allreduce, {OTHERS_DEFAULT} for the others, raw for one npddp does not have)")
    p.add_argument("-b", "--minbytes", default="1K")
    p.add_argument("-e", "--maxbytes", default="64M")
    p.add_argument("-f", "--factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--budget", type=float, default=1.5)
    p.add_argument("--calls", type=int, default=1,
                   help="collectives back to back per timed iteration (benchmarks/collectives.py --calls): for small "
                        "sizes, where a barrier's skew outweighs the call (default 1)")
    p.add_argument("--out", default="cluster_study", help="directory of the sweeps' CSV files")
    p.add_argument("--summarize", default="", metavar="CSV", help="only print the summary of an existing sweep")
    p.add_argument("--ddp", action="store_true",
                   help="the DDP benchmark of the seed models (about 1 M, 5 M, 20 M parameters) instead of the sweep")
    args = p.parse_args(argv)
    if args.calls < 1:
        p.error(f"--calls must be >= 1, got {args.calls}")
    if not args.backends:
        args.backends = DEFAULT_BACKENDS.get(args.collective, OTHERS_DEFAULT if offered(args.collective) else "raw")
    rate = parse_rate(args.rate)
    world = args.nodes * args.ranks_per_node
    kind = "ddp" if args.ddp else {"allreduce": "ar"}.get(args.collective, args.collective)
    if args.summarize:
        path = Path(args.summarize)
    else:
        os.makedirs(args.out, exist_ok=True)
        calls = f"_calls{args.calls}" if args.calls > 1 and not args.ddp else ""
        path = Path(args.out) / f"{kind}_{args.nodes}x{args.ranks_per_node}_{args.rate}{calls}.csv"
        code = (run_ddp if args.ddp else run_sweep)(args, path)
        if code:
            return code
    print(f"# {args.nodes} nodes x {args.ranks_per_node} ranks, link {args.rate}; {path}")
    print("\n".join((summarize_ddp if args.ddp else summarize)(path, rate, world)))
    if not args.ddp:
        print("\n".join(fit_network(path, rate, world)))
        print("\n".join(fit_network(path, rate, world, FIT_FROM)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
