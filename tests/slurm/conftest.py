"""A one-node Slurm for the session (tests/slurm/daemons.py), skipped with the reason where it cannot start."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.slurm.daemons import OneNodeSlurm, why_not


@pytest.fixture(scope="session")
def slurm():
    """slurmctld and slurmd for this host, idle; both gone and their directory removed after the session."""
    reason = why_not()
    if reason:
        pytest.skip(f"slurm cannot be started: {reason}")
    root = Path(tempfile.mkdtemp(prefix="slurmtest-"))
    cluster = OneNodeSlurm(root)
    try:
        try:
            cluster.start()
        except RuntimeError as exc:
            pytest.skip(f"slurm cannot be started: {exc}")
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
