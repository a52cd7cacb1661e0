"""Recorded events as one Chrome trace (the JSON that Perfetto and chrome://tracing open).

Input per rank (a :class:`RankPart`): an ``(n, 5)`` int64 array of events (name id, track,
start ns, end ns, step) with times already on rank 0's clock, measured from the job's origin,
and the name table (``name<US>json-args`` strings). Output: ``{"traceEvents": [...],
"displayTimeUnit": "ms", "otherData": {...}}`` with one process per rank (pid = rank), complete
``X`` events with ``ts``/``dur`` in whole microseconds, and ``M`` events naming processes and
threads. Times are floored to microseconds on both ends, which keeps every containment of the
nanosecond times (a child never ends after its parent once both are converted).

Perfetto drops events on one thread that overlap without nesting, so each track is split into
lanes at export: an event goes to the first lane where it nests inside the open events (or
follows them); several all-reduces in flight at once thus land on ``comm``, ``comm 2``, ...
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np

FORMAT = "npddp-trace"
VERSION = 1
#: Tracks (Chrome "threads") of every rank, in display order; an event's track is its index here.
TRACKS = ("step", "data", "compute", "comm", "optimizer", "checkpoint")
STEP, DATA, COMPUTE, COMM, OPTIMIZER, CHECKPOINT = range(len(TRACKS))
#: Columns of a rank's event array.
COLUMNS = ("name", "track", "start_ns", "end_ns", "step")
#: Separates an event name from its JSON arguments in the name table.
ARG_SEPARATOR = "\x1f"
#: Thread ids: track * LANES_PER_TRACK + lane.
LANES_PER_TRACK = 100


@dataclass
class RankPart:
    """What one rank recorded, ready to export."""

    rank: int
    events: np.ndarray                     # (n, 5) int64, COLUMNS; times on rank 0's clock from the origin
    names: list = field(default_factory=list)   # name id -> "name<US>json args"
    offset_ns: int = 0                     # added to this rank's clock to read rank 0's
    rtt_ns: int = 0                        # round trip of the ping-pong the offset came from
    dropped: int = 0                       # events not recorded: the buffer was full


def split_name(entry: str) -> tuple[str, dict]:
    """(name, args) of a name-table entry."""
    name, _, args = entry.partition(ARG_SEPARATOR)
    return name, (json.loads(args) if args else {})


def assign_lanes(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Lane of each interval so that the intervals of one lane nest or follow each other; (n,) int."""
    order = np.lexsort((-ends, starts))          # by start, the longer of equal starts first (the parent)
    lanes = np.zeros(len(starts), dtype=np.int64)
    open_ends: list[list[int]] = []              # per lane: ends of the events still open, innermost last
    for i in order:
        s, e = int(starts[i]), int(ends[i])
        for lane, stack in enumerate(open_ends):
            while stack and stack[-1] <= s:
                stack.pop()
            if not stack or e <= stack[-1]:
                break
        else:
            lane = len(open_ends)
            open_ends.append([])
        open_ends[lane].append(e)
        lanes[i] = lane
    return lanes


def thread_name(track: int, lane: int) -> str:
    """``comm``, ``comm 2``, ...: the name of a track's lane."""
    return TRACKS[track] + (f" {lane + 1}" if lane else "")


def rank_events(part: RankPart, label: str | None = None) -> list[dict]:
    """The Chrome events of one rank: its process name (``label``, else ``rank N``), thread names and events."""
    ev = np.asarray(part.events, dtype=np.int64).reshape(-1, len(COLUMNS))
    names = [split_name(n) for n in part.names]
    start_us = ev[:, 2] // 1000                 # (n,) floor on both ends keeps containment
    end_us = ev[:, 3] // 1000
    tids = np.zeros(len(ev), dtype=np.int64)
    for track in np.unique(ev[:, 1]):
        rows = np.flatnonzero(ev[:, 1] == track)
        tids[rows] = track * LANES_PER_TRACK + assign_lanes(ev[rows, 2], ev[rows, 3])
    pid = int(part.rank)
    out = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label or f"rank {pid}"}},
           {"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": pid}}]
    for tid in sorted(set(tids.tolist())):
        track, lane = divmod(tid, LANES_PER_TRACK)
        out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                    "args": {"name": thread_name(track, lane)}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    for row, tid, ts, end in zip(ev.tolist(), tids.tolist(), start_us.tolist(), end_us.tolist()):
        name, args = names[row[0]]
        out.append({"name": name, "cat": TRACKS[row[1]], "ph": "X", "pid": pid, "tid": tid,
                    "ts": ts, "dur": end - ts, "args": {**args, "step": row[4]}})
    return out


def other_data(parts: list[RankPart], base: dict) -> dict:
    """``base`` with the per-rank clock offsets, round trips and dropped counts of ``parts``."""
    out = dict(base)
    for key, attr, scale in (("clock_offset_us", "offset_ns", 1e-3), ("clock_rtt_us", "rtt_ns", 1e-3),
                             ("dropped_events", "dropped", 1)):
        merged = dict(out.get(key, {}))
        merged.update({str(p.rank): (round(getattr(p, attr) * scale, 3) if scale != 1 else getattr(p, attr))
                       for p in parts})
        out[key] = dict(sorted(merged.items(), key=lambda kv: int(kv[0])))
    out["ranks"] = sorted(int(r) for r in out["clock_offset_us"])
    return out


def document(parts: list[RankPart], base: dict) -> dict:
    """The whole trace: every rank's events, and ``otherData`` from ``base`` and the parts.

    ``base["process_names"]`` (optional, ``{"rank": "name"}``) names the ranks' processes, e.g.
    with their coordinates in a split model's mesh.
    """
    labels = base.get("process_names", {})
    events = [e for part in sorted(parts, key=lambda p: p.rank) for e in rank_events(part, labels.get(str(part.rank)))]
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": other_data(parts, base)}


def merge_into(existing: dict | None, parts: list[RankPart], base: dict) -> dict:
    """``existing`` (a trace of the same job, or None) with ``parts`` replacing those ranks' events."""
    if not existing or existing.get("otherData", {}).get("job") != base.get("job"):
        return document(parts, base)
    mine = {p.rank for p in parts}
    kept = [e for e in existing.get("traceEvents", []) if e.get("pid") not in mine]
    old = existing["otherData"]
    merged_base = {**old, **base}
    merged_base["failed_ranks"] = sorted(set(old.get("failed_ranks", [])) | set(base.get("failed_ranks", [])))
    fresh = document(parts, merged_base)
    fresh["traceEvents"] = sorted(kept + fresh["traceEvents"], key=lambda e: (e.get("pid", 0), e["ph"] != "M"))
    return fresh


def format_of(path) -> str | None:
    """The ``otherData.format`` of the regular JSON trace file at ``path``, or None (not a trace, unreadable)."""
    head = b'{"traceEvents"'
    try:
        with open(path, "rb") as f:
            if f.read(len(head)) != head:
                return None
            f.seek(0)
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    other = doc.get("otherData") if isinstance(doc, dict) else None
    return other.get("format") if isinstance(other, dict) else None


def encode(doc: dict) -> bytes:
    """The JSON bytes of a trace document."""
    return json.dumps(doc, separators=(",", ":")).encode()
