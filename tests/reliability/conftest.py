"""Fixtures for the reliability tests: jobs launched as subprocesses and watched from outside.

``launch(args, n=2, cwd=...)`` starts ``mpirun -n n python ARGS`` (the mpirun beside the
interpreter; ``launcher="npddp.run"``: ``python -m npddp.run --nproc n ARGS``, no MPI) and
returns a :class:`Job`: its output lines with their arrival times, and the python rank
processes it has ever had, found by walking ``/proc``. At teardown every job is
ended and any rank process still alive is killed, by pid. ``run_job(args, n=2, cwd=...)``
runs one to completion and returns the ``subprocess.CompletedProcess``.
"""

from __future__ import annotations

import pytest

from tests.helpers.jobs import Job, job_env, run_job as run_one


@pytest.fixture
def launch():
    """``launch(args, n=2, cwd=None, launcher="mpirun", **env)`` -> a running :class:`Job`; all ended at teardown."""
    jobs: list[Job] = []

    def start(args, n: int = 2, cwd=None, launcher: str = "mpirun", **env) -> Job:
        jobs.append(Job(args, n, cwd, job_env(**env), launcher))
        return jobs[-1]

    yield start
    for job in jobs:
        job.end()


@pytest.fixture
def run_job():
    """``run_job(args, n=2, cwd=None, timeout=120, **env)`` -> CompletedProcess of ``mpirun -n n python ARGS``
    (n=None: plain ``python ARGS``, one process without mpirun)."""
    return run_one
