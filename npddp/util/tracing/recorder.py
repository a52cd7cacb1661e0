"""Per-rank timeline recording: a bounded event buffer, clocks aligned to rank 0, one file per job.

A :class:`Tracer` records complete events (name, track, start, end, step) into a list of
``capacity`` slots allocated up front; names and their constant arguments are interned once
(:meth:`Tracer.name`), so recording an event stores five integers. It records only during the
steps of its window (``steps``, counted from 1 as in the metrics); :meth:`Tracer.at_step`,
called once per optimizer step, moves it along, and when the window's last step ends every
rank sends its events to rank 0 (NumPy buffers and a name table as bytes, no pickling), which
writes the file atomically. :meth:`Tracer.close` does the same for a run that ends before the
window does; :meth:`Tracer.write_partial` is the failure path: no communication, this rank's
events merged into the file under a lock on its directory (each rank that gets there adds
its own), never half a file.

Writing never raises and never replaces what is not a trace: a path that is not a regular file
(a FIFO, a device such as /dev/null) or holds a file that is not an npddp trace is left alone,
and a write that fails (a full disk, a file-size limit) keeps the previous file; either way
:attr:`Tracer.failure` holds one line saying why, for the caller to report once training is
done (the training CLI exits 4; a tracer from ``NPDDP_TRACE`` prints it as a warning).

:data:`NULL` is the tracer of an untraced run: every method does nothing, and the layers are
not wrapped at all (:meth:`npddp.nn.Module.trace_layers`), so the hot path is unchanged.

Clocks: ``time.perf_counter_ns``. At construction each rank measures its offset to rank 0
(:mod:`npddp.util.tracing.clocks`) and every time written is on rank 0's clock; the offsets are
in the file's ``otherData``.
The communicator is used through ``rank``, ``size``, ``send`` and ``recv`` only.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from npddp.util import variables
from npddp.util.atomicfile import target_problem, write_bytes_atomic
from npddp.util.tracing import chrome
from npddp.util.tracing.clocks import TAG, clock_offset, job_origin

#: Environment variables that turn tracing on for any script using DDP.
TRACE_VARIABLE, STEPS_VARIABLE = variables.TRACE.name, variables.TRACE_STEPS.name
#: Steps traced by default (first:last, from 1, both included): a few steps after warm-up.
DEFAULT_STEPS = variables.TRACE_STEPS.default
#: Events one rank keeps at most; later ones are counted as dropped.
CAPACITY = 1 << 17


def parse_steps(text: str) -> tuple[int, int]:
    """``"A:B"`` (or ``"A"``) -> (A, B): the optimizer steps traced, from 1, both included."""
    first, sep, last = str(text).strip().partition(":")
    try:
        a, b = int(first), int(last if sep else first)
    except ValueError:
        raise ValueError(f"trace steps {text!r} are not FIRST:LAST (whole numbers, e.g. {DEFAULT_STEPS})") from None
    if not 1 <= a <= b:
        raise ValueError(f"trace steps {text!r}: need 1 <= FIRST <= LAST (steps count from 1)")
    return a, b


def steps_text(text: str) -> str:
    """``text`` checked by :func:`parse_steps`, as ``"A:B"``."""
    first, last = parse_steps(text)
    return f"{first}:{last}"


def unwritable(path, overwrite: bool = True, resuming: bool = False, flag: str = "--trace") -> str | None:
    """Why a trace cannot be written to ``path`` (a message naming ``flag``), or None when it can.

    Refused: what :func:`npddp.util.atomicfile.target_problem` refuses, an existing file that is
    not an npddp trace, and (``overwrite`` and ``resuming`` false) an existing trace.
    """
    where = f"{flag} {os.fspath(path)!r}"
    problem = target_problem(where, path)
    if problem or not os.path.lexists(path):
        return problem
    if chrome.format_of(path) != chrome.FORMAT:
        return f"{where} exists and is not an npddp trace; refusing to replace it (move it away or choose another path)"
    if not overwrite and not resuming:
        return (f"{where} already holds a trace (of an earlier run); refusing to overwrite it: pass --overwrite "
                "to replace it, or choose another path")
    return None


class NullTracer:
    """The tracer of an untraced run: records nothing, writes nothing."""

    failure = None

    enabled = False
    recording = False

    def name(self, text: str, **args) -> int:
        return 0

    @property
    def recorded(self) -> int:
        """Events held so far: none."""
        return 0

    def describe(self, **meta) -> None:
        return None

    def clock(self) -> int:
        return 0

    def add(self, t0: int, name: int, track: int) -> None:
        return None

    def span(self, t0: int, t1: int, name: int, track: int) -> None:
        return None

    def wrap(self, fn, name: int, track: int):
        return fn

    def timed(self, iterable, name: int, track: int):
        return iterable

    def at_step(self, done: int) -> None:
        return None

    def close(self) -> None:
        return None

    def write_partial(self, reason: str) -> None:
        return None


NULL = NullTracer()


def _padded(data: bytes) -> np.ndarray:
    """``data`` zero-padded to whole int64 words, as int64."""
    return np.frombuffer(data + b"\0" * (-len(data) % 8), dtype=np.int64)


class Tracer:
    """Records this rank's events during steps ``steps`` and writes the job's trace to ``path``."""

    enabled = True

    def __init__(self, path, comm, steps=DEFAULT_STEPS, capacity: int = CAPACITY, meta: dict | None = None,
                 flag: str = "--trace", warn: bool = False):
        self.path = Path(path)
        self.flag, self.warn = flag, warn      # how messages name the path; print a failure at once
        self.failure: str | None = None        # why the file could not be written (rank 0's write, or this rank's)
        self.first, self.last = parse_steps(steps) if isinstance(steps, str) else tuple(steps)
        if not 1 <= self.first <= self.last:
            raise ValueError(f"trace steps {steps!r}: need 1 <= first <= last")
        if capacity < 1:
            raise ValueError(f"trace capacity must be >= 1, got {capacity}")
        self.comm = comm
        self.meta = dict(meta or {})          # written into the file's otherData (run config, backend, ...)
        self._slots: list = [None] * capacity  # the bounded buffer: (name, track, start, end, step)
        self._count = 0
        self.dropped = 0
        self._names: list[str] = []
        self._ids: dict[str, int] = {}
        self.offset_ns, self.rtt_ns = clock_offset(comm)
        self.origin_ns, self.job = job_origin(comm)
        self.step = 1                         # the optimizer step in progress, from 1
        self._step_start = time.perf_counter_ns()
        self.recording = self.first <= 1
        self.written = False

    @property
    def recorded(self) -> int:
        """Events held so far (at most the capacity; the rest are counted in ``dropped``)."""
        return self._count

    def describe(self, **meta) -> None:
        """Add ``meta`` (JSON values: the run's config, backend, ...) to the file's ``otherData``."""
        self.meta.update(meta)

    # --- recording (hot path) --------------------------------------------------------
    def name(self, text: str, **args) -> int:
        """The id of event name ``text`` with constant arguments ``args`` (JSON values)."""
        key = text + (chrome.ARG_SEPARATOR + json.dumps(args, sort_keys=True) if args else "")
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = len(self._names)
            self._names.append(key)
        return found

    def clock(self) -> int:
        """Now in ns while recording, else 0 (then :meth:`add` ignores the event)."""
        return time.perf_counter_ns() if self.recording else 0

    def add(self, t0: int, name: int, track: int) -> None:
        """Record event ``name`` on ``track`` from ``t0`` (a :meth:`clock` reading) until now."""
        if t0:
            self._record(name, track, t0, time.perf_counter_ns())

    def span(self, t0: int, t1: int, name: int, track: int) -> None:
        """Record event ``name`` on ``track`` from ``t0`` to ``t1`` (both :meth:`clock` readings; 0: ignored)."""
        if t0 and t1:
            self._record(name, track, t0, t1)

    def _record(self, name: int, track: int, t0: int, t1: int) -> None:
        """Store one event in the next free slot (or count it as dropped)."""
        if self._count < len(self._slots):
            self._slots[self._count] = (name, track, t0, t1, self.step)
            self._count += 1
        else:
            self.dropped += 1

    def wrap(self, fn, name: int, track: int):
        """``fn`` recording each call as event ``name`` on ``track``."""
        now, record = time.perf_counter_ns, self._record

        def traced(*args, **kwargs):
            if not self.recording:
                return fn(*args, **kwargs)
            t0 = now()
            out = fn(*args, **kwargs)
            record(name, track, t0, now())
            return out
        traced.__wrapped__ = fn
        return traced

    def timed(self, iterable, name: int, track: int):
        """``iterable``, recording the time each item takes to produce as event ``name``."""
        it = iter(iterable)
        while True:
            t0 = self.clock()
            try:
                item = next(it)
            except StopIteration:
                return
            self.add(t0, name, track)
            yield item

    def at_step(self, done: int) -> None:
        """``done`` optimizer steps are complete: close the step's event, move the window, write at its end."""
        now = time.perf_counter_ns()
        if self.recording and done == self.step:
            self._record(self.name(f"step {done}"), chrome.STEP, self._step_start, now)
        finished = done == self.step
        self.step, self._step_start = done + 1, now
        self.recording = not self.written and self.first <= self.step <= self.last
        if finished and done == self.last and not self.written:
            self.close()

    # --- writing ---------------------------------------------------------------------
    def _part(self) -> chrome.RankPart:
        """This rank's events on rank 0's clock, measured from the job's origin."""
        events = np.array(self._slots[:self._count], dtype=np.int64).reshape(-1, len(chrome.COLUMNS))
        events[:, 2:4] += self.offset_ns - self.origin_ns
        return chrome.RankPart(self.comm.rank, events, list(self._names), self.offset_ns, self.rtt_ns,
                               self.dropped)

    def _base(self, complete: bool, reason: str = "") -> dict:
        """``otherData`` of the file, without the per-rank facts."""
        return {"format": chrome.FORMAT, "version": chrome.VERSION, "job": self.job,
                "world_size": self.comm.size, "trace_steps": [self.first, self.last],
                "clock": "time.perf_counter_ns of each rank moved onto rank 0's by the offsets below "
                         "(min-RTT ping-pong at start-up)",
                "complete": complete, **({"reason": reason} if reason else {}), **self.meta}

    def close(self) -> None:
        """Send every rank's events to rank 0, which writes the file (collective; once)."""
        if self.written:
            return
        self.written, self.recording = True, False
        part = self._part()
        blob = "\n".join(part.names).encode()
        head = np.array([part.events.shape[0], len(blob), part.offset_ns, part.rtt_ns, part.dropped],
                        dtype=np.int64)
        comm = self.comm
        if comm.rank != 0:
            comm.send(head, dest=0, tag=TAG)
            if head[0]:
                comm.send(np.ascontiguousarray(part.events), dest=0, tag=TAG)
            if head[1]:
                comm.send(_padded(blob), dest=0, tag=TAG)
            return
        parts = [part]
        for peer in range(1, comm.size):
            comm.recv(head, source=peer, tag=TAG)
            n, nbytes, offset, rtt, dropped = (int(v) for v in head)
            events = np.zeros((n, len(chrome.COLUMNS)), dtype=np.int64)
            if n:
                comm.recv(events, source=peer, tag=TAG)
            raw = np.zeros((nbytes + 7) // 8, dtype=np.int64)
            if nbytes:
                comm.recv(raw, source=peer, tag=TAG)
            names = raw.tobytes()[:nbytes].decode().split("\n") if nbytes else []
            parts.append(chrome.RankPart(peer, events, names, offset, rtt, dropped))
        if not self._refused():
            self._write(chrome.encode(chrome.document(parts, self._base(True))))

    def write_partial(self, reason: str) -> None:
        """Failure path, no communication: merge this rank's events into the file (under a lock)."""
        if self.written:
            return
        self.written, self.recording = True, False
        base = {**self._base(False, reason), "failed_ranks": [self.comm.rank]}
        if self._refused():
            return
        try:
            with _locked(self.path.parent):
                try:
                    existing = json.loads(self.path.read_bytes())
                except (OSError, ValueError):
                    existing = None
                self._write(chrome.encode(chrome.merge_into(existing, [self._part()], base)))
        except OSError as exc:
            self._fail(f"cannot write the trace {self.path}: {exc.strerror or exc}")

    def _refused(self) -> bool:
        """True (and :attr:`failure` set) when the path is not one a trace may replace."""
        problem = unwritable(self.path, flag=self.flag)
        if problem:
            self._fail(f"{problem}; the trace is not written")
        return problem is not None

    def _write(self, data: bytes) -> None:
        """Replace the file with ``data`` atomically; a failure is kept in :attr:`failure`, not raised."""
        try:
            write_bytes_atomic(self.path, data)
        except OSError as exc:
            self._fail(f"cannot write the trace {self.path}: {exc.strerror or exc}; the previous file is kept")

    def _fail(self, message: str) -> None:
        self.failure = message
        if self.warn:
            print(f"warning: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(directory: Path):
    """An exclusive flock on ``directory`` itself (nothing is left behind)."""
    fd = os.open(directory if str(directory) else ".", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def from_env(comm, environ=None, meta: dict | None = None):
    """A Tracer when ``NPDDP_TRACE`` names a file (steps from ``NPDDP_TRACE_STEPS``), else :data:`NULL`."""
    environ = os.environ if environ is None else environ
    path = variables.text(variables.TRACE, environ)
    if not path:
        return NULL
    steps = variables.text(variables.TRACE_STEPS, environ) or DEFAULT_STEPS
    try:
        parse_steps(steps)
    except ValueError as exc:
        raise ValueError(f"{STEPS_VARIABLE}: {exc}") from None
    return Tracer(path, comm, steps, meta=meta, flag=TRACE_VARIABLE, warn=True)
