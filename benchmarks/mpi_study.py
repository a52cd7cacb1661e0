"""The active MPI's own all-reduce algorithms beside npddp's, on one node and across emulated nodes.

    python benchmarks/mpi_study.py --out docs/cluster_study/mpi --lock /tmp/cluster.lock     # every setting
    python benchmarks/mpi_study.py --out study --settings 1x2,2x1@1gbit                      # some of them
    python benchmarks/mpi_study.py --report docs/cluster_study/mpi --plots docs/img          # tables, fits, plots

One command per MPI (run it in each MPI's environment): for every setting of :data:`SETTINGS`
(one node with N = 2; 2 nodes x 1 rank at 1 Gbit/s; 4 x 1 and 2 x 2 at 10 Gbit/s), one
``benchmarks/mpi_algorithms.py`` run: ``mpi:default`` and npddp's algorithms interleaved in one
job (allreduce.py measures every backend at a size before the next size), then one job per
algorithm the library lets a user force; all of that twice (``--rounds 2``), the second time in
reverse order, each algorithm's iterations pooled over both, so a drifting load weighs alike. The
dump of each is ``<mpi>_<setting>.h5`` (and ``.csv``) in ``--out``; a setting's runs across nodes hold ``--lock`` (``flock``) one job at a time.
Across nodes the series steps by 8 from 1 KiB (to 32 MiB) and a second run of its own times 64 MiB
(``<mpi>_<setting>_tail.h5``; ``--tail-only`` runs just that), which the report merges in.

``--report DIR`` reads every dump there and prints, per setting, the table of in-place median
times (an algorithm per row, a size per column, the fastest at each size in bold), who wins per size (the best of
the MPI's own algorithms against npddp's best, and the ratio), the alpha-beta fit of each
algorithm (benchmarks/_costmodel.py: npddp's algorithms with their own steps and bytes, MPI's
with the ring's shape) and the load average its runs saw; ``--plots DIR`` draws one figure per
setting (benchmarks/_plots.py ``mpi_study``), a panel per MPI.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder, so `benchmarks` imports as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import importlib.util
import json
import re
import subprocess
from dataclasses import dataclass

from benchmarks import mpi_algorithms as ma
from benchmarks import results
from benchmarks.columns import RAW
from benchmarks._costmodel import fit_alpha_beta, modelled
from npddp.cluster.shaping import parse_rate

PROG = "mpi_study.py"
TAIL_SUFFIX = "_tail"
NPDDP = ("ring", "rd", "rabenseifner", "tree", "naive", "auto")
RAW_PREFIX = RAW + ":"   # raw:<algorithm>: MPI's forced algorithm in a bare mpi4py loop (mpi_algorithms.py)


@dataclass(frozen=True)
class Setting:
    """Where one sweep runs: ``nodes`` x ``ranks`` (one node: no emulated cluster), the link rate, the sizes."""

    name: str
    nodes: int
    ranks: int
    rate: str
    sizes: tuple
    tail: tuple = ()   # sizes of a second run beyond the series (merged into the setting's rows by the report)

    @property
    def backends(self) -> tuple:
        """npddp's algorithms for this setting: shm on one node, hier where a node holds more than one rank."""
        return NPDDP + (("shm",) if self.nodes == 1 else ()) + (("hier",) if self.ranks > 1 else ())

    @property
    def slug(self) -> str:
        """The setting in a file name: ``1x2``, ``2x1_1gbit``."""
        return self.name.replace("@", "_")

    @property
    def title(self) -> str:
        """The setting in words: ``one node, N = 2``, ``4 nodes x 1 rank, 10 Gbit/s links``."""
        if self.nodes == 1:
            return f"one node, N = {self.ranks}"
        gbits = parse_rate(self.rate) / 1e9
        return f"{self.nodes} nodes x {self.ranks} rank{'s' if self.ranks > 1 else ''}, {gbits:g} Gbit/s links"


#: The study's settings; across nodes the sizes step by 8 (1 KiB to 32 MiB) to keep every job short, and 64 MiB
#: comes from a run of its own (``tail``: ``<mpi>_<setting>_tail.h5``).
_TAIL = ("-b", "64M", "-e", "64M")
SETTINGS = (
    Setting("1x2", 1, 2, "", ("-b", "1K", "-e", "64M", "-f", "4")),
    Setting("2x1@1gbit", 2, 1, "1gbit", ("-b", "1K", "-e", "64M", "-f", "8"), _TAIL),
    Setting("4x1@10gbit", 4, 1, "10gbit", ("-b", "1K", "-e", "64M", "-f", "8"), _TAIL),
    Setting("2x2@10gbit", 2, 2, "10gbit", ("-b", "1K", "-e", "64M", "-f", "8"), _TAIL),
)
BY_NAME = {s.name: s for s in SETTINGS}


def family_slug(family: str) -> str:
    """A library family in a file name: ``mpich``, ``openmpi``, ``intelmpi``."""
    return family.lower().replace(" ", "")


def command(setting: Setting, out: Path, family: str, args, tail: bool = False) -> list:
    """The mpi_algorithms.py command of one setting (``tail``: of its run beyond the series)."""
    stem = out / f"{family_slug(family)}_{setting.slug}{TAIL_SUFFIX if tail else ''}"
    cmd = [sys.executable, str(Path(ma.__file__)), "--backends", ",".join(setting.backends),
           "--timeout", str(args.timeout), "--out", f"{stem}.h5", "--csv", f"{stem}.csv"]
    if setting.nodes == 1:
        cmd += ["-n", str(setting.ranks)]
    else:
        cmd += ["--cluster", f"{setting.nodes}x{setting.ranks}@{setting.rate}"]
        cmd += ["--lock", args.lock] if args.lock else []
    cmd += ["--algorithms", args.algorithms] if args.algorithms else []
    sizes = list(setting.tail if tail else setting.sizes)
    if args.maxbytes and not tail:
        sizes[sizes.index("-e") + 1] = args.maxbytes
    return cmd + ["--rounds", str(args.rounds), *sizes, "--iters", str(args.iters), "--budget", str(args.budget)]


def run(args) -> int:
    """Every chosen setting in turn; 0 when each mpi_algorithms.py run ended 0."""
    lib = ma.detect(ma.library_version())
    if lib is None:
        sys.stderr.write(f"{PROG}: error: the active MPI is not one mpi_algorithms.py knows\n")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    worst = 0
    for name in args.settings:
        setting = BY_NAME[name]
        parts = ([] if args.tail_only else [False]) + ([True] if setting.tail and not args.maxbytes else [])
        for tail in parts:
            cmd = command(setting, out, lib.family, args, tail)
            print("+", " ".join(cmd), flush=True)
            worst = max(worst, subprocess.call(cmd))
    return worst


# ----------------------------------------------------------------------------- the report

def load(directory: Path) -> dict:
    """{setting name: {MPI family: (rows, attributes)}} of every study dump in ``directory``; a setting's tail run
    (``<mpi>_<setting>_tail.h5``) adds its rows, and its jobs to the record of runs."""
    found = {}
    for setting in SETTINGS:
        for lib in ma.LIBRARIES:
            path = directory / f"{family_slug(lib.family)}_{setting.slug}.h5"
            if path.exists():
                rows, _, meta = ma.dump_rows(path)
                tail = path.with_name(f"{path.stem}{TAIL_SUFFIX}.h5")
                if tail.exists():
                    more, _, more_meta = ma.dump_rows(tail)
                    rows = rows + more
                    jobs = [json.loads(m.get("mpi_algorithms", "[]")) for m in (meta, more_meta)]
                    meta = {**meta, "mpi_algorithms": json.dumps(jobs[0] + jobs[1])}
                found.setdefault(setting.name, {})[lib.family] = (rows, meta)
    return found


def medians(rows: list[dict], column: str = "time_median_s") -> dict:
    """{(bytes, backend): in-place median seconds (or another time ``column``)} of a dump's rows."""
    return {(r["bytes"], r["backend"]): r[column] for r in rows if r["place"] == "inplace"}


def is_mpis(backend: str) -> bool:
    """MPI's own: an ``mpi:<algorithm>`` row (through npddp's mpi backend) or its bare loop ``raw:<algorithm>``."""
    return backend.startswith((ma.PREFIX, RAW_PREFIX))


def columns(times: dict) -> list:
    """The dump's backends: MPI's own (default first, each beside its bare loop), then npddp's, in the study's order."""
    names = list(dict.fromkeys(b for _, b in times))
    own = sorted((b for b in names if is_mpis(b)),
                 key=lambda b: (b.split(":", 1)[1] != ma.DEFAULT, b.split(":", 1)[1], b.startswith(RAW_PREFIX)))
    return own + [b for b in (*NPDDP, "shm", "hier") if b in names]


def label(name: str) -> str:
    """A row's name in a table: MPI's algorithm, ``(raw)`` for its bare loop, npddp's in italics."""
    if name.startswith(RAW_PREFIX):
        return f"{name.removeprefix(RAW_PREFIX)} (raw)"
    return name.removeprefix(ma.PREFIX) if name.startswith(ma.PREFIX) else f"*{name}*"


def cell(seconds: float) -> str:
    """Milliseconds with three significant digits."""
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 100 else f"{ms:.0f}"


def time_table(times: dict) -> list[str]:
    """Markdown: an algorithm per row (npddp's in italics), a size per column, in-place median ms, each size's best bold."""
    sizes = sorted({n for n, _ in times})
    best = {n: min(t for (m, _), t in times.items() if m == n) for n in sizes}
    lines = ["| algorithm | " + " | ".join(size_text(n) for n in sizes) + " |", "|---" * (len(sizes) + 1) + "|"]
    for name in columns(times):
        cells = [(f"**{cell(times[n, name])}**" if times[n, name] == best[n] else cell(times[n, name]))
                 if (n, name) in times else "-" for n in sizes]
        lines.append(f"| {label(name)} | " + " | ".join(cells) + " |")
    return lines


def size_text(nbytes: int) -> str:
    """1 KiB, 64 MiB."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def winners(times: dict, fast: dict | None = None) -> list[str]:
    """Markdown: per size the best of MPI's own and of npddp's, and MPI's best over npddp's best.

    ``fast``: the same for p10 times (the quick iterations: on a loaded machine the median is often the scheduler's).
    """
    def best(table, n):
        own = {b: t for (m, b), t in table.items() if m == n and is_mpis(b)}
        ours = {b: t for (m, b), t in table.items() if m == n and not is_mpis(b)}
        if not own or not ours:
            return None
        a, b = min(own, key=own.get), min(ours, key=ours.get)
        return a, own[a], b, ours[b]

    extra = " p10: MPI's best | npddp's best | MPI / npddp |" if fast else ""
    lines = ["| size | best of MPI's own | ms | best of npddp's | ms | MPI / npddp |" + extra,
             "|---|---|---|---|---|---|" + ("---|---|---|" if fast else "")]
    for n in sorted({n for n, _ in times}):
        found = best(times, n)
        if found is None:
            continue
        a, ta, b, tb = found
        line = f"| {size_text(n)} | {label(a)} | {cell(ta)} | {b} | {cell(tb)} | {ta / tb:.2f} |"
        quick = best(fast, n) if fast else None
        if quick:
            line += (f" {label(quick[0])} {cell(quick[1])} | {quick[2]} {cell(quick[3])} | "
                     f"{quick[1] / quick[3]:.2f} |")
        lines.append(line)
    return lines


def fit_each(times: dict, world: int) -> dict:
    """{algorithm: Fit} over its sizes: npddp's algorithms with their own steps and bytes, MPI's with the ring's."""
    out = {}
    for name in columns(times):
        pts = sorted((n, t) for (n, b), t in times.items() if b == name)
        if len({n for n, _ in pts}) >= 2 and world >= 2:
            out[name] = fit_alpha_beta([n for n, _ in pts], [t for _, t in pts], "allreduce", world,
                                       name if modelled(name) else "ring")
    return out


def fits(by_family: dict) -> list[str]:
    """Markdown: an algorithm per row, per MPI its alpha (us), bandwidth (Gbit/s) and relative rms error."""
    fitted = {family: fit_each(medians(rows), int(meta["world_size"])) for family, (rows, meta) in by_family.items()}
    names = list(dict.fromkeys(n for f in fitted.values() for n in f))
    names = [n for n in names if is_mpis(n)] + [n for n in names if not is_mpis(n)]
    lines = ["| algorithm | " + " | ".join(f"{f}: alpha us, Gbit/s, rms" for f in fitted) + " |",
             "|---" * (len(fitted) + 1) + "|"]
    for name in names:
        cells = []
        for family in fitted:
            fit = fitted[family].get(name)
            cells.append("" if fit is None else
                         f"{fit.alpha * 1e6:.0f}, {fit.bandwidth * 8 / 1e9:.3g}, {fit.rel_rms:.2f}")
        lines.append(f"| {label(name)} | " + " | ".join(cells) + " |")
    return lines


def short_name(meta: dict, family: str) -> str:
    """``MPICH 5.0.2``, ``Open MPI 5.0.11``, ``Intel MPI 2021.18.1``: the family and the first version number."""
    found = re.search(r"\d+(?:\.\d+)+", str(meta.get("mpi_library", "")))
    return f"{family} {found.group(0)}" if found else family


def loads(meta: dict) -> tuple[float, float]:
    """(lowest, highest) load average before or after any run of a dump."""
    values = [v for r in json.loads(meta.get("mpi_algorithms", "[]")) for v in r.get("load_average", [])]
    return (min(values), max(values)) if values else (float("nan"), float("nan"))


def unmoved(meta: dict) -> tuple[list[str], list[str]]:
    """The forced algorithms whose times never left mpi:default's p10-p90 range, and each status not ok (once)."""
    record = json.loads(meta.get("mpi_algorithms", "[]"))
    honoured = {}   # backend -> True once any of its runs moved (a tail run's record joins the series')
    for r in record:
        honoured[r["backend"]] = honoured.get(r["backend"], False) or r.get("honoured") is not False
    return ([b.removeprefix(ma.PREFIX) for b, moved in honoured.items() if not moved and b != ma.PREFIX + ma.DEFAULT],
            list(dict.fromkeys(f"{r['backend'].removeprefix(ma.PREFIX)} ({r['status']})"
                               for r in record if r["status"] != "ok")))   # a tail run repeats a skip: name it once


def report(directory: Path, plots: str) -> int:
    """Print every setting's tables; draw its figure when ``plots`` names a folder."""
    found = load(directory)
    if not found:
        sys.stderr.write(f"{PROG}: error: no study dumps (<mpi>_<setting>.h5) in {directory}\n")
        return 2
    for setting in SETTINGS:
        by_family = found.get(setting.name)
        if not by_family:
            continue
        print(f"\n## {setting.title}\n")
        for family, (rows, meta) in by_family.items():
            times, (lo, hi) = medians(rows), loads(meta)
            same, failed = unmoved(meta)
            print(f"### {short_name(meta, family)}: load average {lo:.1f}-{hi:.1f}\n")
            print("\n".join(time_table(times)), "", "\n".join(winners(times, medians(rows, "time_p10_s"))), "",
                  sep="\n")
            print(f"not moved at any size: {', '.join(same) or 'none'}; not ok: {', '.join(failed) or 'none'}\n")
        print("### alpha-beta fits (npddp's algorithms with their own steps and bytes, MPI's with the ring's)\n")
        print("\n".join(fits(by_family)), "\n")
        if plots and importlib.util.find_spec("matplotlib") is None:
            print("# no plots: matplotlib is not installed (pip install matplotlib)")
        elif plots:
            from benchmarks import _plots
            Path(plots).mkdir(parents=True, exist_ok=True)
            frames = {short_name(meta, family): (medians(rows), meta) for family, (rows, meta) in by_family.items()}
            path = Path(plots) / f"mpi_study_{setting.slug}.png"
            _plots.mpi_study(frames, setting.title, ma.PREFIX).savefig(path, dpi=80)
            print(f"# wrote {path}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="mpi_study", help="folder of the dumps (default mpi_study)")
    p.add_argument("--settings", default=",".join(BY_NAME),
                   help=f"comma-separated settings (default all: {', '.join(BY_NAME)})")
    p.add_argument("--lock", default="", metavar="FILE", help="flock FILE around each job across emulated nodes")
    p.add_argument("--rounds", type=int, default=2, help="jobs per algorithm, ABBA order, iterations pooled "
                                                         "(mpi_algorithms.py --rounds; default 2)")
    p.add_argument("--iters", type=int, default=10,
                   help="timed iterations per size and round, cut to --budget (default 10)")
    p.add_argument("--budget", type=float, default=0.2,
                   help="seconds per size, backend, place and round (default 0.2)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each job may take (default 600)")
    p.add_argument("--algorithms", default="", help="only these forced algorithms (mpi_algorithms.py --algorithms)")
    p.add_argument("--maxbytes", default="", help="largest size instead of the setting's (a quick look; no tail run)")
    p.add_argument("--tail-only", action="store_true",
                   help="run only the settings' tail sizes (64 MiB across nodes) into <mpi>_<setting>_tail.h5")
    p.add_argument("--report", default="", metavar="DIR", help="print the tables of the dumps in DIR instead")
    p.add_argument("--plots", default="", metavar="DIR", help="with --report: draw one PNG per setting into DIR")
    args = p.parse_args(argv)
    if args.report:
        return report(Path(args.report), args.plots)
    args.settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    bad = [s for s in args.settings if s not in BY_NAME]
    if bad or not args.settings:
        p.error(f"--settings: {bad[0] if bad else args.settings!r} is not one of {', '.join(BY_NAME)}")
    if args.iters < 1 or args.rounds < 1 or not args.budget > 0:
        p.error(f"--iters and --rounds must be >= 1 and --budget > 0, got {args.iters}, {args.rounds} and "
                f"{args.budget}")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
