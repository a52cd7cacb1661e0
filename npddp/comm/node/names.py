"""Names of the shared-memory segments npddp creates, so a launcher can remove a failed job's leftovers.

Every segment lives in ``/dev/shm`` as ``npddp-<job>-<name>``, where ``<job>`` is the launcher's
``NPDDP_JOB_ID`` (or, without one, the creating process's id), so the segments of one job can be
found, and only that job's, after it dies.
"""

from __future__ import annotations

import os

from npddp.util import variables
from npddp.util.env import SHM_DIR

__all__ = ["PREFIX", "SHM_DIR", "job_id", "remove_job_segments", "segment_name"]
PREFIX = "npddp-"


def job_id(environ=None) -> str:
    """This job's id: ``NPDDP_JOB_ID`` from the launcher, else ``pid<process id>``."""
    return variables.text(variables.JOB_ID, environ) or f"pid{os.getpid()}"


def segment_name(job: str, name: str) -> str:
    """The file name (in SHM_DIR) of segment ``name`` of job ``job``."""
    return f"{PREFIX}{job}-{name}"


def remove_job_segments(job: str, directory: str = SHM_DIR) -> list[str]:
    """Remove every segment of job ``job``; return the names removed."""
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if name.startswith(f"{PREFIX}{job}-"):
            try:
                os.unlink(os.path.join(directory, name))
                removed.append(name)
            except OSError:
                pass
    return removed
