"""The MPI libraries npddp runs under, and everything that differs between them: one table.

A row says how to recognise a library's launcher, the flags ``./mpi_run.sh`` adds for it, how it
passes variables to the ranks and names a hostfile, the variable that tells a rank how many ranks
share its node, and the files a killed job of that library leaves in /dev/shm and in the
temporary directory (what :mod:`npddp.process.cleanup` may remove). Names were checked by running
a job with each library's pip wheel and killing it with SIGKILL (docs/design/failures.md).

    python -m npddp.process.launchflags --mpirun "$(command -v mpirun)" -n 2   # the flags, one a line
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class MPILibrary:
    """One MPI library: its launcher's ways and the files it leaves behind."""

    name: str
    version_text: str                 # a regular expression found (any case) in ``LAUNCHER --version``
    launcher_names: tuple[str, ...]   # launcher file names that name the library without running them
    flags: tuple[str, ...]            # added to every launch
    root_flags: tuple[str, ...]       # added when running as root
    hostfile_flag: str
    export_flag: str                  # "-x" (once per variable) or "-envlist" (one comma-separated list)
    local_size_variable: str          # the ranks on this node, as the launcher tells each rank
    shm_patterns: tuple[str, ...]     # files in /dev/shm
    temp_patterns: tuple[str, ...]    # files or directories in the temporary directory
    process_managers: tuple[str, ...] = ()          # what its MPI_Init speaks: pmi (PMI-1/PMI-2), pmix
    runs_under: str = ""              # the program beside the launcher that jobs run under instead, if any
    bare_env: tuple[tuple[str, str], ...] = ()       # what flags and root_flags do, as variables (a bare mpirun)
    root_env: tuple[tuple[str, str], ...] = ()


#: Recognised in this order (Intel MPI's launcher is hydra, like MPICH's: its own text is looked for first);
#: an unrecognised launcher is taken as MPICH's.
LIBRARIES = (
    # Intel MPI's mpirun is a shell script that runs its mpiexec (hydra) as a child and passes it no signal
    MPILibrary("Intel MPI", r"intel\(r\) mpi", (), (), (), "-f", "-envlist", "MPI_LOCALNRANKS",
               ("Intel_MPI_*",), ("hydra_hwloc_xmlfile_*",), ("pmi", "pmix"), runs_under="mpiexec"),
    MPILibrary("Open MPI", r"open mpi|open-mpi|openrte|prrte", ("prterun", "prte"),
               ("--oversubscribe",), ("--allow-run-as-root",), "--hostfile", "-x", "OMPI_COMM_WORLD_LOCAL_SIZE",
               ("sm_segment.*", "vader_segment.*", "ompi.*"), ("ompi.[0-9]*",), ("pmix",),
               bare_env=(("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe"),),
               root_env=(("OMPI_ALLOW_RUN_AS_ROOT", "1"), ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"))),
    MPILibrary("MPICH", r"hydra|mpich", (), (), (), "-f", "-envlist", "MPI_LOCALNRANKS",
               ("mpich_shm_*",), ("hydra_hwloc_xmlfile_*",), ("pmi",)),   # PMIx too only when built with it
)
MPICH = LIBRARIES[-1]
#: Segments of the transports under any library: UCX, libfabric, PSM2.
TRANSPORT_SHM_PATTERNS = ("ucx_shm_*", "fi_*", "psm2_shm.*")


def _unique(items) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


#: Every library's /dev/shm names and the transports'.
SHM_PATTERNS = _unique([p for lib in LIBRARIES for p in lib.shm_patterns] + list(TRANSPORT_SHM_PATTERNS))
#: Every library's names in the temporary directory.
TEMP_PATTERNS = _unique(p for lib in LIBRARIES for p in lib.temp_patterns)


def identify(launcher: str, version_output: str = "") -> MPILibrary:
    """The library whose launcher is ``launcher`` (a path), by its file name, then by its ``--version`` text."""
    base = os.path.basename(launcher)
    for lib in LIBRARIES:
        if base in lib.launcher_names:
            return lib
    for lib in LIBRARIES:
        if re.search(lib.version_text, version_output, re.IGNORECASE):
            return lib
    return MPICH


def program(lib: MPILibrary, launcher: str) -> str:
    """What runs the job: the program the library's launcher should be replaced by, where it is there, else it."""
    if lib.runs_under:
        beside = os.path.join(os.path.dirname(launcher), lib.runs_under)
        if os.path.basename(launcher) != lib.runs_under and os.access(beside, os.X_OK):
            return beside
    return launcher


def launch_environment(lib: MPILibrary, root: bool = False) -> dict[str, str]:
    """Variables that give a bare ``mpirun`` of ``lib`` what mpi_run.sh's flags give it (oversubscription, root)."""
    return dict(lib.bare_env + (lib.root_env if root else ()))


def launch_flags(lib: MPILibrary, ranks: int, hostfile: str | None = None, export=(), root: bool = False) -> list[str]:
    """The launcher's arguments before the command: ranks, the library's flags, hostfile, exported variables."""
    args = ["-n", str(ranks), *lib.flags, *(lib.root_flags if root else ())]
    if hostfile:
        args += [lib.hostfile_flag, hostfile]
    if export and lib.export_flag == "-x":
        for name in export:
            args += ["-x", name]
    elif export:
        args += [lib.export_flag, ",".join(export)]
    return args
