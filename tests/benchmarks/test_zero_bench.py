"""benchmarks/zero.py: the issue's byte formula, and a tiny sweep whose held bytes match it where the stage allows."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import zero as bz

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "zero.py"


@pytest.mark.parametrize("stage, n, want", [(0, 4, 16), (1, 4, 8 + 2), (2, 2, 4 + 6), (3, 4, 4), (3, 1, 16)])
def test_formula_bytes_per_parameter(stage, n, want):
    assert bz.formula_bytes(stage, 1000, n) == pytest.approx(want * 1000)


@pytest.mark.slow
def test_a_tiny_sweep_reports_every_stage_with_held_bytes_and_a_paired_ratio(tmp_path):
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "tiny", "--ranks", "2", "--stages", "0,1,3",
                           "--steps", "2", "--warmup", "0", "--context", "8", "--batch", "1", "--paired",
                           "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())
    plain = {r["stage"]: r for r in rows if not r.get("paired")}
    paired = [r for r in rows if r.get("paired")]
    assert sorted(plain) == [0, 1, 3] and sorted(r["stage"] for r in paired) == [1, 3]
    psi = plain[0]["psi"]
    assert plain[0]["held_bytes"] == plain[0]["formula_bytes"] == 16 * psi
    # stage 1 shards whole parameters (greedy), stage 3 pads each group to a multiple of N
    assert abs(plain[1]["held_bytes"] - plain[1]["formula_bytes"]) < 0.05 * plain[1]["formula_bytes"]
    assert plain[3]["formula_bytes"] <= plain[3]["held_bytes"] < plain[3]["formula_bytes"] + 64 * 16
    assert all(r["peak_rss"] > 0 and r["step_s"] > 0 for r in rows)
    assert all(r["ratio_min"] <= r["ratio"] <= r["ratio_max"] for r in paired)
