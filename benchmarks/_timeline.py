"""Traces (``--trace FILE.json``, npddp.util.tracing) in the report: overlap figures and a timeline picture.

Per traced step and rank: backward time (the whole-model ``backward`` event), communication
hidden under it (the union of the all-reduce intervals inside backward), exposed communication
(the part of that union after backward ended), and per all-reduce the slowest rank's lateness:
how long after the first rank the last one issued it (no rank can finish before the last joins).
The picture: one step of every rank, a compute lane (whole-model events, layers inside them),
one lane per all-reduce lane of the trace, and the optimizer and data lanes, on one time axis.

A split model's trace (``--tp``/``--pp``: ``pipeline`` events on the step track) gets instead, per
step and rank, its stage, the micro-batches' forward and backward time, the sends, receives and
all-reduces (union), the idle time (``idle (bubble)`` events) and the idle share of the step
beside the ideal ``(K-1)/(M+K-1)``; its picture labels each micro-batch ``F i``/``B i`` and draws
the idle stretches, with each rank named by its mesh coordinates.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

#: Lanes drawn per rank, top to bottom, and their colours.
LANES = ("data", "compute", "comm", "optimizer")
COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "all-reduce wait": "#c44e52", "comm": "#55a868",
           "optimizer": "#8172b3", "data": "#937860", "checkpoint": "#da8bc3"}
#: Colours of a pipeline trace's own compute events (added to the legend when the trace has them).
PIPELINE_COLOURS = {"recompute": "#64b5cd", "idle": "#bbbbbb"}
#: The name of a pipeline stage's idle stretches (npddp.parallel.model.pipetrace).
IDLE = "idle (bubble)"


def is_trace(path) -> bool:
    """True for a JSON file (a Chrome trace); the report's other inputs are HDF5."""
    return Path(path).suffix.lower() == ".json"


def load(path) -> dict:
    """The trace document; ValueError naming the file when it is not an npddp trace."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable JSON trace ({exc})") from None
    except RecursionError:
        raise ValueError(f"{path}: not a readable JSON trace (nested too deeply)") from None
    if not isinstance(doc, dict) or "traceEvents" not in doc:
        raise ValueError(f"{path}: no traceEvents: not a Chrome trace")
    return doc


def complete_events(doc: dict) -> list[dict]:
    """The ``X`` events that carry a step."""
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and "step" in e.get("args", {})]


def union_length(spans, lo: float = -np.inf, hi: float = np.inf) -> float:
    """Length of the union of ``spans`` [(start, end)] clipped to [lo, hi]."""
    total, reach = 0.0, -np.inf
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in spans):
        if e <= s:
            continue
        s = max(s, reach)
        if e > s:
            total += e - s
            reach = e
    return total


def step_rows(doc: dict) -> list[dict]:
    """Per (step, rank): backward, communication, hidden and exposed communication in ms."""
    rows = []
    by_key: dict = {}
    for e in complete_events(doc):
        by_key.setdefault((e["args"]["step"], e["pid"]), []).append(e)
    for (step, rank), events in sorted(by_key.items()):
        backward = [e for e in events if e["name"] == "backward"]
        if not backward:
            continue
        b0 = backward[0]["ts"]
        b1 = b0 + backward[0]["dur"]
        comm = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "comm"]
        rows.append({"step": step, "rank": rank, "backward_ms": (b1 - b0) / 1e3,
                     "comm_ms": union_length(comm) / 1e3, "hidden_ms": union_length(comm, b0, b1) / 1e3,
                     "exposed_ms": union_length(comm, b1) / 1e3, "all_reduces": len(comm)})
    return rows


def lateness_rows(doc: dict) -> list[dict]:
    """Per (step, all-reduce): issue spread over ranks and the rank that issued last."""
    issued: dict = {}
    for e in complete_events(doc):
        if e.get("cat") == "comm":
            issued.setdefault((e["args"]["step"], e["name"]), {})[e["pid"]] = e["ts"]
    rows = []
    for (step, name), ts in sorted(issued.items()):
        last = max(ts, key=ts.get)
        rows.append({"step": step, "all_reduce": name, "ranks": len(ts), "slowest_rank": last,
                     "lateness_ms": (ts[last] - min(ts.values())) / 1e3})
    return rows


def pipeline_rows(doc: dict) -> list[dict]:
    """Per (step, rank) of a split model's trace: stage, forward, backward, comm, idle and step ms; idle share."""
    by_key: dict = {}
    for e in complete_events(doc):
        by_key.setdefault((e["args"]["step"], e["pid"]), []).append(e)
    rows = []
    for (step, rank), events in sorted(by_key.items()):
        spans = [e for e in events if e.get("cat") == "step" and e["name"].startswith("pipeline ")]
        if not spans:
            continue
        span = spans[0]

        def total(prefix):
            return sum(e["dur"] for e in events if e.get("cat") == "compute" and e["name"].startswith(prefix)) / 1e3
        comm = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "comm"]
        idle = total(IDLE)
        rows.append({"step": step, "rank": rank, "stage": span["args"]["stage"], "forward_ms": total("forward mb "),
                     "backward_ms": total("backward mb "), "comm_ms": union_length(comm) / 1e3, "idle_ms": idle,
                     "step_ms": span["dur"] / 1e3, "idle_share": idle / max(span["dur"] / 1e3, 1e-9),
                     "ideal": span["args"]["bubble"], "stages": span["args"]["stages"],
                     "micro_batches": span["args"]["micro_batches"], "schedule": span["args"]["schedule"]})
    return rows


def pipeline_summary(rows: list[dict]) -> list[str]:
    """The printed lines of a split model's trace: the per-rank table, then each step's mean idle share."""
    lines = ["per step and rank (ms): the stage's micro-batch forwards and backwards, sends/receives/all-reduces "
             "(union), idle (no computation), the step; idle share = idle / step",
             _table(rows, (("step", "step", "d"), ("rank", "rank", "d"), ("stage", "stage", "d"),
                           ("forward_ms", "forward", ".3f"), ("backward_ms", "backward", ".3f"),
                           ("comm_ms", "comm", ".3f"), ("idle_ms", "idle", ".3f"), ("step_ms", "step", ".3f"),
                           ("idle_share", "idle share", ".3f"), ("ideal", "(K-1)/(M+K-1)", ".3f")))]
    for step in sorted({r["step"] for r in rows}):
        mine = [r for r in rows if r["step"] == step]
        first = mine[0]
        lines.append(f"step {step}: measured idle share {np.mean([r['idle_share'] for r in mine]):.3f} (mean over "
                     f"{len(mine)} ranks) beside (K-1)/(M+K-1) = {first['ideal']:.3f} (K = {first['stages']} stages, "
                     f"M = {first['micro_batches']} micro-batches, {first['schedule']})")
    return lines


def _table(rows: list[dict], columns) -> str:
    """Rows as fixed-width text: columns are (key, header, format)."""
    head = "  ".join(f"{h:>12}" for _, h, _ in columns)
    body = ["  ".join(f"{format(r[k], f):>12}" for k, _, f in columns) for r in rows]
    return "\n".join([head, *body])


def summary(path, doc: dict) -> str:
    """The printed part of the report for one trace."""
    other = doc.get("otherData", {})
    lines = [f"== {path}: trace of steps {other.get('trace_steps')} on ranks {other.get('ranks')}"
             + ("" if other.get("complete", True) else f" (INCOMPLETE: {other.get('reason', 'a rank failed')})"),
             f"clock offsets to rank 0 (us): {other.get('clock_offset_us', {})}"]
    piped = pipeline_rows(doc)
    if piped:
        return "\n".join(lines + pipeline_summary(piped))
    rows = step_rows(doc)
    if rows:
        lines.append("per step and rank (ms): backward, communication (union), hidden under backward, exposed after it")
        lines.append(_table(rows, (("step", "step", "d"), ("rank", "rank", "d"), ("backward_ms", "backward", ".3f"),
                                   ("comm_ms", "comm", ".3f"), ("hidden_ms", "hidden", ".3f"),
                                   ("exposed_ms", "exposed", ".3f"), ("all_reduces", "all-reduces", "d"))))
    late = lateness_rows(doc)
    if late:
        lines.append("per all-reduce: how late the last rank issued it after the first (ms)")
        lines.append(_table(late, (("step", "step", "d"), ("all_reduce", "all-reduce", ""),
                                   ("slowest_rank", "slowest rank", "d"), ("lateness_ms", "lateness", ".3f"))))
    return "\n".join(lines)


def pick_step(doc: dict, step: int | None = None) -> int:
    """``step`` if given, else the middle traced step that has a backward."""
    steps = sorted({r["step"] for r in step_rows(doc)}) or sorted({e["args"]["step"] for e in complete_events(doc)})
    if not steps:
        raise ValueError("the trace holds no events")
    if step is not None:
        if step not in steps:
            raise ValueError(f"step {step} is not in the trace; traced steps: {steps}")
        return step
    return steps[len(steps) // 2]


def comm_rows(events: list[dict]) -> dict:
    """id(event) -> ``comm``, ``comm 2``, ...: all-reduces in flight together get rows of their own."""
    rows, ends = {}, []
    for e in sorted(events, key=lambda e: e["ts"]):
        free = next((i for i, end in enumerate(ends) if end <= e["ts"]), len(ends))
        ends[free:free + 1] = [e["ts"] + e["dur"]]
        rows[id(e)] = "comm" + (f" {free + 1}" if free else "")
    return rows


def _lane_of(e: dict, comm: dict) -> str | None:
    """Which drawn lane an event belongs to (None: not drawn)."""
    cat = e.get("cat")
    if cat == "comm":
        return comm[id(e)]
    return cat if cat in LANES else None


def timeline(doc: dict, step: int | None = None, title: str = ""):
    """A matplotlib Figure: one step of every rank, lanes per rank, time in ms from the step's start."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    step = pick_step(doc, step)
    events = [e for e in complete_events(doc) if e["args"]["step"] == step]
    labels = doc.get("otherData", {}).get("process_names", {})
    colours = {**COLOURS, **(PIPELINE_COLOURS if any(e["name"] == IDLE for e in events) else {})}
    t0 = min(e["ts"] for e in events)
    comm: dict = {}
    lanes = []                                # (rank, lane name), top to bottom
    for rank in sorted({e["pid"] for e in events}):
        comm.update(comm_rows([e for e in events if e["pid"] == rank and e.get("cat") == "comm"]))
        names = {_lane_of(e, comm) for e in events if e["pid"] == rank}
        rows = sorted((n for n in names if n and n.startswith("comm")), key=lambda n: (len(n), n))
        lanes += [(rank, n) for n in ("data", "compute", *rows, "optimizer") if n in names]
    y = {lane: i for i, lane in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(lanes) + 1.6))
    for e in events:
        lane = _lane_of(e, comm)
        if lane is None or (e["pid"], lane) not in y:
            continue
        row = len(lanes) - 1 - y[e["pid"], lane]
        start, width = (e["ts"] - t0) / 1e3, max(e["dur"], 1) / 1e3
        kind = e["name"].split(" ")[0] if e.get("cat") == "compute" else e.get("cat")
        if e["name"] == "all-reduce wait":
            kind = "all-reduce wait"
        layer = e.get("cat") == "compute" and e["args"].get("layer")
        height = 0.5 if layer else 0.8
        ax.broken_barh([(start, width)], (row - height / 2, height), facecolors=colours.get(kind, "#999999"),
                       edgecolor="white" if layer else "none", linewidth=0.4, alpha=1.0 if layer else 0.45)
        if e.get("cat") == "comm" and "bucket" in e["args"]:
            ax.text(start + width / 2, row, f"bucket {e['args']['bucket']}", ha="center", va="center",
                    fontsize=7)
        elif kind in ("forward", "backward") and "micro_batch" in e["args"]:
            ax.text(start + width / 2, row, f"{kind[0].upper()}{e['args']['micro_batch']}", ha="center",
                    va="center", fontsize=7)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"{labels.get(str(r), f'rank {r}')} {n}" for r, n in reversed(lanes)], fontsize=8)
    for i in range(1, len(lanes)):
        if lanes[i][0] != lanes[i - 1][0]:
            ax.axhline(len(lanes) - i - 0.5, color="black", linewidth=0.6)
    ax.set_xlabel(f"ms from the start of step {step} (rank 0's clock)")
    ax.set_title(title or f"step {step}: compute and communication per rank")
    ax.legend(handles=[Patch(color=c, label=k) for k, c in colours.items()], fontsize=7, ncol=9,
              loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(lanes) < 6 else -0.15), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def report(paths, outdir, formats, dpi: int, plots: bool = True, step: int | None = None) -> tuple[int, list]:
    """Print every trace's summary and draw its timeline (without matplotlib: a note, no plots); (exit status,
    files written)."""
    written = []
    if plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("report.py: matplotlib is not installed (pip install matplotlib); no plots", file=sys.stderr)
            plots = False
    for path in paths:
        try:
            doc = load(path)
            print(summary(path, doc) + "\n")
            if not plots:
                continue
            fig = timeline(doc, step, title=f"{Path(path).name}: step {pick_step(doc, step)}")
        except ValueError as exc:
            print(f"report.py: error: {exc}")
            return 2, written
        Path(outdir).mkdir(parents=True, exist_ok=True)
        for fmt in formats:
            written.append(Path(outdir) / f"{Path(path).stem}_timeline.{fmt}")
            fig.savefig(written[-1], dpi=dpi)
    return 0, written
