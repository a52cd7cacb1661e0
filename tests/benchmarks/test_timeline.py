"""The report's trace part (benchmarks/_timeline.py) on a hand-made trace whose figures are known."""

import json

import numpy as np
import pytest

from benchmarks import _timeline as tl
from benchmarks import report
from npddp.util.tracing import chrome

# per rank: backward 100..500 us; all-reduces 300..700 (bucket 0) and 400..600 (bucket 1, rank 1 late by 50)
EVENTS = {r: np.array([[0, chrome.COMPUTE, 100_000, 500_000, 1],
                       [1, chrome.COMM, 300_000, 700_000, 1],
                       [2, chrome.COMM, 400_000 + 50_000 * r, 600_000 + 50_000 * r, 1],
                       [3, chrome.OPTIMIZER, 800_000, 900_000, 1]], dtype=np.int64) for r in (0, 1)}
NAMES = ["backward", 'all-reduce bucket 0\x1f{"bucket": 0}', 'all-reduce bucket 1\x1f{"bucket": 1}', "optimizer step"]


@pytest.fixture
def doc():
    return chrome.document([chrome.RankPart(r, EVENTS[r], NAMES) for r in (0, 1)], {"job": 1, "trace_steps": [1, 1]})


def test_hidden_and_exposed_communication_split_at_the_end_of_backward(doc):
    rows = tl.step_rows(doc)
    assert [(r["rank"], r["backward_ms"], r["comm_ms"], r["hidden_ms"], r["exposed_ms"]) for r in rows] == [
        (0, 0.4, 0.4, 0.2, 0.2), (1, 0.4, 0.4, 0.2, 0.2)]


def test_lateness_names_the_rank_that_issued_last(doc):
    late = {r["all_reduce"]: (r["slowest_rank"], r["lateness_ms"]) for r in tl.lateness_rows(doc)}
    assert late == {"all-reduce bucket 0": (0, 0.0), "all-reduce bucket 1": (1, 0.05)}


@pytest.mark.parametrize("spans, lo, hi, length", [([(0, 2), (1, 3)], -np.inf, np.inf, 3), ([(0, 1), (2, 3)], 0.5, 2.5, 1),
                                                   ([], 0, 1, 0), ([(0, 10), (2, 3)], 4, 6, 2)])
def test_union_length(spans, lo, hi, length):
    assert tl.union_length(spans, lo, hi) == length


def test_report_prints_the_figures_and_draws_the_timeline(tmp_path, doc, capsys):
    pytest.importorskip("matplotlib")
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    assert report.main([str(path), "--outdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "hidden" in out and "all-reduce bucket 1" in out
    assert (tmp_path / "t_timeline.png").stat().st_size > 1000
    assert report.main([str(path), "--trace-step", "7", "--outdir", str(tmp_path)]) == 2
