"""benchmarks/parallelism.py: which layouts fit a world, and a sweep of the tiny GPT at N = 2 into a dump the report prints."""

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import parallelism as bp
from benchmarks import results

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("layout,n,dims", [
    ("ddp", 2, (2, 1, 1)), ("tp", 2, (1, 2, 1)), ("pp-1f1b", 4, (1, 1, 4)), ("tp2-pp2", 4, (1, 2, 2)),
    ("dp2-pp2", 4, (2, 1, 2)), ("tp2-pp2", 2, None), ("dp2-pp2", 2, None), ("tp", 1, None), ("tp2-pp2", 6, None),
])
def test_a_layout_fits_a_world_or_is_skipped(layout, n, dims):
    assert bp.shape_of(layout, n) == dims


@pytest.mark.slow
def test_the_tiny_gpt_sweep_at_two_ranks_writes_a_dump_the_report_prints(tmp_path):
    out = tmp_path / "par.h5"
    layouts = "ddp,zero3,tp,pp-gpipe,pp-1f1b"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "parallelism.py"), "--sizes", "tiny", "--ranks",
                           "2", "--layouts", layouts, "--steps", "2", "--warmup", "1", "--batch", "4", "--context",
                           "16", "--micro-batches", "2", "--out", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert results.check(out) == []
    table = results.read_table(out)
    assert list(table["layout"]) == layouts.split(",")
    pipe = table[table["pp"] == 2]
    assert (pipe["bubble_theory"] - 1 / 3).abs().max() < 1e-12 and (pipe["bubble"] > 0).all()
    assert (table[table["pp"] == 1]["bubble"] == 0).all()
    assert (table["comm_bytes"] > 0).all() and (table["peak_rss_mib"] > 0).all()
    assert (table["nodes"] == 1).all() and (table["rate"] == "local").all() and table["link_bytes"].isna().all()
    assert (table["sent_bytes"] > 0).all() and (table["peak_rss_min_mib"] <= table["peak_rss_mib"]).all()
    report = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report.py"), str(out)], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "parallelism" in report.stdout and "pp-1f1b" in report.stdout
