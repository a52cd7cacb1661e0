"""The process environment in one place: which launcher started us, rank and size, node, BLAS threads.

Every layer that needs to know how the job was launched reads it here, so each list of
launcher variables exists once. Nothing here imports MPI: the facts come from the environment
variables the launchers set (MPICH/Hydra, Open MPI, PMIx, Slurm, and the torchrun-style
``python -m npddp.run``), and a process started by none of them is rank 0 of a world of one.
"""

from __future__ import annotations

import os

#: Thread-count variables BLAS and OpenMP libraries read, in the order npddp reads them (OpenBLAS first,
#: as OpenBLAS itself does).
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: Variables MPI launchers set holding the world size (MPICH/Hydra, Open MPI, PMIx; Slurm's srun sets
#: PMI or PMIx variables for the ranks it starts, while SLURM_* describe the allocation, not this process).
MPI_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")
#: Variables MPI launchers set holding this process's rank.
MPI_RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
#: Any of these says an MPI launcher started this process.
MPI_LAUNCHER_VARIABLES = (*MPI_SIZE_VARIABLES, *MPI_RANK_VARIABLES, "MPI_LOCALNRANKS")
#: Variables a torchrun-style launcher (``python -m npddp.run``) sets; both must be present.
TCP_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE")
#: Variables holding the number of ranks on this node, in the order they are read.
LOCAL_SIZE_VARIABLES = ("LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE")
#: Where POSIX shared memory lives: npddp's segments and MPI libraries' alike.
SHM_DIR = "/dev/shm"
#: Names of the segments MPI libraries create in /dev/shm (MPICH, Open MPI, UCX, libfabric).
MPI_SHM_PATTERNS = ("mpich_shm_*", "ompi.*", "vader_segment.*", "sm_segment.*", "ucx_shm_*", "fi_*", "psm2_shm.*")
#: Files MPICH's launcher (hydra) leaves in the temporary directory when a job fails.
HYDRA_TEMP_PATTERNS = ("hydra_hwloc_xmlfile_*",)


def _environ(environ):
    return os.environ if environ is None else environ


def first_int(names, environ=None, default: int = 0) -> int:
    """The first of ``names`` set to an integer, else ``default``."""
    environ = _environ(environ)
    for name in names:
        try:
            return int(environ[name])
        except (KeyError, ValueError):
            continue
    return default


def launched_by_mpi(environ=None) -> bool:
    """True when an MPI launcher (mpirun, mpiexec, srun with PMI) started this process."""
    environ = _environ(environ)
    return any(name in environ for name in MPI_LAUNCHER_VARIABLES)


def launched_by_tcp_launcher(environ=None) -> bool:
    """True when a torchrun-style launcher set RANK and WORLD_SIZE and no MPI launcher is involved."""
    environ = _environ(environ)
    return all(name in environ for name in TCP_LAUNCHER_VARIABLES) and not launched_by_mpi(environ)


def launcher(environ=None) -> str | None:
    """``mpi``, ``tcp`` (``python -m npddp.run`` or torchrun), or None when no launcher started us."""
    if launched_by_mpi(environ):
        return "mpi"
    return "tcp" if launched_by_tcp_launcher(environ) else None


def mpi_world_size(environ=None) -> int:
    """The world size an MPI launcher announced (1 when there is none)."""
    return max(1, first_int(MPI_SIZE_VARIABLES, environ, 1))


def world_size(environ=None) -> int:
    """The world size any launcher announced (1 when there is none)."""
    return max(1, first_int((*MPI_SIZE_VARIABLES, "WORLD_SIZE"), environ, 1))


def world_rank(environ=None) -> int:
    """This process's rank as the launcher announced it (0 when there is none); MPI is not touched."""
    return max(0, first_int((*MPI_RANK_VARIABLES, "RANK"), environ, 0))


def first_positive(names, environ=None) -> tuple[int, str] | None:
    """(value, variable) of the first of ``names`` set to a positive integer, else None."""
    environ = _environ(environ)
    for name in names:
        raw = environ.get(name, "").strip()
        if raw.isdigit() and int(raw) > 0:
            return int(raw), name
    return None


def local_size(environ=None) -> tuple[int, str] | None:
    """(ranks on this node, the variable that said so), or None when no launcher said."""
    return first_positive(LOCAL_SIZE_VARIABLES, environ)


def thread_setting(environ=None) -> tuple[int, str] | None:
    """(threads, variable) for the first thread variable set to a positive integer, else None."""
    return first_positive(THREAD_VARIABLES, environ)


#: ``0``/``false``/``no``/``off`` turns off the argument check every collective makes by default
#: (:mod:`npddp.comm.signature`); for measuring what it costs. Unset: on.
CHECK_ARGS_VARIABLE = "NPDDP_CHECK_ARGS"


#: A directory the launcher (``python -m npddp.run``) gives its ranks: each marks there when it starts to
#: join the TCP world and when it has joined, so a rank that leaves before joining is noticed at once.
JOIN_DIR_VARIABLE = "NPDDP_JOIN_DIR"


def mark_join(stage: str, rank: int, environ=None) -> None:
    """Mark ``stage`` ("joining" or "joined") for ``rank`` in the launcher's join directory, if there is one."""
    directory = _environ(environ).get(JOIN_DIR_VARIABLE)
    if directory:
        try:
            with open(os.path.join(directory, f"{stage}-{rank}"), "w"):
                pass
        except OSError:
            pass  # the launcher has gone or cleaned up: nothing to tell it
