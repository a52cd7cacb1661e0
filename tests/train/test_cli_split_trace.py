"""``--trace`` of a split model (--tp/--pp): stages, micro-batches, sends and receives and the bubble, per rank.

Serial tests that start mpirun themselves (marked slow). A 2-stage run's trace holds, per rank
and traced step, the schedule's forwards and backwards of every micro-batch in the schedule's
order (GPipe and 1F1B differ), the activations and gradients it sent and received (with their
bytes), idle stretches inside the step, and processes named by their mesh coordinates; at four
ranks the data group's bucket all-reduces (--pp 2: two replicas) and the tensor group's
all-reduces (--tp 2 --pp 2) are on it too. The report prints the measured idle share beside
(K-1)/(M+K-1) and draws the step.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from npddp.parallel.model import schedule
from tests.helpers.cli import ok, train
from tests.helpers.trace import nesting_problems, x_events

MLP = ["--model", "mlp", "--hidden", "32", "32", "--dropout", "0.1", "--train-samples", "96", "--val-samples", "32",
       "--batch-size", "8", "--epochs", "1", "--max-steps", "4", "--trace-steps", "2:3", "--progress", "none"]
REPORT = Path(__file__).resolve().parents[2] / "benchmarks" / "report.py"


def compute_order(events, pid: int, step: int) -> list[tuple[str, int]]:
    """(fwd|bwd, micro-batch) of one rank's traced step, in time order."""
    spans = sorted((e["ts"], e["name"]) for e in events if e["pid"] == pid and e["args"]["step"] == step
                   and e["name"].startswith(("forward mb ", "backward mb ")))
    return [(name[0] == "f" and "fwd" or "bwd", int(name.rsplit(" ", 1)[1])) for _, name in spans]


def expected_order(name: str, stage: int, stages: int, micro: int) -> list[tuple[str, int]]:
    return [op for op in schedule(name, stage, stages, micro) if op[0] in ("fwd", "bwd")]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_a_two_stage_trace_has_each_micro_batch_in_the_schedules_order_and_the_report_shows_the_bubble(
        tmp_path, name):
    ok(train(tmp_path, *MLP, "--pp", "2", "--micro-batches", "4", "--pp-schedule", name, "--trace", "t.json", n=2))
    doc = json.loads((tmp_path / "t.json").read_text())
    events = x_events(doc)
    assert nesting_problems(doc) == []
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {0: "rank 0: dp 0, pp 0, tp 0", 1: "rank 1: dp 0, pp 1, tp 0"}
    for pid in (0, 1):
        for step in (2, 3):
            order = compute_order(events, pid, step)
            assert order == expected_order(name, pid, 2, 4), (pid, step, order)
            mine = [e for e in events if e["pid"] == pid and e["args"]["step"] == step]
            moved = sorted(e["name"] for e in mine if e["cat"] == "comm")
            kinds = ("send activation", "recv gradient") if pid == 0 else ("recv activation", "send gradient")
            assert moved == sorted(f"{k} mb {i}" for k in kinds for i in range(4)), moved
            # 2 rows of 32 float32 hidden units per micro-batch
            assert all(e["args"]["bytes"] == 2 * 32 * 4 for e in mine if e["cat"] == "comm")
            step_span = [e for e in mine if e["name"] == f"pipeline {name}"]
            assert len(step_span) == 1 and step_span[0]["args"]["bubble"] == pytest.approx(1 / 5)
            idle = [e for e in mine if e["name"] == "idle (bubble)"]
            assert idle and all(step_span[0]["ts"] <= e["ts"] <= step_span[0]["ts"] + step_span[0]["dur"]
                                for e in idle)
    gpipe, one_f_one_b = expected_order("gpipe", 0, 2, 4), expected_order("1f1b", 0, 2, 4)
    assert gpipe != one_f_one_b                                  # the test tells the schedules apart
    report = subprocess.run([sys.executable, str(REPORT), "t.json", "--outdir", "plots"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stdout + report.stderr
    for step in (2, 3):
        assert f"step {step}: measured idle share " in report.stdout
        assert f"(mean over 2 ranks) beside (K-1)/(M+K-1) = 0.200 (K = 2 stages, M = 4 micro-batches, {name})" \
            in report.stdout
    assert (tmp_path / "plots" / "t_timeline.png").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.parametrize("layout,group", [(["--pp", "2"], "all-reduce bucket"),
                                          (["--tp", "2", "--pp", "2"], "tensor-parallel all-reduce")],
                         ids=["dp2-pp2", "tp2-pp2"])
def test_four_ranks_trace_the_data_and_tensor_groups_all_reduces(tmp_path, layout, group):
    """Each micro-batch's forward and backward in 1F1B order (2 micro-batches), and the group's all-reduces."""
    ok(train(tmp_path, *MLP, *layout, "--trace", "t.json", n=4))
    doc = json.loads((tmp_path / "t.json").read_text())
    events = x_events(doc)
    assert nesting_problems(doc) == [] and doc["otherData"]["ranks"] == [0, 1, 2, 3]
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names[3] == ("rank 3: dp 1, pp 1, tp 0" if "--tp" not in layout else "rank 3: dp 0, pp 1, tp 1")
    for pid in range(4):
        stage = 1 if pid in (2, 3) and "--tp" in layout or pid in (1, 3) and "--tp" not in layout else 0
        for step in (2, 3):
            assert compute_order(events, pid, step) == expected_order("1f1b", stage, 2, 2)
            reduces = [e for e in events
                       if e["pid"] == pid and e["args"]["step"] == step and e["name"].startswith(group)]
            # with --tp the second stage's row-parallel Linear all-reduces in every forward (the first
            # stage's column-parallel one would in backward, but the model's input needs no gradient)
            assert reduces or "--tp" in layout and stage == 0, (pid, step, group)
            assert all(e["args"].get("bytes", 0) > 0 for e in reduces), reduces   # each names its size
