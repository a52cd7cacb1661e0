"""benchmarks/hooks.py: argument checks and one short run on one rank (bytes per step fall with PowerSGD)."""

import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import hooks


def test_bad_arguments_name_the_valid_values(capsys):
    for argv, words in ((["--hooks", "zip"], "unknown 'zip'"), (["--models", "resnet"], "unknown 'resnet'"),
                        (["--steps", "5", "--powersgd-start-iter", "5"], "must exceed"),
                        (["--csv", "/dev/null"], "--csv '/dev/null'"),
                        (["--csv", "/nonexistent-folder/t.csv"], "--csv '/nonexistent-folder/t.csv'")):
        with pytest.raises(SystemExit):
            hooks.parse_args(argv)
        assert words in capsys.readouterr().err


@pytest.mark.slow
def test_a_short_run_on_two_ranks_prints_powersgd_sending_far_less():
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "-m", "npddp.run", "--nproc", "2", "benchmarks/hooks.py", "--backend", "ring",
                          "--models", "gpt", "--hooks", "allreduce,powersgd1", "--steps", "4", "--powersgd-start-iter", "2"],
                         cwd=root, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [line.split() for line in run.stdout.splitlines() if line.startswith("  gpt")]
    assert [r[2] for r in rows] == ["allreduce", "powersgd1"], run.stdout
    assert float(rows[1][4]) < 0.1 * float(rows[0][4]), run.stdout  # the "vs allreduce" column
