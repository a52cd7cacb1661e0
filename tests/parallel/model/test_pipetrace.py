"""A pipeline step on the timeline (serial: one stage, a world of one): micro-batches in order, idle fills the rest.

The pipeline's own events of a step tile it: its micro-batches' forwards and backwards (in the
schedule's order; GPipe re-runs a forward before its backward when another ran since) and the
idle stretches between them add up to the ``pipeline`` event, none overlapping another.
"""

import json

import numpy as np
import pytest

from npddp.nn import CrossEntropyLoss, mlp
from npddp.optim import SGD
from npddp.parallel.model import Pipeline, PipelineStage, schedule
from npddp.parallel.model.schedules import ideal_bubble
from npddp.util import tracing
from tests.helpers.fakes import OneRank


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_one_stage_step_is_its_micro_batches_and_idle_stretches_in_order(tmp_path, name):
    tracer = tracing.Tracer(tmp_path / "t.json", OneRank(), "1:1")
    stage = PipelineStage(mlp(6, [8], 3, dtype=np.float64), 1, 0)
    pipe = Pipeline(stage, OneRank(), CrossEntropyLoss(), 3, name, tracer=tracer)
    rng = np.random.default_rng(0)
    pipe.zero_grad()
    pipe.train_step(rng.normal(size=(7, 6)), rng.integers(0, 3, size=7))
    pipe.step(SGD(pipe.parameters(), lr=0.1))
    tracer.at_step(1)                                        # the window's last step: the file is written
    doc = json.loads((tmp_path / "t.json").read_text())
    events = sorted((e for e in doc["traceEvents"] if e["ph"] == "X"), key=lambda e: (e["ts"], -e["dur"]))
    mine = [e for e in events if e["name"].startswith(("forward mb ", "backward mb ")) or e["name"] == "idle (bubble)"]
    labels = {"fwd": "forward", "bwd": "backward"}
    assert [e["name"] for e in mine if " mb " in e["name"]] == [
        f"{labels[kind]} mb {i}" for kind, i in schedule(name, 0, 1, 3) if kind in labels]
    recomputed = [e for e in events if e["name"].startswith("recompute mb ")]     # inside their backward
    assert len(recomputed) == (3 if name == "gpipe" else 0)
    step = [e for e in events if e["name"] == f"pipeline {name}"]
    assert len(step) == 1 and step[0]["args"] == {"stage": 0, "stages": 1, "micro_batches": 3, "schedule": name,
                                                  "bubble": 0.0, "step": 1}
    start, end = step[0]["ts"], step[0]["ts"] + step[0]["dur"]
    for a, b in zip(mine, mine[1:]):                         # no overlap (times are floored to microseconds)
        assert a["ts"] + a["dur"] <= b["ts"] + 1, (a, b)
    assert all(start <= e["ts"] and e["ts"] + e["dur"] <= end + 1 for e in mine)
    assert abs(sum(e["dur"] for e in mine) - step[0]["dur"]) <= 2 * len(mine) + 2
    assert any(e["name"] == "optimizer step" and e["cat"] == "optimizer" for e in events)


def test_the_ideal_bubble_is_k_minus_1_over_m_plus_k_minus_1():
    assert ideal_bubble(2, 4) == pytest.approx(0.2) and ideal_bubble(4, 4) == pytest.approx(3 / 7)
    assert ideal_bubble(1, 5) == 0.0


def test_an_untraced_pipeline_records_nothing():
    pipe = Pipeline(PipelineStage(mlp(4, [4], 2), 1, 0), OneRank(), CrossEntropyLoss(), 2, "gpipe")
    assert pipe.tracer is tracing.NULL and pipe.trace.clock() == 0
    pipe.train_step(np.ones((4, 4), np.float32), np.zeros(4, np.int64))
