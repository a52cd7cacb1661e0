"""BLAS threads per rank: how many a rank should use, and applying that number.

``auto`` gives each rank its share of the node's CPUs (see :mod:`npddp.util.cores`, which
counts them and the ranks sharing them: ``LOCAL_WORLD_SIZE`` of ``python -m npddp.run`` and
torchrun-style launchers, ``MPI_LOCALNRANKS`` of MPICH's hydra, ``OMPI_COMM_WORLD_LOCAL_SIZE``
of Open MPI, srun's ``SLURM_STEP_TASKS_PER_NODE``, else MPI's shared-memory split) unless a thread
variable is set; under Slurm, ``SLURM_CPUS_PER_TASK`` (``srun -c N``) gives each rank N threads.

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

from npddp.util.cores import auto_threads, available_cpus, limit, local_ranks  # noqa: F401  (re-exported)


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

    Returns (library, threads) for each library now loaded (:func:`npddp.util.cores.limit`).
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
