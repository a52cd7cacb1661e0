"""CPUs this process may use, the ranks sharing this node, and each rank's share as BLAS threads.

Several ranks on one node each running one OpenBLAS thread per core fight over the cores
(on 2 cores, two ranks with two threads each run 10-100x slower). ``auto`` gives each rank
its share: the CPUs this process may run on (its affinity mask) divided by the ranks sharing
this node, at least 1 -- unless ``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS`` or
``MKL_NUM_THREADS`` is set to a positive number, which is then taken as the user's choice, or
Slurm gave each task its CPUs (``SLURM_CPUS_PER_TASK``), which are then that task's threads.
An MPI launcher that binds each rank to CPUs of its own (Open MPI without ``--oversubscribe``,
Intel MPI by default: the rank's mask is smaller than its launcher's, and the node's ranks' masks
fit in the launcher's side by side) leaves each rank all of its mask: "bound to 1 CPU by the launcher".

The ranks on this node are counted without initialising MPI, from what launchers put in the
environment (:data:`npddp.util.env.LOCAL_SIZE_VARIABLES`); when none is set and MPI is already
initialised, from MPI's shared-memory split of ``COMM_WORLD`` (a collective: every rank must
ask; ``ask_mpi=False`` never asks); otherwise 1. :func:`limit` is the one place a number is applied:
:mod:`npddp.process.threads` calls it for the entry points, :mod:`npddp.util.guard` (with the rule of
:func:`share`) for a user's own script.
"""

from __future__ import annotations

import os

from npddp.util import env


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask where the OS has one, else the CPU count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def parent_cpus() -> int:
    """CPUs the parent process (an MPI launcher's proxy, for a rank) may run on; this process's where unreadable."""
    try:
        return max(1, len(os.sched_getaffinity(os.getppid())))
    except OSError:
        return available_cpus()


def local_ranks(environ=None, ask_mpi: bool = True) -> tuple[int, str]:
    """(ranks on this node, where that number came from)."""
    announced = env.local_size(environ)
    if announced is not None:
        return announced
    mpi = env.mpi_live() if ask_mpi else None
    if mpi is not None:
        node = mpi.COMM_WORLD.Split_type(mpi.COMM_TYPE_SHARED)
        try:
            return node.Get_size(), "MPI shared-memory split"
        finally:
            node.Free()
    return 1, "no launcher variable"


def auto_threads(environ=None, cpus: int | None = None, ask_mpi: bool = True,
                 launcher_cpus: int | None = None) -> tuple[int, str]:
    """(BLAS threads for this rank, a short explanation) as ``--threads auto`` chooses them.

    ``cpus``: this rank's affinity mask, ``launcher_cpus``: its launcher's (defaults: read them).
    """
    environ = os.environ if environ is None else environ
    setting = env.thread_setting(environ)
    if setting is not None:
        return setting[0], f"auto: {setting[1]}={setting[0]}"
    per_task = env.slurm_cpus_per_task(environ)
    if per_task is not None:
        return per_task, f"auto: SLURM_CPUS_PER_TASK={per_task}"
    cpus = available_cpus() if cpus is None else cpus
    ranks, source = local_ranks(environ, ask_mpi)
    parent = parent_cpus() if launcher_cpus is None else launcher_cpus
    if env.launched_by_mpi(environ) and cpus < parent and cpus * ranks <= parent:
        # the launcher bound each rank to CPUs of its own (Open MPI's and Intel MPI's default binding)
        return cpus, f"bound to {cpus} CPU{'s' * (cpus != 1)} by the launcher"
    n = max(1, cpus // ranks)
    return n, f"auto: {cpus} CPU{'s' * (cpus != 1)} / {ranks} rank{'s' * (ranks != 1)} on this node"


def share(setting, environ=None) -> int | None:
    """Threads for a user's script under ``NPDDP_THREADS`` (``"auto"``, an int, or None: off), or None: leave BLAS be.

    Nothing changes when a thread variable is set (the user chose) or, under ``auto``, when this rank is alone
    on its node; MPI is never asked.
    """
    if setting is None or env.thread_setting(environ) is not None:
        return None
    if setting == "auto":
        if local_ranks(environ, ask_mpi=False)[0] <= 1:
            return None
        return auto_threads(environ, ask_mpi=False)[0]
    return setting


def limit(n: int, export: bool = True) -> list[tuple[str, int]]:
    """Limit every BLAS and OpenMP library loaded in this process to ``n`` threads, for the process's life.

    ``export`` also sets the thread variables (:data:`npddp.util.env.THREAD_VARIABLES`) to ``n``, for libraries
    loaded later, child processes and the run's recorded environment. Returns (library, threads) of each loaded.
    """
    from threadpoolctl import threadpool_info, threadpool_limits

    threadpool_limits(limits=n)
    if export:
        for name in env.THREAD_VARIABLES:
            os.environ[name] = str(n)
    return [(info.get("internal_api", "?"), int(info.get("num_threads", 0))) for info in threadpool_info()]
