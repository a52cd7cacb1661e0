"""``srun -n N python -m npddp.train`` on a real one-node Slurm: under MPI through PMI-2, and over TCP from
Slurm's variables alone (no npddp.run), to the parameters mpirun and one process reach; secrets; threads."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from npddp.checkpoint import fileformat
from tests.helpers.cli import TINY, clean_env, ok, train

pytestmark = pytest.mark.slow
QUIET = ["--progress", "none"]
#: 288 rows, a global batch of 24: divides over 1, 2 and 3 ranks.
THIRDS = ["--train-samples", "288", "--val-samples", "96", "--batch-size", "24", "--hidden", "16",
          "--epochs", "2", "--dtype", "float64"]


def srun(slurm, cwd, *args, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """``srun ARGS`` in ``cwd`` against the tests' Slurm, with no secret unless ``env`` gives one."""
    environ = {**clean_env(), **(env or {}), "SLURM_CONF": str(slurm.conf), "PATH": slurm.env["PATH"]}
    if "NPDDP_JOB_SECRET" not in (env or {}):
        environ.pop("NPDDP_JOB_SECRET", None)
    return subprocess.run(["srun", *map(str, args)], cwd=cwd, env=environ, capture_output=True, text=True,
                          timeout=timeout)


def train_args(*args) -> list[str]:
    return [sys.executable, "-m", "npddp.train", *args, *QUIET]


def params(path) -> dict:
    return fileformat.read(str(path)).params


def test_srun_with_pmi2_trains_over_mpi_and_writes_a_checkpoint(slurm, tmp_path):
    proc = ok(srun(slurm, tmp_path, "--mpi=pmi2", "-n", 2, *train_args(*TINY, "--checkpoint", "c.h5")))
    assert proc.stdout.startswith("npddp.train: 2 ranks, backend mpi over mpi, MPI "), proc.stdout
    assert fileformat.read(str(tmp_path / "c.h5")).step == 24


def test_srun_without_mpi_forms_a_tcp_world_that_ends_at_mpiruns_parameters(slurm, tmp_path):
    ok(train(tmp_path, *TINY, *QUIET, "--backend", "ring", "--checkpoint", "mpirun.h5"))
    proc = ok(srun(slurm, tmp_path, "-n", 2, *train_args(*TINY, "--backend", "ring", "--checkpoint", "srun.h5")))
    assert proc.stdout.startswith("npddp.train: 2 ranks, backend ring over tcp"), proc.stdout
    reference, got = params(tmp_path / "mpirun.h5"), params(tmp_path / "srun.h5")
    assert reference.keys() == got.keys()
    for name, value in reference.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)   # the same algorithm gives the same bits


def test_a_world_of_three_under_srun_reaches_one_process_parameters(slurm, tmp_path):
    ok(train(tmp_path, *THIRDS, *QUIET, "--checkpoint", "one.h5", n=None))
    proc = ok(srun(slurm, tmp_path, "-n", 3, *train_args(*THIRDS, "--checkpoint", "three.h5")))
    assert proc.stdout.startswith("npddp.train: 3 ranks, backend auto over tcp"), proc.stdout
    reference, got = params(tmp_path / "one.h5"), params(tmp_path / "three.h5")
    for name, value in reference.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-9, atol=1e-12, err_msg=name)


def test_transport_tcp_under_srun_with_pmi2_trains_over_tcp_with_the_jobs_secret(slurm, tmp_path):
    secret = {"NPDDP_JOB_SECRET": "0123456789abcdef" * 4}
    proc = ok(srun(slurm, tmp_path, "--mpi=pmi2", "-n", 2, *train_args(*TINY, "--transport", "tcp"), env=secret))
    assert proc.stdout.startswith("npddp.train: 2 ranks, backend auto over tcp (default: --transport tcp)"), \
        proc.stdout


def test_tasks_holding_different_secrets_end_promptly_with_one_line(slurm, tmp_path):
    command = " ".join(train_args(*TINY, "--timeout", "60"))
    start = time.monotonic()
    proc = srun(slurm, tmp_path, "--kill-on-bad-exit=1", "-n", 2, "bash", "-c",
                f"NPDDP_JOB_SECRET=secret-of-task-$SLURM_PROCID-0123456789 exec {command}")
    assert proc.returncode != 0
    assert time.monotonic() - start < 45, "the job waited for its timeout instead of ending"
    lines = [line for line in proc.stderr.splitlines() if "secret" in line and "rendezvous" in line]
    assert lines, proc.stderr


def test_cpus_per_task_give_each_task_its_blas_threads(slurm, tmp_path):
    env = {name: "" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    proc = ok(srun(slurm, tmp_path, "-n", 1, "-c", 2, sys.executable, "-m", "npddp.util.threads", "--explain",
                   env=env))
    assert proc.stdout.strip() == "2  (auto: SLURM_CPUS_PER_TASK=2)", proc.stdout


def test_transport_mpi_under_srun_without_a_plugin_is_one_line_not_two_jobs_of_one(slurm, tmp_path):
    """Before: two headers ``1 rank``, two trainings writing one checkpoint, exit 0."""
    proc = srun(slurm, tmp_path, "-n", 2, *train_args(*TINY, "--transport", "mpi", "--backend", "mpi",
                                                      "--checkpoint", "race.h5"))
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    assert errors == ["error: MPI started a world of 1 rank but the launcher announced 2 (SLURM_STEP_NUM_TASKS=2): "
                      "srun gave MPI no process manager: add --mpi=pmi2 (MPICH, Intel MPI) or --mpi=pmix (Open MPI), "
                      "or run over tcp (--transport auto or tcp); see docs/guide/slurm.md"], proc.stderr
    assert not (tmp_path / "race.h5").exists()
