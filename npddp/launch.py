"""Process-level glue for entry points: abort the whole MPI job when any rank fails.

Without it, a rank that dies of an exception leaves the others blocked in their next
collective until someone kills the job. With :func:`abort_on_exception`, an unhandled
exception on any rank, ``KeyboardInterrupt`` included, prints that rank's traceback and calls
``MPI_Abort`` on ``COMM_WORLD``, and the launcher ends every rank (exit code ``exit_code``).
A single process (no MPI, or a world of one rank) keeps Python's default behaviour.
"""

from __future__ import annotations

import os
import sys
import time
import traceback

#: Environment variables that say this process is one of several ranks (MPICH/Hydra, Open MPI, PMIx, Slurm).
_WORLD_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_NTASKS")
#: Seconds between printing the report and MPI_Abort, so the launcher can still forward it.
_GRACE_S = 0.2


def launched_size(environ=None) -> int:
    """The world size the launcher announced in the environment (1 when there is none)."""
    environ = os.environ if environ is None else environ
    for name in _WORLD_SIZE_VARS:
        try:
            return max(1, int(environ[name]))
        except (KeyError, ValueError):
            continue
    return 1


def _world():
    """``MPI.COMM_WORLD`` if MPI is (or, under a launcher of several ranks, can be) initialized; else None."""
    if "mpi4py.MPI" not in sys.modules and launched_size() == 1:
        return None
    try:
        from mpi4py import MPI  # a rank that failed before importing MPI still aborts the job

        if MPI.Is_finalized() or not MPI.Is_initialized():
            return None
        return MPI.COMM_WORLD
    except Exception:  # noqa: BLE001  (MPI unusable: nothing to abort through)
        return None


def abort_on_exception(exit_code: int = 1) -> None:
    """Make an unhandled exception on this rank print its traceback and MPI_Abort the job."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        world = _world()
        if world is None or world.Get_size() == 1:
            previous(exc_type, exc, tb)
            return
        rank, size = world.Get_rank(), world.Get_size()
        what = "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "unhandled exception"
        report = "".join(traceback.format_exception(exc_type, exc, tb))
        sys.stdout.flush()
        sys.stderr.write(f"[rank {rank}] {what}, aborting all {size} ranks:\n{report}")  # one write
        sys.stderr.flush()
        time.sleep(_GRACE_S)  # let the launcher forward the report before it tears the job down
        world.Abort(exit_code)
        os._exit(exit_code)

    sys.excepthook = hook
