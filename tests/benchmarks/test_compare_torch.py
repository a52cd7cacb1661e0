"""Tests of benchmarks/compare_torch.py: without PyTorch (simulated), and a tiny run with it.

Without PyTorch the script must say so and exit with its documented status; that is checked
in-process and through the script itself. npddp must never import torch. The runs with
PyTorch (one rank serially, every rank under MPI) need it installed and are skipped
otherwise, in addition to the checks above.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

from benchmarks import compare_torch as ct
from benchmarks import results

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "compare_torch.py"
TINY = ["--model", "tiny", "--batch", "4", "--steps", "1", "--reps", "3", "--warmup", "2"]


def clean_env():
    """The environment for a child process: without this process's MPI/PMI variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_"))}


def test_without_torch_main_says_so_and_returns_3(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    for argv in ([], TINY, TINY + ["--backends", "ring", "--sync", "flat"]):
        assert ct.main(argv, mpi_comm=MPI.COMM_SELF) == ct.EXIT_NO_TORCH == 3
        out, err = capsys.readouterr()
        assert out == "" and err.count("PyTorch is not installed") == 1 and "pip install torch" in err


def test_bad_arguments_exit_2_before_torch_is_looked_for(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)
    for argv, message in ((["--model", "huge"], "invalid choice: 'huge'"),
                          (["--backends", "mpi,gloo"], "unknown name 'gloo'"),
                          (["--sync", "async"], "invalid choice: 'async'"),
                          (["--bucket-mb", "0"], "--bucket-mb must be a number > 0"),
                          (["--reps", "0"], "must be >= 1, got 0")):
        with pytest.raises(SystemExit) as e:
            ct.main(argv, mpi_comm=MPI.COMM_SELF)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "PyTorch" not in err, err


def test_script_without_torch_exits_3_with_the_message():
    code = ("import os, runpy, sys; sys.modules['torch'] = None; sys.argv = [sys.argv[1]] + sys.argv[2:]; "
            "sys.path[0] = os.path.dirname(sys.argv[0]); "  # as `python benchmarks/compare_torch.py` sets it
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", code, str(SCRIPT), "--model", "tiny"], capture_output=True,
                          text=True, timeout=120, env=clean_env(), cwd=ROOT)
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip() == ct.NO_TORCH and done.stdout == ""


def test_npddp_never_imports_torch():
    code = ("import pkgutil, importlib, sys, npddp\n"
            "names = [m.name for m in pkgutil.walk_packages(npddp.__path__, 'npddp.')]\n"
            "for name in names:\n"
            "    if name.split('.')[-1] != '__main__':\n"
            "        importlib.import_module(name)\n"
            "assert len(names) > 10, names\n"
            "print('torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=clean_env(), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


# ----------------------------------------------------------------------------- with PyTorch

def check_dump(path, argv, n):
    """Problems found in a torch_compare dump (empty when it matches the documented layout)."""
    cfg = ct.parse_config(argv, verbose=False)
    problems = results.check(path)
    if problems:
        return problems
    attrs, rows = results.read_meta(path), results.read_table(path)
    raw = results.read_raw(path, "samples_per_s")
    if attrs["kind"] != "torch_compare" or attrs["world_size"] != n or not attrs["torch_version"]:
        problems.append(f"attrs {attrs['kind']} {attrs['world_size']}")
    frameworks, backends = rows["framework"].tolist(), rows["backend"].tolist()
    if frameworks != ["torch"] + ["npddp"] * len(cfg.backends) or backends != ["gloo", *cfg.backends]:
        problems.append(f"sides {frameworks} {backends}")
    if raw.shape != (cfg.reps, 1 + len(cfg.backends)) or not np.all(raw > 0):
        problems.append(f"raw shape {raw.shape}")
    if not np.allclose(rows["samples_per_s"], np.median(raw, axis=0)):
        problems.append("median")
    if not (np.all(rows["samples_per_s_min"] <= rows["samples_per_s"])
            and np.all(rows["samples_per_s"] <= rows["samples_per_s_max"])):
        problems.append("min/median/max")
    if not np.allclose(rows["ratio_to_torch"], rows["samples_per_s"] / rows["samples_per_s"][0]):
        problems.append("ratio")
    if not np.allclose(rows["step_ms"], n * cfg.batch / rows["samples_per_s"] * 1e3):
        problems.append("step_ms")
    if rows["max_param_diff"][0] != 0 or not np.all(rows["max_param_diff"] < 1e-4):
        problems.append(f"the two frameworks trained differently: {rows['max_param_diff'].tolist()}")
    return problems


@pytest.mark.slow
def test_one_rank_run_with_torch(tmp_path, capsys):
    pytest.importorskip("torch")
    path = tmp_path / "cmp.h5"
    argv = TINY + ["--out", str(path)]
    assert ct.main(argv, mpi_comm=MPI.COMM_SELF) == 0
    assert check_dump(path, argv, 1) == []
    out = capsys.readouterr().out
    assert "vs torch" in out and out.count("npddp") >= 2 and "torch    gloo" in out



@pytest.mark.mpi(min_size=2)
@pytest.mark.needs_mpi  # the benchmarks time over mpi4py communicators
@pytest.mark.slow
def test_every_rank_runs_the_comparison(assert_all_ranks, agreed_tmpdir):
    pytest.importorskip("torch")
    comm = MPI.COMM_WORLD
    directory = agreed_tmpdir
    path = directory / "cmp.h5"
    argv = TINY + ["--backends", "ring,mpi", "--sync", "bucketed", "--bucket-mb", "1", "--out", str(path)]
    rc = ct.main(argv, mpi_comm=comm)
    comm.Barrier()
    problems = check_dump(path, argv, comm.Get_size()) if comm.Get_rank() == 0 else []
    if comm.Get_rank() == 0:
        path.unlink()
        directory.rmdir()
    assert_all_ranks(rc == 0 and not problems, f"rc={rc}, problems: {problems}")
