"""benchmarks/verify.py: N ranks match one process for every model; a broken average fails; it launches itself."""

import subprocess
import sys

import pytest
from mpi4py import MPI

from benchmarks import verify


@pytest.mark.mpi
def test_every_model_and_sync_matches_one_process(capsys, assert_all_ranks):
    code = verify.main(["--num-steps", "2", "--num-samples", "12"])
    out = capsys.readouterr().out
    printed = ("all 12 checks passed" in out and out.count(" ok\n") == 12) if MPI.COMM_WORLD.Get_rank() == 0 \
        else out == ""
    assert_all_ranks(code == 0 and printed, f"exit {code}\n{out}")


@pytest.mark.mpi(min_size=2)
def test_a_wrong_gradient_average_is_reported_and_exits_1(monkeypatch, capsys, assert_all_ranks):
    from npddp.comm import checks
    monkeypatch.setattr(checks, "average_scale", lambda op, buf, size: 0.0)  # op avg: summed, never scaled by 1/N
    code = verify.main(["--models", "mlp,gpt", "--syncs", "flat", "--num-steps", "2", "--num-samples", "12",
                        "--optimizer", "sgd"])
    out = capsys.readouterr().out
    printed = "FAILED 2 of 2 checks: mlp/flat, gpt/flat" in out if MPI.COMM_WORLD.Get_rank() == 0 else out == ""
    assert_all_ranks(code == 1 and printed, f"exit {code}\n{out}")


@pytest.mark.slow
def test_world_size_launches_the_script_on_that_many_ranks():
    script = str(verify.REPO / "benchmarks" / "verify.py")
    proc = subprocess.run([sys.executable, script, "--world-size", "2", "--models", "gpt", "--syncs", "overlap",
                           "--num-steps", "1", "--num-samples", "4"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "# verify: 2 rank(s)" in proc.stdout and "all 1 checks passed" in proc.stdout
    bad = subprocess.run([sys.executable, script, "--world-size", "2", "--num-samples", "5"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--num-samples 5 does not split over 2 ranks" in bad.stderr
