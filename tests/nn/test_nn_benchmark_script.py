"""benchmarks/nn.py runs, and its bare NumPy versions agree with the library (it checks first)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "nn.py"


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_benchmark_smoke_run(model):
    out = subprocess.run([sys.executable, str(SCRIPT), "--model", model, "--batch", "3", "--repeats", "2",
                          "--warmup", "1", "--dtype", "float64"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONHASHSEED": "0"})
    assert out.returncode == 0, out.stderr
    assert re.search(rf"{model} +ratio npddp/bare: wall [0-9.]+, cpu [0-9.]+", out.stdout), out.stdout
    assert "gradients agree" in out.stdout


def test_benchmark_rejects_bad_arguments():
    out = subprocess.run([sys.executable, str(SCRIPT), "--repeats", "0"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--repeats must be >= 1" in out.stderr
