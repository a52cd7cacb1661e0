"""BLAS threads per rank: how many a rank should use, and applying that number.

Several ranks on one node each running one OpenBLAS thread per core fight over the cores
(on 2 cores, two ranks with two threads each run 10-100x slower). ``auto`` gives each rank
its share: the CPUs this process may run on (its affinity mask) divided by the ranks sharing
this node, at least 1 -- unless ``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS`` or
``MKL_NUM_THREADS`` is set to a positive number, which is then taken as the user's choice.

The ranks on this node are counted without initialising MPI, from what launchers put in the
environment (:data:`npddp.util.env.LOCAL_SIZE_VARIABLES`: ``LOCAL_WORLD_SIZE`` of ``python -m npddp.run`` and
torchrun-style launchers, ``MPI_LOCALNRANKS`` of MPICH's hydra, ``OMPI_COMM_WORLD_LOCAL_SIZE``
of Open MPI); when none is set and MPI is already initialised, from MPI's shared-memory split
of ``COMM_WORLD`` (a collective: every rank must ask); otherwise 1.

The number is applied with threadpoolctl, which limits BLAS and OpenMP libraries already
loaded, so it works after NumPy is imported (environment variables such as
``OPENBLAS_NUM_THREADS`` only count before).

    python -m npddp.process.threads            # what auto gives in this environment
    python -m npddp.process.threads --ranks 4  # ... with 4 ranks on this node (what mpi_run.sh exports)
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


def local_ranks(environ=None) -> tuple[int, str]:
    """(ranks on this node, where that number came from)."""
    announced = env.local_size(environ)
    if announced is not None:
        return announced
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        node = mpi.COMM_WORLD.Split_type(mpi.COMM_TYPE_SHARED)
        try:
            return node.Get_size(), "MPI shared-memory split"
        finally:
            node.Free()
    return 1, "no launcher variable"


def auto_threads(environ=None, cpus: int | None = None) -> tuple[int, str]:
    """(BLAS threads for this rank, a short explanation) as ``--threads auto`` chooses them."""
    environ = os.environ if environ is None else environ
    setting = env.thread_setting(environ)
    if setting is not None:
        return setting[0], f"auto: {setting[1]}={setting[0]}"
    cpus = available_cpus() if cpus is None else cpus
    ranks, source = local_ranks(environ)
    n = max(1, cpus // ranks)
    return n, f"auto: {cpus} CPU{'s' * (cpus != 1)} / {ranks} rank{'s' * (ranks != 1)} on this node"


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
    """Limit every BLAS and OpenMP library loaded in this process to ``n`` threads.

    Also sets the thread variables (:data:`npddp.util.env.THREAD_VARIABLES`) to ``n``, for libraries loaded later, child processes and
    the run's recorded environment. Returns (library, threads) for each library now loaded.
    The limit lasts for the process.
    """
    from threadpoolctl import threadpool_info, threadpool_limits

    n = parse_threads(n)
    if n == "auto":
        raise ValueError("apply() takes a number of threads; resolve('auto') first")
    threadpool_limits(limits=n)
    for name in env.THREAD_VARIABLES:
        os.environ[name] = str(n)
    return [(info.get("internal_api", "?"), int(info.get("num_threads", 0))) for info in threadpool_info()]


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
    parser = argparse.ArgumentParser(prog="python -m npddp.process.threads",
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
