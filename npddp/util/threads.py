"""BLAS threads per rank: the CPUs this process may use, the ranks sharing this node, each rank's share,
and applying that number.

Several ranks on one node each running one OpenBLAS thread per core fight over the cores
(on 2 cores, two ranks with two threads each run 10-100x slower). ``auto`` gives each rank
its share: the CPUs this process may run on (its affinity mask) divided by the ranks sharing
this node, at least 1 -- unless ``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS`` or
``MKL_NUM_THREADS`` is set to a positive number, which is then taken as the user's choice, or
Slurm gave each task its CPUs (``SLURM_CPUS_PER_TASK``, ``srun -c N``), which are then that task's threads.
An MPI launcher that binds each rank to CPUs of its own (Open MPI without ``--oversubscribe``,
Intel MPI by default: the rank's mask is smaller than its launcher's, and the node's ranks' masks
fit in the launcher's side by side) leaves each rank all of its mask: "bound to 1 CPU by the launcher".

The ranks on this node are counted without initialising MPI, from what launchers put in the
environment (:data:`npddp.util.env.LOCAL_SIZE_VARIABLES`: ``LOCAL_WORLD_SIZE`` of ``python -m npddp.run``
and torchrun-style launchers, ``MPI_LOCALNRANKS`` of MPICH's hydra, ``OMPI_COMM_WORLD_LOCAL_SIZE`` of
Open MPI, srun's ``SLURM_STEP_TASKS_PER_NODE``); when none is set and MPI is already
initialised, from MPI's shared-memory split of ``COMM_WORLD`` (a collective: every rank must
ask; ``ask_mpi=False`` never asks); otherwise 1.

:func:`limit` is the one place a number is applied, with threadpoolctl, which limits BLAS and OpenMP
libraries already loaded, so it works after NumPy is imported (environment variables such as
``OPENBLAS_NUM_THREADS`` only count before): :func:`set_threads` calls it for the entry points
(``--threads``), :mod:`npddp.util.guard` (with the rule of :func:`share`) for a user's own script.

    python -m npddp.util.threads            # what auto gives in this environment
    python -m npddp.util.threads --ranks 4  # ... with 4 ranks on this node (what mpi_run.sh exports)
"""

from __future__ import annotations

import argparse
import os
import sys

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


def parse_threads(text) -> int | str:
    """``"auto"`` or a positive int from a command-line value; ValueError naming the valid ones."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    elif isinstance(text, str) and text.strip().lower() == "auto":
        return "auto"
    else:
        try:
            value = int(str(text).strip())
        except ValueError:
            raise ValueError(f"threads must be 'auto' or a positive integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"threads must be 'auto' or a positive integer, got {value}")
    return value


def resolve(setting, environ=None) -> tuple[int, str]:
    """(threads, explanation) for a ``--threads`` setting: ``"auto"`` or a positive int."""
    setting = parse_threads(setting)
    if setting == "auto":
        return auto_threads(environ)
    return setting, "--threads"


def apply(n: int) -> list[tuple[str, int]]:
    """Limit every BLAS and OpenMP library loaded in this process to ``n`` threads, and set the thread variables.

    Returns (library, threads) for each library now loaded (:func:`limit`).
    """
    n = parse_threads(n)
    if n == "auto":
        raise ValueError("apply() takes a number of threads; resolve('auto') first")
    return limit(n)


def set_threads(setting="auto", environ=None) -> tuple[int, str]:
    """Resolve ``setting`` and apply it; (threads, explanation). What scripts call after importing NumPy."""
    n, why = resolve(setting, environ)
    apply(n)
    return n, why


def describe(n: int, why: str) -> str:
    """The header line: ``threads: 1 BLAS thread per rank (auto: 2 CPUs / 2 ranks on this node)``."""
    return f"threads: {n} BLAS thread{'s' * (n != 1)} per rank ({why})"


def main(argv=None) -> int:
    """Print the number ``auto`` gives (mpi_run.sh exports it as OMP/OPENBLAS/MKL_NUM_THREADS)."""
    parser = argparse.ArgumentParser(prog="python -m npddp.util.threads",
                                     description="Print the BLAS threads per rank that --threads auto gives.")
    parser.add_argument("--ranks", type=int, default=None, metavar="N",
                        help="ranks sharing this node (default: read from the launcher's environment)")
    parser.add_argument("--explain", action="store_true", help="also print how the number was found")
    args = parser.parse_args(argv)
    if args.ranks is not None and args.ranks < 1:
        parser.error(f"--ranks must be a positive integer, got {args.ranks}")
    environ = dict(os.environ)
    if args.ranks is not None:
        environ["LOCAL_WORLD_SIZE"] = str(args.ranks)
    n, why = auto_threads(environ)
    print(f"{n}  ({why})" if args.explain else n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
