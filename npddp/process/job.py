"""Process-level glue for entry points: exit codes, and ending the whole job when one rank fails.

Without it, a rank that dies of an exception or exits early leaves the others blocked in
their next collective until someone kills the job. :func:`abort_on_exception` makes these
end the whole job promptly:

* an unhandled exception prints that rank's traceback and calls ``MPI_Abort`` with
  ``exit_code`` (1); a Ctrl-C prints one ``interrupted`` line and exits 130
  (:func:`npddp.util.guard.install_hook`, which the library installs for users' scripts too);
* ``sys.exit(n)`` with ``n`` non-zero on one rank prints one line and calls ``MPI_Abort(n)``,
  so the job's exit status is ``n``.

:func:`run_main` wraps an entry point's ``main``: a ``SystemExit`` raised inside it (however it
was raised) with a non-zero code ends the job the same way. A :class:`JobError` is a failure
every rank agrees on: the entry point prints it once (rank 0) and exits with its code.
A single process (no MPI loaded, or a world of one rank) keeps Python's default behaviour;
without MPI the launcher (``python -m npddp.run``) ends the other ranks when one exits non-zero.
"""

from __future__ import annotations

import sys

from npddp.util import env, guard

#: Exit statuses of the entry points (``python -m npddp.train``, ``npddp.evaluate``).
EXIT_OK = 0
EXIT_FAILED = 1      # an unhandled exception on some rank: the whole job was aborted
EXIT_USAGE = 2       # bad input found before training: flags, data files, checkpoint, paths, MPI missing
EXIT_DIVERGED = 3    # a non-finite loss, gradient or parameter stopped training
EXIT_WRITE = 4       # a checkpoint or metrics file could not be written (disk full, I/O error)


class JobError(Exception):
    """A failure every rank has agreed on: rank 0 prints ``error: <message>``; every rank exits ``code``."""

    def __init__(self, message: str, code: int = EXIT_USAGE, local: bool = False):
        super().__init__(message)
        self.code = code
        self.local = local   # found by this rank alone (e.g. it cannot reach rank 0): it prints it


def _world():
    """``MPI.COMM_WORLD`` if MPI is (or, under a launcher of several ranks, can be) initialized; else None."""
    if "mpi4py.MPI" not in sys.modules and env.mpi_world_size() <= 1:
        return None  # no MPI here (or a launcher without MPI, which ends the job itself)
    from npddp.comm.transports.mpi import launcher_refusal
    if launcher_refusal() is not None:
        return None  # this MPI cannot start under this launcher: loading it would abort in the library's words
    try:
        from mpi4py import MPI  # noqa: F401  (a rank that failed before importing MPI still aborts the job)
    except Exception:  # noqa: BLE001  (MPI unusable: nothing to abort through)
        return None
    mpi = env.mpi_live()
    return None if mpi is None else mpi.COMM_WORLD


def end_job(code: int, report: str) -> None:
    """Print ``report`` and end every rank with ``code`` (MPI_Abort); returns only when this is the whole job."""
    world = _world()
    if world is None or world.Get_size() == 1:
        return
    guard.end_job(world, code, f"[rank {world.Get_rank()}] {report.format(size=world.Get_size())}")


exit_status = guard.exit_status


def abort_on_exception(exit_code: int = EXIT_FAILED) -> None:
    """Make an unhandled exception, or ``sys.exit(n != 0)``, on this rank end the whole job."""
    guard.install_exit_hook(world_of=_world)
    guard.install_hook(exit_code, world_of=_world)


#: How to get an MPI library when mpi4py cannot load one.
MPI_FIXES = ('install one: pip install "npddp[mpich]" (the MPICH wheel), or a system MPI (e.g. apt '
             'install mpich, then pip install --force-reinstall --no-binary mpi4py mpi4py); or run '
             'without MPI: python -m npddp.run --nproc N -m npddp.train --backend auto')


def mpi_load_detail(text: str, limit: int = 300) -> str:
    """mpi4py's "cannot load MPI library" message in one line: whole lines (never cut mid-path), then a count."""
    lines = [line.strip() for line in text.splitlines()[1:] if line.strip()]
    kept: list[str] = []
    for line in lines:
        if kept and len("; ".join(kept + [line])) > limit:
            break
        kept.append(line)
    rest = len(lines) - len(kept)
    return "; ".join(kept) + (f" (and {rest} more)" if rest else "") if kept else "libmpi not found"


def open_communicator(backend: str, timeout=None, transport: str = "auto", **kwargs):
    """``npddp.comm.create(backend, ...)``, with a one-line JobError (exit 2) when MPI cannot be loaded.

    Also turns a malformed ``NPDDP_DEBUG``/``NPDDP_TIMEOUT``, an unreachable rendezvous or a
    backend the transport cannot run into a JobError.
    """
    from npddp.comm import create
    from npddp.comm.transports.rendezvous import RendezvousError

    try:
        return create(backend, timeout=timeout, transport=transport, **kwargs)
    except RendezvousError as exc:
        raise JobError(str(exc), EXIT_USAGE, local=True) from None
    except ImportError as exc:
        raise JobError(f"mpi4py cannot be imported ({exc}), so there is no MPI to run on; {MPI_FIXES}",
                       EXIT_USAGE) from None
    except RuntimeError as exc:
        if "MPI library" not in str(exc):
            raise
        raise JobError(f"cannot load the MPI library ({mpi_load_detail(str(exc))}); {MPI_FIXES}",
                       EXIT_USAGE) from None
    except ValueError as exc:
        raise JobError(str(exc), EXIT_USAGE) from None


def run_main(main, argv=None) -> int:
    """Run an entry point's ``main(argv)`` and return its exit status, ending the job on a one-rank exit.

    A ``SystemExit`` with a non-zero code escaping ``main`` on this rank ends every rank with
    that code (``sys.exit(0)``, e.g. after ``--help``, exits normally).
    """
    abort_on_exception()
    try:
        return int(main(argv))
    except SystemExit as exc:
        code = exit_status(exc.code)
        if code:
            end_job(code, f"exit status {code} (SystemExit), ending all {{size}} ranks\n")
        raise
