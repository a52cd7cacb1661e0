"""benchmarks/scaling.sh: its arguments, and a quick matrix on one rank that writes every dump and the report."""

import os
import subprocess
import sys

import pytest

from benchmarks.results import read_table
from tests.helpers.jobs import ROOT, outside_env

SCRIPT = ROOT / "benchmarks" / "scaling.sh"


def run(*args, timeout=180):
    env = outside_env()
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_help_names_every_option():
    out = run("--help")
    assert out.returncode == 0
    for option in ("--ranks", "--out", "--threads", "--quick"):
        assert option in out.stdout


@pytest.mark.parametrize("args, named", [
    (["--ranks", "2,x"], "--ranks '2,x'"),
    (["--threads", "0"], "--threads '0'"),
    (["--bogus"], "'--bogus'"),
])
def test_bad_arguments_exit_2_naming_the_value(args, named, tmp_path):
    out = run(*args, "--out", str(tmp_path / "o"))
    assert out.returncode == 2 and named in out.stderr, out.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_quick_matrix_on_one_rank_writes_the_ddp_dumps_and_the_report(tmp_path):
    cpus = len(os.sched_getaffinity(0))
    out = run("--quick", "--ranks", f"1,{cpus + 1}", "--out", str(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"N = {cpus + 1}: skipped (valid: 1..{cpus}" in out.stdout
    for progress in ("caller", "thread"):
        rows = read_table(str(tmp_path / f"ddp-n1-{progress}.h5"))
        assert set(rows["backend"]) == {"auto", "mpi", "none", "bare"}, rows["backend"]
    assert not (tmp_path / "allreduce-n1.h5").exists()          # one rank has nothing to all-reduce
    assert "ddp" in (tmp_path / "report.txt").read_text().lower()
