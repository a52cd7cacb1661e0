"""Process-level glue for entry points: abort the whole MPI job when any rank fails."""

from __future__ import annotations

import os
import sys
import traceback


def abort_on_exception(exit_code: int = 1) -> None:
    """Make an unhandled exception on this rank print its traceback and MPI_Abort the job."""
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        if issubclass(exc_type, KeyboardInterrupt) and os.environ.get("PMI_SIZE", "1") == "1":
            previous(exc_type, exc, tb)
            return
        try:
            from mpi4py import MPI
            world = MPI.COMM_WORLD
            rank, size = world.Get_rank(), world.Get_size()
        except Exception:  # MPI unusable: fall back to the default hook
            previous(exc_type, exc, tb)
            return
        sys.stderr.write(f"[rank {rank}] unhandled exception, aborting all {size} ranks:\n")
        traceback.print_exception(exc_type, exc, tb, file=sys.stderr)
        sys.stderr.flush()
        sys.stdout.flush()
        if size > 1:
            world.Abort(exit_code)
        os._exit(exit_code)

    sys.excepthook = hook
