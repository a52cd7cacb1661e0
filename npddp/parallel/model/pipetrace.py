"""A pipeline step on the timeline: each micro-batch's forward and backward, the sends and receives, the bubble.

:class:`PipelineTrace` records, on a :mod:`npddp.util.tracing` tracer, what one stage does in a
training step (events on the tracks of :mod:`npddp.util.tracing.chrome`):

* ``compute``: ``forward mb i`` and ``backward mb i`` for each micro-batch ``i`` (args ``stage``,
  ``micro_batch``), in the order the schedule runs them; ``recompute mb i`` inside a backward
  that re-runs its forward first; ``idle (bubble)`` for every stretch of the step in which the
  stage computes nothing (waiting for a neighbour, sending, the final exchanges).
* ``comm``: ``send activation mb i``/``recv activation mb i`` and ``send gradient mb
  i``/``recv gradient mb i`` (args ``bytes``, ``peer_stage``; a receive includes the wait for
  its sender), and ``tied embedding sum``.
* ``step``: ``pipeline SCHEDULE`` over the whole step, with ``stages``, ``micro_batches`` and
  the ideal idle share ``bubble`` = (K-1)/(M+K-1) as args.

So the idle share a stage measured is the ``idle (bubble)`` time over its ``pipeline`` event.
With the do-nothing tracer every call is a clock read that returns 0 and nothing is named.
"""

from __future__ import annotations

import time

from npddp.parallel.model.schedules import ideal_bubble
from npddp.util import tracing

#: Schedule operations that compute, and the event name of each kind of operation.
COMPUTE_KINDS = ("fwd", "bwd", "recompute")
LABELS = {"fwd": "forward", "bwd": "backward", "recompute": "recompute", "recv_act": "recv activation",
          "send_act": "send activation", "recv_grad": "recv gradient", "send_grad": "send gradient"}
IDLE = "idle (bubble)"


class PipelineTrace:
    """Records one stage's pipeline steps on ``tracer`` (see the module docstring)."""

    def __init__(self, tracer, stage: int, stages: int, schedule_name: str):
        self.tracer = tracing.NULL if tracer is None else tracer
        self.stage, self.stages, self.schedule_name = stage, stages, schedule_name
        self.step_start = self.busy_until = 0
        self.micro_batches = 0
        self._ids: dict = {}

    def clock(self) -> int:
        """Now in ns while the tracer records, else 0 (then nothing is recorded)."""
        return self.tracer.clock()

    def begin(self, micro_batches: int) -> None:
        """A step of ``micro_batches`` micro-batches starts now."""
        self.micro_batches = micro_batches
        self.step_start = self.busy_until = self.clock()

    def op(self, kind: str, micro_batch: int, t0: int, nbytes: int = 0) -> None:
        """Operation ``kind`` of the schedule on ``micro_batch`` ran from ``t0`` until now."""
        if not t0:
            return
        t1 = time.perf_counter_ns()
        if kind in ("fwd", "bwd"):
            self._idle_until(t0)
            self.busy_until = t1
        track = tracing.COMPUTE if kind in COMPUTE_KINDS else tracing.COMM
        if kind in COMPUTE_KINDS:
            name = self._name(f"{LABELS[kind]} mb {micro_batch}", stage=self.stage, micro_batch=micro_batch)
        else:
            peer = self.stage - 1 if kind in ("recv_act", "send_grad") else self.stage + 1
            name = self._name(f"{LABELS[kind]} mb {micro_batch}", stage=self.stage, micro_batch=micro_batch,
                              peer_stage=peer, bytes=int(nbytes))
        self.tracer.span(t0, t1, name, track)

    def tied(self, t0: int, nbytes: int) -> None:
        """The exchange of the tied embedding's gradient ran from ``t0`` until now."""
        if t0:
            self.tracer.add(t0, self._name("tied embedding sum", stage=self.stage, bytes=int(nbytes)), tracing.COMM)

    def end(self) -> None:
        """The step ends now: the idle stretch after the last computation, and the step's event."""
        if not self.step_start:
            return
        t1 = self.clock()
        self._idle_until(t1)
        m = self.micro_batches
        self.tracer.span(self.step_start, t1, self._name(
            f"pipeline {self.schedule_name}", stage=self.stage, stages=self.stages, micro_batches=m,
            schedule=self.schedule_name, bubble=round(ideal_bubble(self.stages, m), 6)), tracing.STEP)
        self.step_start = 0

    def _idle_until(self, t: int) -> None:
        """Record the stretch since the last computation ended as idle, when there is one."""
        if t > self.busy_until:
            self.tracer.span(self.busy_until, t, self._name(IDLE, stage=self.stage), tracing.COMPUTE)

    def _name(self, text: str, **args) -> int:
        """The tracer's id of ``text`` with ``args``, named once."""
        key = (text, *args.values())
        found = self._ids.get(key)
        if found is None:
            found = self._ids[key] = self.tracer.name(text, **args)
        return found
