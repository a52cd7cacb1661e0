"""The report's figures, drawn from the dumps' tables (pandas DataFrames) with matplotlib.

Every function returns a ``matplotlib.figure.Figure`` (no pyplot, so no global state); the
report saves it. Titles say what was measured, then where and when (host, CPU, N, MPI
library, package versions, date); axes carry units; sizes and rank counts are on log axes.
Series names come from the data (backends, algorithms, models), never from a fixed list.
"""

from __future__ import annotations

import zlib

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

from benchmarks.columns import NO_COMM, RAW

from benchmarks._common import format_count, format_size

#: Relative spread (max - min) / median over repeats above which the scaling plot warns.
SPREAD_WARNING = 0.20
_PLACE = {"inplace": "in-place", "outofplace": "out-of-place"}


def where_when(meta: dict, world_size=None, libraries: str | None = None) -> str:
    """Two lines from a dump's attributes: 'host, CPU, N=2 ranks, 2025-01-31' and 'MPICH 5.0.2, npddp 0.1.0, ...';
    ``libraries`` names the MPIs in place of the dump's own (a figure drawn from several MPIs' dumps)."""
    cpu = str(meta.get("cpu_model", "?"))
    cpu = cpu if len(cpu) <= 48 else cpu[:47] + "..."
    words = [w for w in str(meta.get("mpi_library", "MPI ?")).replace(",", " ").split() if w != "Version:"]
    versions = ", ".join(f"{k} {meta.get(k + '_version', '?')}" for k in ("npddp", "numpy", "mpi4py"))
    n = meta.get("world_size", "?") if world_size is None else world_size
    return (f"{meta.get('host', '?')}, {cpu}, N={n} ranks, {str(meta.get('time_utc', '?'))[:10]}\n"
            f"{' '.join(words[:2]) if libraries is None else libraries}, {versions}")


def _figure(width: float, height: float, what: str, meta: dict, world_size=None, libraries=None) -> Figure:
    """A figure titled with ``what`` over where and when."""
    fig = Figure(figsize=(width, height), layout="constrained")
    fig.suptitle(f"{what}\n{where_when(meta, world_size, libraries)}", fontsize=10)
    return fig


def _size_axis(ax) -> None:
    """Log-2 x axis of message sizes labelled 8, 1K, 64M."""
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_size(int(round(x))) if x >= 1 else ""))
    ax.set_xlabel("message size (bytes)")
    ax.grid(True, which="major", alpha=0.3)


def _ranks_axis(ax, ns) -> None:
    """Log-2 x axis of rank counts with a tick at each one present."""
    ax.set_xscale("log", base=2)
    ns = sorted({int(n) for n in ns})
    ax.set_xticks(ns, labels=[str(n) for n in ns])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("world size N (ranks)")
    ax.grid(True, alpha=0.3)


def _series(df, keys):
    """(label, rows) per distinct value of ``keys`` in first-seen order; rows sorted as they come."""
    for values, part in df.groupby(list(keys), sort=False):
        values = values if isinstance(values, tuple) else (values,)
        yield " ".join(_PLACE.get(str(v), f"{v:g} MiB" if isinstance(v, float) else str(v)) for v in values), part


#: A fixed colour per backend (and algorithm of the same name), the same in every figure; the
#: no-comm ceiling is black. Other names (a user's algorithms, MPI's own as ``mpi:<algorithm>``)
#: get a colour from their letters, moved on to a free one where two names of one figure meet.
BACKEND_COLOURS = {"mpi": "#1f77b4", "ring": "#ff7f0e", "naive": "#7f7f7f", "rd": "#2ca02c",
                   "rabenseifner": "#9467bd", "tree": "#8c564b", "auto": "#d62728", "shm": "#e377c2",
                   "hier": "#17becf", "gloo": "#bcbd22", RAW: "#aec7e8", NO_COMM: "#000000"}
_SPARE = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354",
          "#5254a3", "#8ca252", "#bd9e39", "#ad494a", "#a55194", "#6b6ecf", "#b5cf6b", "#e7ba52",
          "#d6616b", "#ce6dbd", "#756bb1", "#636363")


def _base_name(name) -> str:
    """A backend's name without its transport (``ring/tcp`` -> ``ring``)."""
    return str(name).split("/")[0]


def backend_colour(name: str) -> str:
    """The colour of a backend in every figure: fixed for npddp's own, stable from the name for others."""
    name = _base_name(name)
    if name in BACKEND_COLOURS:
        return BACKEND_COLOURS[name]
    return _SPARE[zlib.crc32(name.encode()) % len(_SPARE)]


def backend_colours(names) -> dict:
    """{name: colour} for the backends of one figure: :func:`backend_colour`, but no two names share a spare colour.

    Names are placed in sorted order, each on its own colour or the next free spare one, so a
    set of names gets the same colours whatever order the rows come in.
    """
    names = sorted({_base_name(n) for n in names})
    out = {n: BACKEND_COLOURS[n] for n in names if n in BACKEND_COLOURS}
    taken = set()
    for name in (n for n in names if n not in BACKEND_COLOURS):
        start = _SPARE.index(backend_colour(name))
        free = [c for c in _SPARE[start:] + _SPARE[:start] if c not in taken] or [_SPARE[start]]
        out[name] = free[0]
        taken.add(free[0])
    return out


def _colours(df, keys, names=None) -> dict:
    """A colour per series without its place: its backend's (in- and out-of-place of one backend share it).

    ``names``: every backend of the figure's data (default: those of ``df``), so that a backend keeps
    its colour in the figures of one dump that draw some of its backends only.
    """
    keys = [k for k in keys if k != "place"]
    palette = backend_colours(df["backend"] if names is None else names)
    return {label: palette[_base_name(part["backend"].iloc[0])] for label, part in _series(df, keys)}


def _style(label: str, colours: dict) -> dict:
    """Line colour from the series without its place (or what it ran); dashed out of place; squares over tcp."""
    label = label.split(" (ran ")[0]
    base = label.replace(" out-of-place", "").replace(" in-place", "")
    return {"color": colours.get(base), "ls": "--" if label.endswith("out-of-place") else "-",
            "marker": "s" if " tcp" in f" {base} " else "o"}


def _sweep_keys(df) -> list:
    """Series keys of a sweep: backend, transport where it varies, place."""
    keys = ["backend"] + (["transport"] if df["transport"].nunique() > 1 else [])
    keys += ["buffers"] if df["buffers"].nunique() > 1 else []
    return keys + (["place"] if df["place"].nunique() > 1 else [])


def _sweep_series(df):
    """(label, rows) per series; a backend that picks its algorithm per call names what it ran."""
    for label, part in _series(df, _sweep_keys(df)):
        ran = list(dict.fromkeys(part["algorithm"]))
        yield label + (f" (ran {', '.join(ran)})" if ran != list(dict.fromkeys(part["backend"])) else ""), part


def _legend_below(fig, ax) -> None:
    """The axes' series in a figure legend under the plot, in as many columns as keep it short."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(4, max(1, (len(labels) + 2) // 3)),
               fontsize=8)
    fig.set_figheight(fig.get_figheight() + 0.17 * -(-len(labels) // 4))


def sweep_busbw(df, meta: dict) -> Figure:
    """Bus bandwidth (algorithm bandwidth on one rank) vs size per series, p10-p90 bands from the time spread."""
    one = int(meta["world_size"]) == 1
    what = "algorithm" if one else "bus"
    fig = _figure(9, 5, f"{meta['collective']} {what} bandwidth vs size, {meta['dtype']} "
                        f"(line: median time; band: p10-p90)", meta)
    ax = fig.add_subplot()
    column = "algbw_GBps" if one else "busbw_GBps"
    colours = _colours(df, _sweep_keys(df))
    for label, part in _sweep_series(df):
        part = part.sort_values("bytes")
        bw = part[column].to_numpy()
        median = part["time_median_s"].to_numpy()
        line, = ax.plot(part["bytes"], bw, ms=3, label=label, **_style(label, colours))
        ax.fill_between(part["bytes"], bw * median / part["time_p90_s"].to_numpy(),
                        bw * median / part["time_p10_s"].to_numpy(), color=line.get_color(), alpha=0.12, lw=0)
    _size_axis(ax)
    ax.set_yscale("log")
    ax.set_ylabel(f"{what} bandwidth (GB/s, GB = 1e9 B)")
    _legend_below(fig, ax)
    return fig


def sweep_ratio(df, meta: dict, baseline: str):
    """Median time over the ``baseline`` backend's at the same size and place, per other series; None without it."""
    base = df[df["backend"] == baseline]
    others = df[df["backend"] != baseline]
    if base.empty or others.empty:
        return None
    fig = _figure(9, 5, f"{meta['collective']} time relative to {baseline}, {meta['dtype']}", meta)
    ax = fig.add_subplot()
    ref = base.groupby(["place", "buffers", "bytes"])["time_median_s"].median()
    colours = _colours(others, _sweep_keys(others), names=df["backend"])
    for label, part in _sweep_series(others):
        part = part.sort_values("bytes")
        ratio = part["time_median_s"].to_numpy() / ref.reindex(
            list(zip(part["place"], part["buffers"], part["bytes"]))).to_numpy()
        ax.plot(part["bytes"], ratio, ms=3, label=label, **_style(label, colours))
    ax.axhline(1.0, color="black", lw=1, label=f"{baseline} (1.0)")
    _size_axis(ax)
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.set_ylabel(f"median time / {baseline} median time (> 1: slower)")
    _legend_below(fig, ax)
    return fig


#: Segments of a step bar: (label, column or None for the remainder, colour, hatch).
SEGMENTS = (("forward", "forward_ms", "C0", ""),
            ("backward (compute)", "backward_ms", "C1", ""),
            ("comm issued inside backward", "comm_issued_ms", "C1", "///"),
            ("exposed comm (after backward)", "comm_exposed_ms", "C3", ""),
            ("optimizer", "optimizer_ms", "C2", ""),
            ("other (slowest rank, barrier skew)", None, "0.75", ""))


#: Height of one bar of the breakdown, and the tallest the figure gets (inches).
BAR_IN, BREAKDOWN_MAX_IN = 0.2, 10.0
LEGEND_ROWS = 2.5    # the legend's row, in bars


def breakdown(df, meta: dict) -> Figure:
    """Per model, one bar per row: the step split into its parts as % of the step, absolute ms on the bars.

    A bar always ends at 100%: when the measured parts add up to more than the step (they are
    each the slowest rank's, so they can), they are shown as shares of their sum instead.
    The legend sits at the top; backend names on the axis take their colour in every figure.
    """
    models = list(dict.fromkeys(df["model"]))
    heights = [max(1, (df["model"] == m).sum()) for m in models]
    fig = _figure(10, min(BREAKDOWN_MAX_IN, 1.9 + BAR_IN * sum(heights) + 0.45 * len(models)),
                  "DDP step breakdown (% of the step; ms on the bars; eff = step(none) / step)", meta)
    # the legend's row is the first axes; the models' axes follow
    top, *axes = fig.subplots(len(models) + 1, 1, squeeze=False,
                              gridspec_kw={"height_ratios": [LEGEND_ROWS, *heights]})[:, 0]
    for ax, model in zip(axes, models):
        part = df[df["model"] == model]
        several = part.loc[part["backend"] != NO_COMM, "transport"].nunique() > 1  # name it only if it varies
        labels = [f"{s} {b}" + (f"/{t}" if several and b != NO_COMM else "") + (f" {mb:g} MiB" if mb else "")
                  for s, b, t, mb in zip(part["sync"], part["backend"], part["transport"], part["bucket_mb"])]
        step = part["step_ms"].to_numpy()
        parts = [part[column].to_numpy() for _, column, _, _ in SEGMENTS if column]
        whole = np.maximum(step, np.sum(parts, axis=0))                          # what 100% stands for
        left = np.zeros(len(part))
        for name, column, colour, hatch in SEGMENTS:
            ms = part[column].to_numpy() if column else np.maximum(step - left * whole / 100, 0.0)
            share = 100 * ms / whole
            bars = ax.barh(labels, share, left=left, color=colour, hatch=hatch, edgecolor="white", lw=0.5,
                           height=0.75, label=name if ax is axes[0] else None)
            for bar, value, width in zip(bars, ms, share):
                if width >= 7:
                    ax.text(bar.get_x() + width / 2, bar.get_y() + bar.get_height() / 2, f"{value:.1f}",
                            ha="center", va="center", fontsize=7)
            left += share
        for y, (total, eff) in enumerate(zip(step, part["ddp_efficiency"])):
            note = f"{total:.1f} ms" + (f", eff {eff:.2f}" if np.isfinite(eff) else "")
            ax.text(101, y, note, va="center", fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0, 122)
        ax.set_xticks(range(0, 101, 20))
        ax.set_ylim(len(part) - 0.5, -0.5)
        ax.set_title(f"{model} ({format_count(int(part['params'].iloc[0]))} parameters, batch "
                     f"{int(part['batch'].iloc[0])} per rank)", fontsize=9, loc="left")
        ax.tick_params(axis="y", labelsize=7)
        for tick, backend in zip(ax.get_yticklabels(), part["backend"]):
            tick.set_color(backend_colour(backend))
    axes[-1].set_xlabel("share of the step time (%)")
    top.axis("off")                                   # a row of its own for the legend, under the title
    top.legend(*axes[0].get_legend_handles_labels(), loc="center", ncols=3, fontsize=8, frameon=False)
    return fig


def scaling(df, meta: dict) -> Figure:
    """Efficiency vs N with min-max error bars over repeats, the no-comm ceiling, and a warning on wide spreads."""
    ceiling = (df["backend"] == NO_COMM).any()
    repeats = df["repeat"].nunique()
    fig = _figure(12 if ceiling else 7, 5, f"DDP weak scaling, {repeats} repeat(s): median, bars min-max",
                  meta, world_size=f"1..{int(df['world_size'].max())}")
    axes = fig.subplots(1, 2 if ceiling else 1, squeeze=False)[0]
    keys = [k for k in ("model", "sync", "backend", "bucket_mb") if df[k].nunique() > 1] or ["backend"]
    others = [k for k in keys if k != "backend"]   # series of one backend share its colour: a marker each
    markers = {v: "osD^v<>p*h"[i % 10] for i, v in enumerate(dict.fromkeys(
        tuple(row) for row in df[others].itertuples(index=False)))} if others else {}
    flagged = []
    panels = [(axes[0], "efficiency", "weak-scaling efficiency (samples/s / (N x one rank))")]
    if ceiling:
        panels.append((axes[1], "ddp_efficiency", "DDP efficiency (step with no comm / step)"))
    for ax, column, ylabel in panels:
        for label, part in _series(df, keys):
            is_ceiling = (part["backend"] == NO_COMM).all()
            if column == "ddp_efficiency" and is_ceiling:
                continue
            stats = part.groupby("world_size")[column].agg(["median", "min", "max"])
            ns = stats.index.to_numpy()
            err = np.vstack([stats["median"] - stats["min"], stats["max"] - stats["median"]])
            name = "no-comm ceiling" + (f" ({label})" if len(keys) > 1 else "") if is_ceiling else label
            marker = markers.get(tuple(part[others].iloc[0]), "o") if others else "o"
            ax.errorbar(ns, stats["median"], yerr=err, marker=marker, capsize=4, label=name,
                        color=backend_colour(part["backend"].iloc[0]), ls="--" if is_ceiling else "-")
            spread = (stats["max"] - stats["min"]) / stats["median"]
            for n, s, y in zip(ns, spread, stats["median"]):
                if s > SPREAD_WARNING:
                    ax.plot(n, y, "o", ms=14, mfc="none", mec="red")
                    flagged.append(f"{name} N={n} ({s:.0%})")
        ax.axhline(1.0, color="gray", lw=1)
        _ranks_axis(ax, df["world_size"])
        ax.set_ylabel(ylabel)
        ax.set_ylim(0, max(1.15, float(df[column].max()) * 1.05))
        ax.legend(fontsize=8, loc="lower left")
    if flagged:  # a figure-level x label: the layout keeps room for it under the axes
        where = "; ".join(flagged[:4]) + (" ..." if len(flagged) > 4 else "")
        fig.supxlabel(f"Warning: spread over repeats > {SPREAD_WARNING:.0%} at {where}: treat these points as noise",
                      color="red", fontsize=8, wrap=True).set_gid("spread-warning")
    return fig


def projection(df, meta: dict, params: int, note: str) -> Figure:
    """Projected efficiency vs N, one panel per network, one line per algorithm in ``df`` (at ``params``)."""
    df = df[df["params"] == params]
    nets = list(dict.fromkeys(df["network"]))
    fig = _figure(4.5 * len(nets) + 1, 4.5, f"Projected DDP efficiency (compute / (compute + comm)), "
                                            f"{format_count(params)}-parameter model; {note}", meta)
    axes = fig.subplots(1, len(nets), squeeze=False, sharey=True)[0]
    for ax, net in zip(axes, nets):
        rows = df[df["network"] == net]
        for algorithm, part in rows.groupby("algorithm", sort=False):
            ax.plot(part["n"], part["efficiency_serial"], marker="o", label=algorithm,
                    color=backend_colour(algorithm))
        _ranks_axis(ax, rows["n"])
        ax.set_title(net, fontsize=9)
        ax.set_ylim(0, 1.05)
    axes[0].set_ylabel("projected efficiency, no overlap")
    axes[0].legend(title="algorithm", fontsize=8)
    return fig


def mpi_study(frames: dict, setting: str, prefix: str = "mpi:") -> Figure:
    """Per MPI (one panel each): every algorithm's in-place median time over the fastest npddp algorithm's, vs size.

    ``frames``: {panel title (the MPI): ({(bytes, backend): seconds}, dump attributes)}; MPI's own algorithms
    (``<prefix><name>``) dashed, ``mpi:default`` black, npddp's solid in their fixed colours. The header
    names every panel's MPI; host, date and versions are the first dump's.
    """
    meta = next(iter(frames.values()))[1]
    fig = _figure(5.2 * len(frames) + 1.5, 8.0, f"all-reduce time / fastest npddp algorithm's, {setting}\n"
                                                f"(in place, median; below 1: faster than npddp's best)", meta,
                  libraries=", ".join(frames))
    axes = fig.subplots(1, len(frames), squeeze=False, sharey=True)[0]
    for ax, (family, (times, _)) in zip(axes, frames.items()):
        names = list(dict.fromkeys(b for _, b in times))
        sizes = sorted({n for n, _ in times})
        best = {n: min(t for (m, b), t in times.items() if m == n and not b.startswith(prefix)) for n in sizes}
        palette = backend_colours([b for b in names if b.startswith(prefix)])
        for name in sorted(names, key=lambda b: (not b.startswith(prefix), b)):
            xs = [n for n in sizes if (n, name) in times]
            ys = [times[n, name] / best[n] for n in xs]
            own = name.startswith(prefix)
            default = name == prefix + "default"
            style = ({"color": "black", "lw": 2.2, "ls": "-"} if default else
                     {"color": palette[name], "lw": 1, "ls": "--"} if own else
                     {"color": backend_colour(name), "lw": 1.8, "ls": "-"})
            ax.plot(xs, ys, marker="o", ms=2.5, label=name, **style)
        _size_axis(ax)
        ax.set_yscale("log", base=2)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_title(family, fontsize=9)
        ax.legend(fontsize=6, ncols=2, loc="upper center", bbox_to_anchor=(0.5, -0.12))
    axes[0].set_ylabel("time / fastest npddp algorithm's time (log 2)")
    return fig
