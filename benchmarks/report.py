"""Tables and PNG plots from npddp benchmark dumps, an alpha-beta fit, and DDP projections.

Usage::

    python benchmarks/report.py ar.h5
    python benchmarks/report.py ar.h5 ddp.h5 scaling.h5 --outdir plots
    python benchmarks/report.py ar.h5 --compute-ms 250 --compute-params 25M --model-params 1M,25M,100M,350M

Each dump is read according to its root attribute ``kind``:

* ``allreduce_sweep`` (benchmarks/allreduce.py; layout in its docstring): a table per
  backend and place, ``<stem>_busbw.png`` (bus bandwidth vs size, log x) and
  ``<stem>_ratio.png`` (median time over the ``--baseline`` backend's, vs size), and an
  alpha-beta fit per backend and place: ``time = steps*alpha + fraction*bytes/beta`` with
  the ring's steps and fraction (all-reduce on N ranks: 2(N-1) and 2(N-1)/N), least squares
  on the relative error over the sweep's median times.
* ``ddp_breakdown``: the rows as a table and ``<stem>_breakdown.png``, a stacked bar per row
  (forward, backward, exposed comm, optimizer; compute and exposed comm when the split is
  not recorded).
* ``weak_scaling``: the rows and ``<stem>_efficiency.png``, efficiency vs world size.

Contract for the DDP dumps (``ddp_breakdown``, ``weak_scaling``): root attributes ``kind``,
``schema_version`` and the run environment (npddp.runinfo); a group ``/rows`` holding one
1-D dataset per column, all of one length (one entry per row), numbers as int64/float64 and
strings as fixed-length bytes (``S`` dtype, UTF-8). Times are per training step, in ms.

=================  ========  ==================================================================
ddp_breakdown      type      meaning
=================  ========  ==================================================================
model_size         str       model label, e.g. "small"
params             int       trainable parameters
sync               str       per_param, flat, bucketed or overlap
backend            str       communicator backend
bucket_mb          float     bucket cap in MiB (0 where not bucketed)
total_time_ms      float     wall time of a step
compute_time_ms    float     forward + backward + optimizer, excluding waits on communication
comm_time_ms       float     exposed communication: time the step waits on it
comm_fraction      float     comm_time_ms / total_time_ms
num_comm_ops       int       all-reduce calls per step
samples_per_s      float     global throughput
forward_time_ms,   float     optional split of compute_time_ms; when all three are present the
backward_time_ms,            bars show them instead of one compute segment
optimizer_time_ms
=================  ========  ==================================================================

``weak_scaling`` columns: ``world_size`` (int), ``samples_per_s`` (float, global),
``efficiency`` (float: samples_per_s / (world_size * samples_per_s at one rank)); optional
string columns ``model_size``, ``backend``, ``sync`` give one line per distinct combination.

Projection (printed after the dumps): DDP's gradient all-reduce per step for each model
size (float32 gradients in ``--bucket-mb`` buckets) and world size on three networks with
typical published latency and bandwidth (10 GbE: 50 us, 1.25 GB/s; 100 GbE: 10 us,
12.5 GB/s; InfiniBand HDR: 1.5 us, 25 GB/s: assumptions, not measurements; the alpha and beta
fitted on this machine are printed beside them). Compute per step scales linearly with
parameters: the rate comes from the largest model of the first ``ddp_breakdown`` dump, else
from ``--compute-ms`` for a model of ``--compute-params`` (default 100 ms at 25M parameters).
Overhead = comm / (comm + compute) without overlap; with perfect overlap a step takes
max(comm, compute); efficiency = compute / step time.

A missing, corrupt or foreign file is a one-line error and exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _common as bc  # noqa: E402
from npddp import runinfo  # noqa: E402

PROG = "report.py"
KINDS = ("allreduce_sweep", "ddp_breakdown", "weak_scaling")
SWEEP_DATASETS = ("bytes", "count", "iters", "time_s", "time_median_s", "busbw_GBps", "algbw_GBps", "wrong")
BREAKDOWN_COLUMNS = ("model_size", "params", "sync", "backend", "bucket_mb", "total_time_ms", "compute_time_ms",
                     "comm_time_ms", "comm_fraction", "num_comm_ops", "samples_per_s")
SPLIT_COLUMNS = ("forward_time_ms", "backward_time_ms", "optimizer_time_ms")
SCALING_COLUMNS = ("world_size", "samples_per_s", "efficiency")
SCALING_KEYS = ("model_size", "backend", "sync")


class DumpError(Exception):
    """A dump that cannot be read: the message names the file and the reason."""


@dataclass
class Dump:
    """One file's kind, root attributes and data (groups of arrays, or rows of columns)."""

    path: Path
    kind: str
    attrs: dict
    groups: dict = field(default_factory=dict)   # allreduce_sweep: (backend, place) -> {name: array}
    rows: dict = field(default_factory=dict)     # DDP kinds: column -> (n_rows,) array (str as str)


# ----------------------------------------------------------------------------- reading

def load(path) -> Dump:
    """Read a dump; DumpError with a one-line reason if it is missing, corrupt or foreign."""
    import h5py

    path = Path(path)
    if not path.exists():
        raise DumpError(f"{path}: no such file")
    if not path.is_file():
        raise DumpError(f"{path}: not a regular file")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise DumpError(f"{path}: not a readable HDF5 file ({_first_line(e)})") from None
    label = "dump"
    try:
        with f:
            attrs = runinfo.read_attrs(f)
            kind = attrs.get("kind")
            if kind is None:
                raise DumpError(f"{path}: no 'kind' attribute; not an npddp benchmark dump")
            if kind not in KINDS:
                raise DumpError(f"{path}: unknown kind {kind!r}; this report reads {', '.join(KINDS)}")
            label = kind
            version = attrs.get("schema_version")
            if not isinstance(version, int) or not 1 <= version <= runinfo.SCHEMA_VERSION:
                raise DumpError(f"{path}: schema_version {version!r} is not one this report reads "
                                f"(1..{runinfo.SCHEMA_VERSION})")
            dump = Dump(path, kind, attrs)
            if kind == "allreduce_sweep":
                _read_sweep(f, dump)
            else:
                _read_rows(f, dump, BREAKDOWN_COLUMNS if kind == "ddp_breakdown" else SCALING_COLUMNS)
            return dump
    except DumpError:
        raise
    except (OSError, KeyError, ValueError, TypeError, IndexError) as e:
        raise DumpError(f"{path}: malformed {label} ({_first_line(e)})") from None


def _first_line(e: BaseException) -> str:
    """The first line of an exception's message, or its type name."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _read_sweep(f, dump: Dump) -> None:
    """Fill ``dump.groups`` from /<backend>/<place> groups; check shapes agree."""
    for backend in _names(dump.attrs.get("backends")) or list(f):
        for place in _names(dump.attrs.get("places")) or list(f[backend]):
            g = f[backend][place]
            data = {name: g[name][()] for name in SWEEP_DATASETS}
            n = data["bytes"].shape
            if len(n) != 1 or any(data[k].shape[:1] != n for k in SWEEP_DATASETS):
                raise DumpError(f"{dump.path}: /{backend}/{place} datasets disagree on the number of sizes")
            data["busbw_factor"] = float(g.attrs["busbw_factor"])
            dump.groups[(str(backend), str(place))] = data
    if not dump.groups:
        raise DumpError(f"{dump.path}: allreduce_sweep with no backend groups")


def _names(value) -> list:
    """A list of names from a string-array attribute (or a comma-joined string); [] when absent."""
    if value is None:
        return []
    return [v for v in value.split(",") if v] if isinstance(value, str) else [str(v) for v in value]


def _read_rows(f, dump: Dump, required) -> None:
    """Fill ``dump.rows`` from the 1-D datasets of /rows (bytes decoded to str)."""
    rows = f["rows"]
    missing = [c for c in required if c not in rows]
    if missing:
        raise DumpError(f"{dump.path}: {dump.kind} /rows lacks column(s) {', '.join(missing)}")
    known = list(required) + [c for c in SPLIT_COLUMNS if c in rows]
    order = known + sorted(set(rows) - set(known))
    for name in order:  # the contract's column order, then any extra columns
        values = rows[name][()]
        if values.dtype.kind in "SO":
            values = np.array([v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values], dtype=object)
        dump.rows[name] = values
    lengths = {v.shape for v in dump.rows.values()}
    if len(lengths) != 1 or len(next(iter(lengths))) != 1:
        raise DumpError(f"{dump.path}: /rows columns must be 1-D and of one length, got shapes {sorted(lengths)}")


# ----------------------------------------------------------------------------- analysis

def sweep_fits(dump: Dump) -> dict:
    """(backend, place) -> Fit over the sweep's median times; groups that cannot be fitted are left out."""
    n = int(dump.attrs.get("world_size", 1))
    fits = {}
    for key, g in dump.groups.items():
        try:
            fits[key] = bc.fit_alpha_beta(g["bytes"], g["time_median_s"], dump.attrs["collective"], n)
        except ValueError:
            continue
    return fits


def compute_rate(dumps, compute_ms: float, compute_params: int) -> tuple[float, str]:
    """(seconds of compute per step per parameter, where it came from)."""
    for d in dumps:
        if d.kind != "ddp_breakdown":
            continue
        params = d.rows["params"].astype(np.float64)
        ms = d.rows["compute_time_ms"].astype(np.float64)
        ok = (params > 0) & (ms > 0)
        if ok.any():
            biggest = ok & (params == params[ok].max())
            rate = float(np.median(ms[biggest] / params[biggest])) / 1e3
            return rate, f"measured in {d.path.name}: {bc.format_count(int(params[ok].max()))}-parameter model"
    source = f"--compute-ms {compute_ms:g} at --compute-params {bc.format_count(compute_params)}"
    return compute_ms / 1e3 / compute_params, source


# ----------------------------------------------------------------------------- tables

def sweep_table(dump: Dump, fits: dict) -> str:
    """Median time and bus bandwidth per size for every group, then the alpha-beta fits."""
    a = dump.attrs
    keys = list(dump.groups)
    lines = [f"== {dump.path}: {a.get('collective')} sweep, {a.get('world_size')} ranks, {a.get('dtype')}, "
             f"op {a.get('op')}; {a.get('mpi_library', '?')} on {a.get('host', '?')}",
             f"{'size':>9}" + "".join(f" {b + ' ' + p:>24}" for b, p in keys),
             f"{'':>9}" + "".join(f" {'time(us)':>11} {'busbw(GB/s)':>12}" for _ in keys)]
    first = dump.groups[keys[0]]
    for s, nbytes in enumerate(first["bytes"]):
        row = f"{bc.format_size(int(nbytes)):>9}"
        for k in keys:
            g = dump.groups[k]
            row += f" {g['time_median_s'][s] * 1e6:>11.1f} {g['busbw_GBps'][s]:>12.3f}"
        lines.append(row)
    wrong = sum(int(g["wrong"].sum()) for g in dump.groups.values())
    lines.append(f"#wrong total: {wrong}")
    lines.append(f"alpha-beta fit (ring model: {bc.ring_steps(a['collective'], max(2, int(a['world_size'])))} "
                 "steps x alpha + busbw-factor x bytes / beta; weighted to relative error)")
    lines.append(f"{'backend':>10} {'place':>11} {'alpha(us)':>10} {'beta(GB/s)':>11} {'rel.rms':>8}")
    for (b, p), fit in fits.items():
        lines.append(f"{b:>10} {p:>11} {fit.alpha * 1e6:>10.2f} {fit.beta / bc.GB:>11.3f} {fit.rel_rms:>8.1%}")
    if not fits:
        lines.append("  (no fit: needs world size >= 2 and two sizes or more)")
    return "\n".join(lines)


def rows_table(dump: Dump) -> str:
    """All columns of a DDP dump, one line per row."""
    cols = list(dump.rows)
    cells = [[_cell(dump.rows[c][i]) for c in cols] for i in range(len(dump.rows[cols[0]]))]
    widths = [max([len(c)] + [len(r[j]) for r in cells]) for j, c in enumerate(cols)]
    lines = [f"== {dump.path}: {dump.kind}, {len(cells)} rows",
             " ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += [" ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def _cell(value) -> str:
    """A table cell: ints plain, floats to 4 significant digits (whole numbers from 10000)."""
    if isinstance(value, (float, np.floating)):
        return f"{value:.0f}" if abs(value) >= 1e4 else f"{value:.4g}"
    return str(value)


def projection_table(projections, rate: float, source: str, fits_by_file: dict, bucket_bytes: int) -> str:
    """Network assumptions (with the locally fitted alpha/beta beside them) and the projected rows."""
    lines = ["== DDP projection: ring all-reduce of float32 gradients per step in "
             f"{bucket_bytes / (1 << 20):g} MiB buckets",
             f"compute: {rate * 1e9:.3f} ms per step per 1M parameters ({source})",
             f"{'network':>34} {'alpha(us)':>10} {'beta(GB/s)':>11}  source"]
    for net in bc.NETWORKS:
        lines.append(f"{net.name:>34} {net.alpha * 1e6:>10.1f} {net.beta / bc.GB:>11.2f}"
                     "  assumed: typical published figure")
    for name, fits in fits_by_file.items():
        for (b, p), fit in fits.items():
            lines.append(f"{'local ' + b + ' ' + p:>34} {fit.alpha * 1e6:>10.2f} {fit.beta / bc.GB:>11.2f}"
                         f"  fitted on this machine ({name})")
    lines.append("serial: communication after compute (no overlap); overlap: perfectly hidden behind compute")
    lines.append(f"{'network':>16} {'params':>7} {'N':>5} {'buckets':>7} {'comm(ms)':>10} {'compute(ms)':>11} "
                 f"{'overhead.serial':>15} {'eff.serial':>10} {'overhead.overlap':>16} {'eff.overlap':>11}")
    previous = None
    for p in projections:
        if previous is not None and p.network != previous:
            lines.append("")
        previous = p.network
        lines.append(f"{p.network:>16} {bc.format_count(p.params):>7} {p.n:>5} {p.buckets:>7} {p.comm * 1e3:>10.2f} "
                     f"{p.compute * 1e3:>11.2f} {p.overhead_serial:>15.1%} {p.efficiency_serial:>10.2f} "
                     f"{p.overhead_overlap:>16.1%} {p.efficiency_overlap:>11.2f}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- plots

def _pyplot():
    """matplotlib.pyplot on the Agg backend, or None when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _size_axis(ax) -> None:
    """Log-2 x axis labelled with binary sizes."""
    from matplotlib.ticker import FuncFormatter
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: bc.format_size(int(round(x))) if x >= 1 else ""))
    ax.set_xlabel("message size (bytes)")
    ax.grid(True, which="major", alpha=0.3)


def plot_sweep(plt, dump: Dump, outdir: Path, baseline: str) -> list[Path]:
    """busbw vs size, and time ratio to ``baseline`` vs size."""
    a, stem, written = dump.attrs, dump.path.stem, []
    title = f"{a.get('collective')} on {a.get('world_size')} ranks, {a.get('dtype')}"
    fig, ax = plt.subplots(figsize=(8, 5))
    for (b, p), g in dump.groups.items():
        ax.plot(g["bytes"], g["busbw_GBps"], marker="o", ms=3, ls="-" if p == "inplace" else "--", label=f"{b} {p}")
    _size_axis(ax)
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title)
    ax.legend()
    written.append(_save(fig, plt, outdir / f"{stem}_busbw.png"))
    base = {p: g for (b, p), g in dump.groups.items() if b == baseline}
    others = [(b, p, g) for (b, p), g in dump.groups.items() if b != baseline and p in base]
    if others:
        fig, ax = plt.subplots(figsize=(8, 5))
        for b, p, g in others:
            ax.plot(g["bytes"], g["time_median_s"] / base[p]["time_median_s"], marker="o", ms=3,
                    ls="-" if p == "inplace" else "--", label=f"{b}/{baseline} {p}")
        ax.axhline(1.0, color="gray", lw=1)
        _size_axis(ax)
        ax.set_ylabel(f"median time / {baseline} median time")
        ax.set_title(title)
        ax.legend()
        written.append(_save(fig, plt, outdir / f"{stem}_ratio.png"))
    return written


def plot_breakdown(plt, dump: Dump, outdir: Path) -> list[Path]:
    """Stacked horizontal bar of the step time per row."""
    r = dump.rows
    split = all(c in r for c in SPLIT_COLUMNS)
    parts = ([("forward", r["forward_time_ms"]), ("backward", r["backward_time_ms"]),
              ("exposed comm", r["comm_time_ms"]), ("optimizer", r["optimizer_time_ms"])] if split
             else [("compute", r["compute_time_ms"]), ("exposed comm", r["comm_time_ms"])])
    labels = [f"{m} {s} {b}" + (f" {mb:g}MiB" if mb else "")
              for m, s, b, mb in zip(r["model_size"], r["sync"], r["backend"], r["bucket_mb"])]
    fig, ax = plt.subplots(figsize=(9, 1.5 + 0.4 * len(labels)))
    left = np.zeros(len(labels))
    for name, values in parts:
        values = np.asarray(values, dtype=np.float64)
        ax.barh(labels, values, left=left, label=name)
        left += values
    ax.invert_yaxis()
    ax.set_xlabel("time per step (ms)")
    ax.set_title(f"DDP step breakdown, {dump.attrs.get('world_size', '?')} ranks")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return [_save(fig, plt, outdir / f"{dump.path.stem}_breakdown.png")]


def plot_scaling(plt, dump: Dump, outdir: Path) -> list[Path]:
    """Efficiency vs world size, one line per (model_size, backend, sync) present."""
    r = dump.rows
    keys = [k for k in SCALING_KEYS if k in r]
    combos = sorted({tuple(r[k][i] for k in keys) for i in range(len(r["world_size"]))})
    fig, ax = plt.subplots(figsize=(7, 5))
    for combo in combos:
        mask = np.array([tuple(r[k][i] for k in keys) == combo for i in range(len(r["world_size"]))])
        order = np.argsort(r["world_size"][mask])
        ax.plot(r["world_size"][mask][order], r["efficiency"][mask][order], marker="o",
                label=" ".join(map(str, combo)) or "efficiency")
    ax.axhline(1.0, color="gray", lw=1)
    ax.set_xscale("log", base=2)
    ns = sorted({int(n) for n in r["world_size"]})
    ax.set_xticks(ns, labels=[str(n) for n in ns])
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("weak-scaling efficiency")
    ax.set_ylim(0, 1.1)
    ax.legend()
    return [_save(fig, plt, outdir / f"{dump.path.stem}_efficiency.png")]


def plot_projection(plt, projections, outdir: Path) -> list[Path]:
    """Projected efficiency vs world size, one panel per network, one line per model size."""
    nets = list(dict.fromkeys(p.network for p in projections))
    fig, axes = plt.subplots(1, len(nets), figsize=(5 * len(nets), 4.5), squeeze=False, sharey=True)
    for ax, net in zip(axes[0], nets):
        rows = [p for p in projections if p.network == net]
        for params in dict.fromkeys(p.params for p in rows):
            sel = [p for p in rows if p.params == params]
            line, = ax.plot([p.n for p in sel], [p.efficiency_serial for p in sel], marker="o",
                            label=f"{bc.format_count(params)} params")
            ax.plot([p.n for p in sel], [p.efficiency_overlap for p in sel], ls="--", color=line.get_color())
        ax.set_xscale("log", base=2)
        ns = sorted({p.n for p in rows})
        ax.set_xticks(ns, labels=[str(n) for n in ns])
        ax.set_title(f"{net} (dashed: perfect overlap)")
        ax.set_xlabel("world size (ranks)")
        ax.set_ylim(0, 1.05)
    axes[0][0].set_ylabel("projected scaling efficiency")
    axes[0][0].legend()
    return [_save(fig, plt, outdir / "projection.png")]


def _save(fig, plt, path: Path) -> Path:
    """Save and close a figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- CLI

def _list(parse):
    """argparse type: a comma-separated list of values parsed by ``parse``."""
    def convert(text: str):
        try:
            values = [parse(t) for t in text.split(",") if t.strip()]
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of positive values, got {text!r}")
        return values
    return convert


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser."""
    p = argparse.ArgumentParser(prog=PROG, description="Tables and plots from npddp benchmark dumps.")
    p.add_argument("dumps", nargs="+", help="HDF5 dumps (allreduce_sweep, ddp_breakdown, weak_scaling)")
    p.add_argument("--outdir", default=".", help="directory for the PNG files (created; default .)")
    p.add_argument("--no-plots", action="store_true", help="print tables only")
    p.add_argument("--baseline", default="mpi", help="backend the time ratios divide by (default mpi)")
    p.add_argument("--compute-ms", type=float, default=100.0,
                   help="compute time per step of a --compute-params model when no ddp_breakdown dump is given "
                        "(default 100)")
    p.add_argument("--compute-params", type=bc.parse_count, default=25_000_000, help="(default 25M)")
    p.add_argument("--model-params", type=_list(bc.parse_count), default=[10**6, 25 * 10**6, 10**8, 35 * 10**7],
                   help="model sizes to project (default 1M,25M,100M,350M)")
    p.add_argument("--world-sizes", type=_list(int), default=[2, 8, 64, 256, 1024],
                   help="world sizes to project (default 2,8,64,256,1024)")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket cap in MiB (default 25)")
    return p


def main(argv=None) -> int:
    """Print the report and write plots; 2 on an unreadable dump."""
    args = build_parser().parse_args(argv)
    if not (args.compute_ms > 0 and args.bucket_mb > 0):
        print(f"{PROG}: error: --compute-ms and --bucket-mb must be > 0", file=sys.stderr)
        return 2
    try:
        dumps = [load(p) for p in args.dumps]
    except DumpError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    plt = None if args.no_plots else _pyplot()
    outdir = Path(args.outdir)
    if plt is not None:
        outdir.mkdir(parents=True, exist_ok=True)
    elif not args.no_plots:
        print(f"{PROG}: matplotlib is not installed; skipping plots", file=sys.stderr)
    written, fits_by_file = [], {}
    for d in dumps:
        if d.kind == "allreduce_sweep":
            fits = sweep_fits(d)
            fits_by_file[str(d.path)] = fits
            print(sweep_table(d, fits), end="\n\n")
            written += plot_sweep(plt, d, outdir, args.baseline) if plt else []
        else:
            print(rows_table(d), end="\n\n")
            if plt:
                written += plot_breakdown(plt, d, outdir) if d.kind == "ddp_breakdown" else plot_scaling(plt, d, outdir)
    rate, source = compute_rate(dumps, args.compute_ms, args.compute_params)
    bucket_bytes = max(1, int(args.bucket_mb * (1 << 20)))
    projections = bc.project_ddp(args.model_params, args.world_sizes, rate, bucket_bytes=bucket_bytes)
    print(projection_table(projections, rate, source, fits_by_file, bucket_bytes))
    if plt:
        written += plot_projection(plt, projections, outdir)
        print("\nwrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
