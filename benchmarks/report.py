"""Tables and plots from npddp benchmark dumps, an alpha-beta fit, and DDP projections.

Usage::

    python benchmarks/report.py ar.h5
    python benchmarks/report.py ar.h5 ddp.h5 scaling.h5 --outdir plots --format png,svg
    python -m benchmarks.report ar.h5 --compute-ms 250 --compute-params 25M --model-params 1M,25M,100M,350M

First every dump is checked against its kind's declaration (npddp/columns.py): any violation
(a missing attribute or column, a wrong type or unit, NaN or non-positive times, ...) prints
one line naming the file, the field and what was expected, and the report exits 2 before it
prints or draws anything. The tables are then read with ``benchmarks.results.read_table`` and
printed with pandas; per kind:

* ``allreduce_sweep`` (benchmarks/collectives.py, any collective): bus bandwidth and median time per size and
  series, the time ratio to ``--baseline`` (default ``raw``, the bare mpi4py row, else ``mpi``), and an alpha-beta fit per series (``time = steps
  x alpha + fraction x bytes / bandwidth`` with the algorithm's own steps and fraction when it has
  a cost model, the ring's otherwise: benchmarks/_costmodel.py); plots ``<stem>_busbw`` (bus
  bandwidth vs size with p10-p90 bands) and ``<stem>_ratio`` (time / baseline's, 1.0 line).
  A sweep of MPI's own algorithms (benchmarks/mpi_algorithms.py: backends ``mpi:<algorithm>``)
  joins the first other sweep of its collective, world size, dtype and op (stem ``<a>+<b>``);
  alone, its ratios divide by ``mpi:default`` when ``--baseline mpi`` is not in it.
  Sweeps of two or more collectives (benchmarks/collectives.py ``--collective``) also get one table
  over them all: per collective and size, MPI's own call (``--baseline``) beside npddp's fastest backend.
* ``ddp_breakdown`` (benchmarks/ddp.py): the rows; plot ``<stem>_breakdown`` (per model,
  each step split into forward / backward / comm issued inside backward / exposed comm /
  optimizer as % of the step, ms on the bars, DDP efficiency at the end).
* ``weak_scaling`` (benchmarks/ddp.py --weak-scaling): median, min and max efficiency over
  repeats per world size; plot ``<stem>_efficiency`` with error bars, the no-comm ceiling and
  a warning where repeats spread by more than 20%.
* ``torch_compare`` (benchmarks/compare_torch.py): the rows.
* ``parallelism`` (benchmarks/parallelism.py): the rows, then every such dump (one node, emulated
  clusters) side by side: step, exposed communication, bytes per rank handed / sent / on the
  links, bubble beside (K-1)/(M+K-1), peak memory; plot ``parallelism`` (benchmarks/_parallelism_plot.py).
* a ``.json`` trace (``--trace``, docs/guide/traces.md): per step and rank backward, hidden and
  exposed communication, each all-reduce's slowest rank; plot ``<stem>_timeline`` (one step
  of every rank: benchmarks/_timeline.py; ``--trace-step`` picks the step). A split model's trace
  (``--tp``/``--pp``) gets per step and rank its stage, forward, backward, communication and idle
  time, and the measured idle share beside (K-1)/(M+K-1), its picture each micro-batch's F/B.

Projection (printed last; plot ``projection``): DDP's gradient all-reduce per step for each
model size (float32 gradients in ``--bucket-mb`` buckets), world size and algorithm (those of
the sweeps given, else every algorithm with a cost model) on three networks with typical
published latency and bandwidth (10 GbE: 50 us, 1.25 GB/s; 100 GbE: 10 us, 12.5 GB/s;
InfiniBand HDR: 1.5 us, 25 GB/s: assumptions, not measurements; the alpha and bandwidth fitted here
are printed beside them). Compute per step scales linearly with parameters: the rate comes
from the largest model of the first ``ddp_breakdown`` dump, else from ``--compute-ms`` for a
model of ``--compute-params``. Efficiency = compute / (compute + comm) without overlap (the
plot), compute / max(compute, comm) with perfect overlap (the table).

Needs pandas; plots need matplotlib (without it the tables are printed and a note says so).
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder, so `benchmarks` imports as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse

import numpy as np

from benchmarks import results

from benchmarks import _common as bc
from benchmarks.columns import RAW
from benchmarks import _costmodel as cm
from benchmarks import _timeline
from npddp.parallel.ddp import BUCKET_CAP_MB

PROG = "report.py"
#: How benchmarks/mpi_algorithms.py names MPI's own algorithms in the backend column: ``mpi:<algorithm>``.
MPI_ALGORITHM = "mpi:"
FORMATS = ("png", "svg")
EXIT_BAD = 2


# ----------------------------------------------------------------------------- tables

def _label(row) -> str:
    """A sweep series name: backend[/transport] place."""
    name = row["backend"] + ("" if row["transport"] == bc.DEFAULT_TRANSPORT else "/" + row["transport"])
    return f"{name} {row['place']}" + ("" if row["buffers"] == "shared" else " private")


def _with_series(df):
    """The sweep table with a 'series' column and a short 'size' label."""
    df = df.copy()
    df["series"] = [_label(r) for _, r in df.iterrows()]
    df["size"] = [bc.format_size(int(b)) for b in df["bytes"]]
    return df


def sweep_tables(df, meta: dict, baseline: str) -> str:
    """Bus bandwidth and median time per size and series, time ratios to ``baseline``, #wrong."""
    df = _with_series(df)
    order = list(dict.fromkeys(df["series"]))
    sizes = list(dict.fromkeys(df["size"]))

    def pivot(values):
        return df.pivot_table(index="size", columns="series", values=values, sort=False).reindex(
            index=sizes, columns=order)
    parts = [f"== {meta['collective']} sweep, {meta['world_size']} ranks, {meta['dtype']}, op {meta['op']}; "
             f"{meta.get('mpi_library', '?')} on {meta.get('host', '?')}, {meta.get('time_utc', '?')}",
             "bus bandwidth (GB/s):", pivot("busbw_GBps").to_string(float_format="{:.3f}".format),
             "median time (us):", (pivot("time_median_s") * 1e6).to_string(float_format="{:.1f}".format)]
    base = df[df["backend"] == baseline].set_index(["place", "buffers", "bytes"])["time_median_s"]
    others = df[df["backend"] != baseline]
    if len(base) and len(others):
        others = others.assign(ratio=others["time_median_s"].to_numpy() / base.reindex(
            list(zip(others["place"], others["buffers"], others["bytes"]))).to_numpy())
        table = others.pivot_table(index="size", columns="series", values="ratio", sort=False)
        parts += [f"median time / {baseline}'s (> 1: slower):",
                  table.reindex(index=sizes, columns=list(dict.fromkeys(others["series"]))).to_string(
                      float_format="{:.2f}".format)]
    picking = df[df["algorithm"] != df["backend"]]
    if len(picking):
        parts += ["algorithm each backend that picks per call ran:",
                  picking.pivot_table(index="size", columns="series", values="algorithm", aggfunc="first",
                                      sort=False).reindex(index=sizes).to_string()]
    parts.append(f"#wrong total: {int(df['wrong'].sum())}")
    return "\n".join(parts)


def collectives_table(dumps, baseline: str = RAW) -> str:
    """One table over every collective's sweep: per collective and size, MPI's median time (``baseline``, else
    ``mpi``), npddp's fastest backend and its time, and their ratio (> 1: npddp slower); "" with fewer than two."""
    import pandas as pd

    lines = []
    for _, meta, df in dumps:
        if meta["kind"] != "allreduce_sweep":
            continue
        base_name = resolve_baseline(df, baseline)
        mpi_side = df["backend"].astype(str).str.startswith((RAW, "mpi")) | (df["backend"] == "gloo")
        for (place, nbytes), part in df.groupby(["place", "bytes"], sort=False):
            base = part[part["backend"] == base_name]["time_median_s"]
            ours = part[~mpi_side.loc[part.index]]
            best = ours.loc[ours["time_median_s"].idxmin()] if len(ours) else None
            lines.append({"collective": meta["collective"], "place": place, "size": bc.format_size(int(nbytes)),
                          f"{base_name} (us)": base.iloc[0] * 1e6 if len(base) else float("nan"),
                          "npddp best": best["backend"] if best is not None else "-",
                          "npddp (us)": best["time_median_s"] * 1e6 if best is not None else float("nan"),
                          "npddp / MPI": (best["time_median_s"] / base.iloc[0]) if best is not None and len(base)
                          else float("nan")})
    if len({r["collective"] for r in lines}) < 2:
        return ""
    table = pd.DataFrame(lines)
    return ("== every collective: MPI's own call beside npddp's fastest backend, median time per call\n"
            + table.to_string(index=False, float_format="{:.2f}".format))


def is_mpi_algorithms(df) -> bool:
    """True for a sweep of MPI's own algorithms alone (benchmarks/mpi_algorithms.py: backends ``mpi:<algorithm>``)."""
    return bool(len(df)) and all(str(b).startswith(MPI_ALGORITHM) for b in df["backend"])


def join_mpi_algorithms(dumps) -> list:
    """The dumps, each sweep of MPI's own algorithms joined to the first other sweep with its collective, world size,
    dtype and op (so its ``mpi:*`` rows are drawn beside npddp's); one that has no such partner stays alone."""
    import pandas as pd

    same = ("kind", "collective", "world_size", "dtype", "op")
    out = list(dumps)
    for entry in list(out):
        path, meta, df = entry
        if meta["kind"] != "allreduce_sweep" or not is_mpi_algorithms(df):
            continue
        partner = next((i for i, (p, m, d) in enumerate(out) if p != path and not is_mpi_algorithms(d)
                        and all(m.get(k) == meta.get(k) for k in same)), None)
        if partner is not None:
            p, m, d = out[partner]
            out[partner] = (f"{Path(p).stem}+{Path(path).name}", m, pd.concat([d, df], ignore_index=True))
            out.remove(entry)
    return out


def resolve_baseline(df, baseline: str) -> str:
    """``baseline``, or ``<baseline>:default`` when only that is in the sweep (MPI's default choice, as mpi_algorithms.py names it);
    ``raw`` (MPI as a program calls it) falls back to ``mpi`` in a sweep without that row."""
    names = set(df["backend"])
    if baseline == RAW and RAW not in names:
        baseline = "mpi"
    default = f"{baseline}:default"
    return default if baseline not in names and default in names else baseline


def sweep_fits(df, meta: dict) -> dict:
    """series -> Fit over the median times; series that cannot be fitted (one rank, one size) are left out."""
    fits = {}
    for series, part in _with_series(df).groupby("series", sort=False):
        algorithms = part["algorithm"].unique()
        try:
            fits[series] = cm.fit_alpha_beta(part["bytes"], part["time_median_s"], meta["collective"],
                                             int(meta["world_size"]), algorithm=algorithms[0]
                                             if len(algorithms) == 1 else "ring")
        except ValueError:
            continue
    return fits


def fits_table(fits: dict, meta: dict) -> str:
    """The alpha-beta fits as a table."""
    import pandas as pd

    if not fits:
        return "alpha-beta fit: none (needs world size >= 2 and two sizes or more)"
    table = pd.DataFrame({"alpha_us": [f.alpha * 1e6 for f in fits.values()],
                          "bandwidth_GBps": [f.bandwidth / bc.GB for f in fits.values()],
                          "rel_rms": [f.rel_rms for f in fits.values()]}, index=list(fits))
    return (f"alpha-beta fit, {meta['world_size']} ranks (time = steps x alpha + fraction x bytes / bandwidth; "
            "weighted to relative error):\n" + table.to_string(float_format="{:.3f}".format))


def breakdown_table(df) -> str:
    """The DDP breakdown's main columns (``bare_efficiency`` too when the run measured the bare-NumPy step)."""
    cols = ["model", "sync", "backend", "bucket_mb", "step_ms", "step_ms_p10", "step_ms_p90", "forward_ms",
            "backward_ms", "comm_issued_ms", "comm_exposed_ms", "optimizer_ms", "comm_fraction", "num_comm_ops",
            "samples_per_s", "ddp_efficiency"]
    if "bare_efficiency" in df and df["bare_efficiency"].notna().any():
        cols.append("bare_efficiency")
    return df[cols].to_string(index=False, float_format="{:.3g}".format)


def scaling_summary(df):
    """Per combination and world size: median, min and max efficiency over repeats, and their spread."""
    keys = ["model", "sync", "backend", "bucket_mb", "world_size"]
    g = df.groupby(keys, sort=False)
    out = g["efficiency"].agg(["median", "min", "max"]).rename(columns=lambda c: f"efficiency_{c}")
    out["spread"] = (out["efficiency_max"] - out["efficiency_min"]) / out["efficiency_median"]
    out["ddp_efficiency"] = g["ddp_efficiency"].median()
    out["step_ms"] = g["step_ms"].median()
    out["repeats"] = g["repeat"].nunique()
    return out.reset_index()


def compute_rate(tables, compute_ms: float, compute_params: int) -> tuple[float, str]:
    """(seconds of compute per step per parameter, where it came from)."""
    for path, df in tables:
        params = df["params"].to_numpy(np.float64)
        ms = df["compute_ms"].to_numpy(np.float64)
        biggest = params == params.max()
        rate = float(np.median(ms[biggest] / params[biggest])) / 1e3
        return rate, f"measured in {Path(path).name}: {bc.format_count(int(params.max()))}-parameter model"
    source = f"assumed {compute_ms:g} ms per step at {bc.format_count(compute_params)} parameters"
    return compute_ms / 1e3 / compute_params, source


def projection_frame(projections):
    """The projections as a DataFrame (one row per network, algorithm, model size and N)."""
    import pandas as pd

    return pd.DataFrame([{"network": p.network, "algorithm": p.algorithm, "params": p.params, "n": p.n,
                          "buckets": p.buckets, "comm_ms": p.comm * 1e3, "compute_ms": p.compute * 1e3,
                          "efficiency_serial": p.efficiency_serial, "efficiency_overlap": p.efficiency_overlap}
                         for p in projections])


def projection_tables(proj, rate: float, source: str, local_fits: dict, bucket_bytes: int, skipped) -> str:
    """Network assumptions beside the local fits, then efficiency per network, model size and N."""
    import pandas as pd

    nets = pd.DataFrame([{"network": n.name, "alpha_us": n.alpha * 1e6, "bandwidth_GBps": n.bandwidth / bc.GB,
                          "source": "assumed: typical published figure"} for n in cm.NETWORKS]
                        + [{"network": f"local {series}", "alpha_us": f.alpha * 1e6, "bandwidth_GBps": f.bandwidth / bc.GB,
                            "source": f"fitted on this machine ({name})"}
                           for name, fits in local_fits.items() for series, f in fits.items()])
    labelled = proj.assign(params=[bc.format_count(int(p)) for p in proj["params"]])
    algorithms = list(dict.fromkeys(proj["algorithm"]))
    wide = pd.concat({kind: labelled.pivot_table(index=["network", "params", "n"], columns="algorithm",
                                                 values=f"efficiency_{kind}", sort=False)[algorithms]
                      for kind in ("serial", "overlap")}, axis=1)
    wide.columns = [f"{algo} {kind}" for kind, algo in wide.columns]
    lines = [f"== DDP projection: all-reduce of float32 gradients per step in {bucket_bytes / (1 << 20):g} MiB buckets",
             f"compute: {rate * 1e9:.3f} ms per step per 1M parameters ({source}"
             + (": set with --compute-ms and --compute-params)" if source.startswith("assumed") else ")"),
             nets.to_string(index=False, float_format="{:.2f}".format),
             "efficiency = compute / step; serial: communication after compute; overlap: perfectly hidden",
             wide.to_string(float_format="{:.3f}".format)]
    if skipped:
        lines.append(f"not projected (no cost model in benchmarks/_costmodel.py): {', '.join(skipped)}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI

def _list(parse):
    """argparse type: a comma-separated list of positive values parsed by ``parse``."""
    def convert(text: str):
        try:
            values = [parse(t) for t in text.split(",") if t.strip()]
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of positive values, got {text!r}")
        return values
    return convert


def _formats(text: str) -> list:
    """argparse type: comma-separated image formats from FORMATS."""
    return list(bc.names(FORMATS)(text))


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser."""
    p = argparse.ArgumentParser(prog=PROG, description="Tables and plots from npddp benchmark dumps.")
    p.add_argument("dumps", nargs="+", help="HDF5 dumps (allreduce_sweep, ddp_breakdown, weak_scaling, torch_compare) "
                   "or .json traces")
    p.add_argument("--trace-step", type=int, default=None, help="step a trace's timeline shows (default: the middle one)")
    p.add_argument("--outdir", default=".", help="directory for the plots (created; default .)")
    p.add_argument("--format", type=_formats, default=["png"], help="plot formats: png, svg or png,svg (default png)")
    p.add_argument("--dpi", type=bc.int_at_least(20), default=100, help="PNG resolution in dots per inch (default 100)")
    p.add_argument("--no-plots", action="store_true", help="print tables only")
    p.add_argument("--baseline", default=RAW, help="backend the time ratios divide by (default raw: a bare mpi4py "
                   "loop, MPI as a program sees it; mpi in a sweep without it)")
    p.add_argument("--plugin", type=bc.plugin, action="append", default=[], metavar="MODULE",
                   help=bc.PLUGIN_HELP + "; a registered algorithm's declared cost joins the projection")
    p.add_argument("--compute-ms", type=float, default=100.0,
                   help="compute time per step of a --compute-params model when no ddp_breakdown dump is given "
                        "(default 100)")
    p.add_argument("--compute-params", type=bc.parse_count, default=25_000_000, help="(default 25M)")
    p.add_argument("--model-params", type=_list(bc.parse_count), default=[10**6, 25 * 10**6, 10**8, 35 * 10**7],
                   help="model sizes to project (default 1M,25M,100M,350M)")
    p.add_argument("--plot-params", type=bc.parse_count, default=25_000_000,
                   help="model size the projection plot shows (default 25M; added to --model-params)")
    p.add_argument("--world-sizes", type=_list(int), default=[2, 8, 64, 256, 1024],
                   help="world sizes to project (default 2,8,64,256,1024)")
    p.add_argument("--bucket-mb", type=float, default=BUCKET_CAP_MB,
                   help=f"DDP bucket cap in MiB (default {BUCKET_CAP_MB:g})")
    return p


def _plots_module():
    """benchmarks/_plots.py, or None (after saying so) when matplotlib is missing."""
    try:
        from benchmarks import _plots
    except ImportError:
        print(f"{PROG}: matplotlib is not installed (pip install matplotlib); no plots", file=sys.stderr)
        return None
    return _plots


def figures(plots, dumps, baseline: str) -> list:
    """(file stem, Figure) for every plot of every dump."""
    out = []
    for path, meta, df in dumps:
        stem, kind = Path(path).stem, meta["kind"]
        if kind == "allreduce_sweep":
            out.append((f"{stem}_busbw", plots.sweep_busbw(df, meta)))
            ratio = plots.sweep_ratio(df, meta, resolve_baseline(df, baseline))
            out += [(f"{stem}_ratio", ratio)] if ratio is not None else []
        elif kind == "ddp_breakdown":
            out.append((f"{stem}_breakdown", plots.breakdown(df, meta)))
        elif kind == "weak_scaling":
            out.append((f"{stem}_efficiency", plots.scaling(df, meta)))
    layouts = [(meta, df) for _, meta, df in dumps if meta["kind"] == "parallelism"]
    if layouts:
        from benchmarks import _parallelism_plot
        out.append(("parallelism", _parallelism_plot.figure([df for _, df in layouts], layouts[0][0])))
    return out


def print_dumps(dumps, baseline: str):
    """Print every dump's tables; (sweep fits by file, breakdown tables, all-reduce algorithms seen)."""
    local_fits, breakdowns, algorithms = {}, [], []
    for path, meta, df in dumps:
        kind = meta["kind"]
        if kind == "allreduce_sweep":
            fits = sweep_fits(df, meta)
            local_fits[Path(path).name] = fits
            print(f"{sweep_tables(df, meta, resolve_baseline(df, baseline))}\n{fits_table(fits, meta)}\n")
            if meta["collective"] == "allreduce":
                algorithms += list(df["algorithm"])
        elif kind == "ddp_breakdown":
            breakdowns.append((path, df))
            print(f"== {path}: DDP step breakdown, {meta['world_size']} ranks (ms)\n{breakdown_table(df)}\n")
        elif kind == "weak_scaling":
            print(f"== {path}: weak scaling\n"
                  f"{scaling_summary(df).to_string(index=False, float_format='{:.3f}'.format)}\n")
        else:
            print(f"== {path}: {kind}\n{df.to_string(index=False, float_format='{:.4g}'.format)}\n")
    layouts = [df for _, meta, df in dumps if meta["kind"] == "parallelism"]
    if layouts:
        from benchmarks import _parallelism_plot
        print(f"{_parallelism_plot.comparison_table(layouts)}\n")
    return local_fits, breakdowns, list(dict.fromkeys(algorithms))


def trace_problems(paths, step: int | None, plots: bool) -> list[str]:
    """One line per trace that cannot be read, or lacks the ``--trace-step`` its timeline would show."""
    problems = []
    for path in paths:
        try:
            doc = _timeline.load(path)
            if plots or step is not None:
                _timeline.pick_step(doc, step)
        except ValueError as exc:
            problems.append(str(exc) if str(exc).startswith(str(path)) else f"{path}: --trace-step: {exc}")
    return problems


def input_problems(args, traces) -> list[str]:
    """Every bad trace, dump and argument, each one line, found before anything is printed or drawn."""
    problems = trace_problems(traces, args.trace_step, not args.no_plots)
    if not args.dumps:
        return problems
    if not (args.compute_ms > 0 and args.bucket_mb > 0):
        return [*problems, "--compute-ms and --bucket-mb must be > 0"]
    if Path(args.outdir).exists() and not Path(args.outdir).is_dir() and not args.no_plots:
        return [*problems, f"--outdir {args.outdir!r} exists and is not a directory"]
    try:
        import pandas as pd  # noqa: F401  (read_table returns DataFrames only with it)
    except ImportError:
        return [*problems, "the report needs pandas (pip install pandas)"]
    return problems + [line for path in args.dumps for line in results.check(path)]


def main(argv=None) -> int:
    """Check every dump, trace and argument, then print the tables and write the plots; 2 on bad input."""
    args = build_parser().parse_args(argv)
    traces = [p for p in args.dumps if _timeline.is_trace(p)]
    args.dumps = [p for p in args.dumps if not _timeline.is_trace(p)]
    problems = input_problems(args, traces)
    if problems:
        for line in problems:
            print(f"{PROG}: error: {line}", file=sys.stderr)
        return EXIT_BAD
    if traces:
        code, written = _timeline.report(traces, args.outdir, args.format, args.dpi, not args.no_plots, args.trace_step)
        print("wrote " + ", ".join(str(p) for p in written) if written else "", end="\n" if written else "")
        if code or not args.dumps:
            return code
    dumps = join_mpi_algorithms([(path, results.read_meta(path), results.read_table(path)) for path in args.dumps])
    local_fits, breakdowns, algorithms = print_dumps(dumps, args.baseline)
    summary = collectives_table(dumps, args.baseline)
    if summary:
        print(f"{summary}\n")
    rate, source = compute_rate(breakdowns, args.compute_ms, args.compute_params)
    found = algorithms or list(cm.ALLREDUCE_MODELS)
    modelled = [a for a in found if cm.modelled(a)] or list(cm.ALLREDUCE_MODELS)
    bucket_bytes = max(1, int(args.bucket_mb * (1 << 20)))
    params = sorted(set(args.model_params) | {args.plot_params})
    proj = projection_frame(cm.project_ddp(params, args.world_sizes, rate, algorithms=modelled,
                                           bucket_bytes=bucket_bytes))
    print(projection_tables(proj, rate, source, local_fits, bucket_bytes, [a for a in found if not cm.modelled(a)]))
    plots = None if args.no_plots else _plots_module()
    if plots is None:
        return 0
    drawn = figures(plots, dumps, args.baseline)
    drawn.append(("projection", plots.projection(proj, dumps[0][1], args.plot_params, f"compute {source}")))
    outdir = Path(args.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in drawn:
        for fmt in args.format:
            written.append(outdir / f"{name}.{fmt}")
            fig.savefig(written[-1], dpi=args.dpi)
    print("\nwrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
