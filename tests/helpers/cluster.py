"""What the emulated-cluster tests share: the job script they run, and a mark that skips where namespaces cannot be made."""

from __future__ import annotations

import os
import subprocess

import pytest

from npddp.cluster.cli import missing_privilege

from tests.helpers.jobs import ROOT

#: The script every emulated node runs (tests/cluster/job.py).
JOB = str(ROOT / "tests" / "cluster" / "job.py")


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


#: None where namespaces can be made, else why not.
WHY_NOT = _why_not()
#: Skips a test, with the reason, where emulated nodes cannot be made.
needs_namespaces = pytest.mark.skipif(WHY_NOT is not None, reason=f"emulated nodes unavailable: {WHY_NOT}")
