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


@pytest.mark.slow
def test_gpt_benchmark_smoke_run_with_or_without_torch():
    out = subprocess.run([sys.executable, str(SCRIPT), "--model", "gpt", "--gpt-size", "tiny", "--context", "8",
                          "--vocab", "32", "--repeats", "1", "--warmup", "0", "--dtype", "float64"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "gpt tiny: 102,656 parameters, vocab 32, context 8, batch 4" in out.stdout, out.stdout
    try:
        import torch  # noqa: F401
    except ImportError:
        assert "torch is not installed: timing npddp alone" in out.stdout
    else:
        assert re.search(r"gpt +ratio npddp/torch: wall [0-9.]+, cpu [0-9.]+ +\(gradients agree to", out.stdout)
        assert "ratio npddp/torch-sdpa" in out.stdout
