"""Timeline traces of a training step on every rank, in the Chrome trace format (Perfetto).

``recorder``: the per-rank :class:`Tracer` (and the do-nothing :data:`NULL`); ``chrome``: the
events as one JSON document, tracks split into nesting lanes.
"""

from npddp.util.tracing.chrome import CHECKPOINT, COMM, COMPUTE, DATA, OPTIMIZER, STEP, TRACKS
from npddp.util.tracing.recorder import (DEFAULT_STEPS, NULL, STEPS_VARIABLE, TRACE_VARIABLE, NullTracer, Tracer,
                                         from_env, parse_steps, steps_text, unwritable)

__all__ = ["CHECKPOINT", "COMM", "COMPUTE", "DATA", "OPTIMIZER", "STEP", "TRACKS", "DEFAULT_STEPS", "NULL",
           "STEPS_VARIABLE", "TRACE_VARIABLE", "NullTracer", "Tracer", "from_env", "parse_steps",
           "steps_text", "unwritable"]
