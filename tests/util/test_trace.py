"""The timeline recorder (npddp.util.tracing) on one process: window, buffer, lanes, file, layer hooks.

Under mpirun the same DDP paths are checked end to end by tests/train/test_cli_trace.py.
"""

import json

import numpy as np
import pytest

from npddp.nn import CrossEntropyLoss, mlp
from npddp.optim import SGD
from npddp.parallel.ddp import DistributedDataParallel
from npddp.util import tracing
from npddp.util.tracing import chrome
from tests.helpers.fakes import OneRank
from tests.helpers.trace import nesting_problems, x_events


class Rank(OneRank):
    """Rank ``r`` of a world whose other ranks never answer: only for the failure path."""

    def __init__(self, r, size):
        self.rank, self.size = r, size

    def send(self, buf, dest, tag=0):
        raise AssertionError("the failure path must not communicate")

    recv = send


# ----------------------------------------------------------------------------- steps and lanes

@pytest.mark.parametrize("text, expected", [("3:5", (3, 5)), ("1", (1, 1)), (" 2:2 ", (2, 2)), ("1:100", (1, 100))])
def test_trace_steps_parse(text, expected):
    assert tracing.parse_steps(text) == expected
    assert tracing.steps_text(text) == f"{expected[0]}:{expected[1]}"


@pytest.mark.parametrize("text", ["0:3", "5:3", "a:b", "", "3:", "-1:2", "1.5:2"])
def test_bad_trace_steps_name_the_value_and_the_rule(text):
    with pytest.raises(ValueError, match="trace steps") as info:
        tracing.parse_steps(text)
    assert repr(text.strip()) in str(info.value) or repr(text) in str(info.value)


@pytest.mark.parametrize("seed", range(20))
def test_lanes_hold_only_nesting_or_disjoint_intervals(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    starts = rng.integers(0, 1000, n)
    ends = starts + rng.integers(0, 300, n)
    lanes = chrome.assign_lanes(starts, ends)
    for lane in np.unique(lanes):
        spans = [(int(s), int(e)) for s, e, l in zip(starts, ends, lanes) if l == lane]
        for i, (s1, e1) in enumerate(spans):
            for s2, e2 in spans[i + 1:]:
                assert not (s1 < e2 and s2 < e1) or (s1 <= s2 and e2 <= e1) or (s2 <= s1 and e1 <= e2)
    # a nest of intervals needs one lane; k intervals all overlapping each other's ends need k
    assert chrome.assign_lanes(np.arange(5), 100 - np.arange(5)).max() == 0
    assert chrome.assign_lanes(np.arange(5), 100 + np.arange(5)).max() == 4


# ----------------------------------------------------------------------------- the recorder

def test_records_only_the_window_and_writes_valid_nesting_json(tmp_path):
    path = tmp_path / "t.json"
    tr = tracing.Tracer(path, OneRank(), "2:3")
    outer, inner = tr.name("outer", k=1), tr.name("inner")
    for step in range(1, 6):
        assert tr.recording == (2 <= step <= 3)
        t0 = tr.clock()
        t1 = tr.clock()
        tr.add(t1, inner, tracing.COMPUTE)
        tr.add(t0, outer, tracing.COMPUTE)
        tr.at_step(step)
        assert path.exists() == (step >= 3)      # written when the window's last step ends
    doc = json.loads(path.read_text())
    events = x_events(doc)
    assert sorted({e["args"]["step"] for e in events}) == [2, 3]
    assert sorted(e["name"] for e in events) == ["inner", "inner", "outer", "outer", "step 2", "step 3"]
    assert all(e["args"]["k"] == 1 for e in events if e["name"] == "outer")
    assert nesting_problems(doc) == []
    assert doc["displayTimeUnit"] == "ms" and doc["otherData"]["complete"] is True
    assert doc["otherData"]["ranks"] == [0] and doc["otherData"]["trace_steps"] == [2, 3]
    names = {(e["name"], e["args"].get("name")) for e in doc["traceEvents"] if e["ph"] == "M"}
    assert ("process_name", "rank 0") in names and ("thread_name", "compute") in names
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "step")
    assert steps[0][1] <= steps[1][0]         # consecutive steps touch, never overlap


def test_overlapping_events_of_one_track_go_to_separate_lanes():
    # (name, track, start ns, end ns, step): two all-reduces in flight at once inside a backward
    events = np.array([[0, tracing.COMM, 1000, 5000, 1], [1, tracing.COMM, 2000, 7000, 1],
                       [2, tracing.COMM, 5500, 6000, 1], [3, tracing.COMPUTE, 0, 4000, 1]], dtype=np.int64)
    part = chrome.RankPart(1, events, ["a", "b", "c", "backward"])
    doc = chrome.document([part], {"job": 1})
    tids = {e["name"]: e["tid"] for e in x_events(doc)}
    assert tids["a"] != tids["b"] and tids["c"] == tids["a"]          # c follows a in a's lane
    assert nesting_problems(doc) == []
    threads = {e["tid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert sorted(threads.values()) == ["comm", "comm 2", "compute"]
    assert {e["pid"] for e in doc["traceEvents"]} == {1}
    assert [(e["ts"], e["dur"]) for e in x_events(doc)] == [(1, 4), (2, 5), (5, 1), (0, 4)]


def test_a_full_buffer_drops_and_counts_instead_of_growing(tmp_path):
    tr = tracing.Tracer(tmp_path / "t.json", OneRank(), "1:1", capacity=4)
    n = tr.name("e")
    for _ in range(10):
        tr.add(tr.clock(), n, tracing.COMPUTE)
    assert tr.recorded == 4 and tr.dropped == 6 and tracing.NULL.recorded == 0   # what trace_overhead.py reads
    tr.close()
    doc = json.loads((tmp_path / "t.json").read_text())
    assert len(x_events(doc)) == 4 and doc["otherData"]["dropped_events"] == {"0": 6}


def test_the_failure_path_merges_each_ranks_part_without_communicating(tmp_path):
    path = tmp_path / "t.json"
    tracers = [tracing.Tracer(path, OneRank(), "1:9") for _ in range(3)]
    for r, tr in enumerate(tracers):          # same job, ranks 0..2 of a world of 3
        tr.comm, tr.job = Rank(r, 3), tracers[0].job
        tr.add(tr.clock(), tr.name(f"work {r}"), tracing.COMPUTE)
    tracers[2].write_partial("rank 2: boom")
    first = json.loads(path.read_text())
    assert {e["pid"] for e in x_events(first)} == {2} and first["otherData"]["complete"] is False
    tracers[0].write_partial("rank 0: boom")
    doc = json.loads(path.read_text())
    assert {e["pid"] for e in x_events(doc)} == {0, 2}
    assert doc["otherData"]["failed_ranks"] == [0, 2] and doc["otherData"]["ranks"] == [0, 2]
    other = tracing.Tracer(path, OneRank(), "1:9")   # another job's failure replaces the file
    other.comm = Rank(1, 3)
    other.add(other.clock(), other.name("other"), tracing.COMPUTE)
    other.write_partial("x")
    assert {e["pid"] for e in x_events(json.loads(path.read_text()))} == {1}
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]   # nothing else left behind


def test_trace_from_the_environment():
    assert tracing.from_env(OneRank(), environ={}) is tracing.NULL
    with pytest.raises(ValueError, match="NPDDP_TRACE_STEPS"):
        tracing.from_env(OneRank(), environ={"NPDDP_TRACE": "t.json", "NPDDP_TRACE_STEPS": "0:1"})
    tr = tracing.from_env(OneRank(), environ={"NPDDP_TRACE": "t.json", "NPDDP_TRACE_STEPS": "4:7"})
    assert (tr.first, tr.last, tr.path.name) == (4, 7, "t.json")


# ----------------------------------------------------------------------------- hooks

def test_untraced_layers_are_not_wrapped_and_tracing_can_be_undone(tmp_path):
    model = mlp(8, [6, 5], 3, dtype=np.float64)
    originals = {name: (m.forward, m.backward) for name, m in model.named_modules()}
    model.trace_layers(tracing.NULL, tracing.COMPUTE)
    assert all("forward" not in vars(m) and "backward" not in vars(m) for _, m in model.named_modules())
    tr = tracing.Tracer(tmp_path / "t.json", OneRank(), "1:1")
    model.trace_layers(tr, tracing.COMPUTE)
    assert all("forward" in vars(m) for _, m in model.named_modules())
    model.trace_layers(tracing.NULL, tracing.COMPUTE)
    assert {name: (m.forward, m.backward) for name, m in model.named_modules()} == originals


@pytest.mark.parametrize("sync", ["overlap", "bucketed", "per_param"])
def test_ddp_records_every_layer_and_bucket_of_the_traced_steps(tmp_path, sync):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 8)), rng.integers(0, 3, 16)
    path = tmp_path / "t.json"
    plain, traced = (mlp(8, [6, 5], 3, dtype=np.float64) for _ in range(2))
    runs = []
    for model, tracer in ((plain, tracing.NULL), (traced, tracing.Tracer(path, OneRank(), "2:3"))):
        ddp = DistributedDataParallel(model, OneRank(), sync=sync, bucket_cap_mb=1e-4, tracer=tracer)
        opt, loss = SGD(ddp.parameters(), lr=0.1), CrossEntropyLoss()
        for _ in range(4):
            ddp.zero_grad()
            loss.forward(ddp(x), y)
            ddp.backward(loss.backward())
            ddp.step(opt)
        runs.append(ddp)
    for (_, a), (_, b) in zip(plain.named_parameters(), traced.named_parameters()):
        np.testing.assert_array_equal(a.data, b.data)        # tracing changes no result
    doc = json.loads(path.read_text())
    events = x_events(doc)
    layers = [name for name, _ in traced.named_modules() if name]
    for step in (2, 3):
        names = [e["name"] for e in events if e["args"]["step"] == step]
        assert sorted(n for n in names if n.startswith("backward ")) == sorted(f"backward {n}" for n in layers)
        assert sorted(n for n in names if n.startswith("forward ")) == sorted(f"forward {n}" for n in layers)
        assert {"forward", "backward", "optimizer step", f"step {step}"} <= set(names)
    assert nesting_problems(doc) == []
    assert doc["otherData"]["trace_steps"] == [2, 3]


def test_ddp_on_one_rank_records_buckets_only_when_it_reduces(tmp_path):
    """A world of one reduces nothing, so a DDP over it records no all-reduce (there is none)."""
    path = tmp_path / "t.json"
    ddp = DistributedDataParallel(mlp(8, [6], 3), OneRank(), tracer=tracing.Tracer(path, OneRank(), "1:1"))
    loss = CrossEntropyLoss()
    loss.forward(ddp(np.ones((2, 8), np.float32)), np.array([0, 1]))
    ddp.backward(loss.backward())
    ddp.step(SGD(ddp.parameters(), lr=0.1))
    doc = json.loads(path.read_text())
    assert not [e for e in x_events(doc) if e["cat"] == "comm"]
    assert [e for e in x_events(doc) if e["name"] == "backward 0"]
