"""Fixtures for the cluster tests: skip with the reason where namespaces cannot be made; run the harness."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from npddp.cluster.cli import missing_privilege
from npddp.cluster.launch import LIBRARIES

ROOT = Path(__file__).resolve().parents[2]
JOB = str(Path(__file__).resolve().parent / "job.py")


def _why_not() -> str | None:
    """None when this process can make a network namespace, else why not."""
    reason = missing_privilege()
    if reason:
        return reason
    name = f"npddp-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if made.returncode:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    return None


WHY_NOT = _why_not()
needs_namespaces = pytest.mark.skipif(WHY_NOT is not None, reason=f"emulated nodes unavailable: {WHY_NOT}")


@pytest.fixture
def cluster_env(tmp_path):
    """The harness's environment: this checkout first, one BLAS thread, a state directory of the test's own."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               NPDDP_CLUSTER_STATE=str(tmp_path / "state"), OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for name in {name for lib in LIBRARIES for name in {**lib.network_env, **lib.speed_env}}:   # the harness's
        env.pop(name, None)
    return env


@pytest.fixture
def cluster(cluster_env):
    """``cluster(*args, timeout=, env=)``: run ``python -m npddp.cluster ARGS`` to the end."""
    def run(*args, timeout: float = 120, env: dict | None = None, cwd=None):
        return subprocess.run([sys.executable, "-m", "npddp.cluster", *map(str, args)], capture_output=True,
                              text=True, timeout=timeout, env={**cluster_env, **(env or {})}, cwd=cwd or ROOT)
    return run


@pytest.fixture
def own_namespaces():
    """A function giving the npddp namespaces that exist now but did not before the test."""
    from npddp.cluster.state import existing_namespaces
    before = existing_namespaces()
    return lambda: {ns for ns in existing_namespaces() - before if ns.startswith("npddp-")}
