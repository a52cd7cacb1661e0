"""Fixtures for the cluster tests: the harness's environment, the harness run to the end, the namespaces a test made."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from npddp.cluster.launch import LIBRARIES

from tests.helpers.jobs import ROOT


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
