"""A test run leaves no launcher file behind: hydra's topology file of a plain ``mpirun`` job that aborted is
removed when the run ends (tests/conftest.py's ``pytest_sessionfinish``), while the run's own tests still see it.
The tests that watch the whole machine are marked ``alone``, so tests/run_all.sh runs them beside no other."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.jobs import job_env, mpirun

#: watches the whole machine or times a job's end: never beside another test (run_all.sh: serial-alone)
pytestmark = pytest.mark.alone

ROOT = Path(__file__).resolve().parents[1]
#: A test that runs a 2-rank plain mpirun job whose ranks abort: rank 0 first prints the topology file its hydra
#: proxy holds; the test checks the file outlived the job (so the run's end is what removes it).
ABORTING_TEST = textwrap.dedent("""
    import os, subprocess, sys

    RANK = '''
    import os
    from mpi4py import MPI
    proxy = os.getppid()
    held = [os.readlink(f"/proc/{proxy}/fd/{fd}") for fd in os.listdir(f"/proc/{proxy}/fd")]
    if MPI.COMM_WORLD.rank == 0:
        print("topology file", *[path for path in held if "hydra_hwloc_xmlfile_" in path], flush=True)
    MPI.COMM_WORLD.Barrier()
    MPI.COMM_WORLD.Abort(3)
    '''

    def test_an_aborting_job():
        done = subprocess.run([os.environ["MPIRUN"], "-n", "2", sys.executable, "-c", RANK],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode != 0, done.stdout + done.stderr
        line = next(line for line in done.stdout.splitlines() if line.startswith("topology file "))
        path = line.split()[2]
        print("LEFT", path, os.path.exists(path))
""")


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to see what hydra's proxy holds")
@pytest.mark.slow
def test_the_topology_file_of_an_aborted_mpirun_job_is_gone_when_the_run_ends(tmp_path):
    launcher = mpirun()
    if "hydra" not in subprocess.run([launcher, "--version"], capture_output=True, text=True).stdout.lower():
        pytest.skip("the MPI library here is not launched by hydra (MPICH, Intel MPI)")
    script = tmp_path / "test_aborting.py"
    script.write_text(ABORTING_TEST)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "tests.conftest", "--rootdir", str(tmp_path),
                           str(script)], cwd=ROOT, env=job_env(MPIRUN=launcher), capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    left = [line.split() for line in done.stdout.splitlines() if line.startswith("LEFT ")]
    assert left and left[0][2] == "True", done.stdout      # the job's end left it; the run was still going
    assert not os.path.exists(left[0][1]), f"{left[0][1]} is still there after the run ended"


def test_the_tests_under_the_alone_paths_and_only_those_are_marked_alone():
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "alone",
                             "tests/reliability/test_launcher_output.py", "tests/comm/test_tcp.py"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    ids = [line for line in listed.stdout.splitlines() if "::" in line]
    assert ids and all(i.startswith("tests/reliability/test_launcher_output.py::") for i in ids), listed.stdout
