"""What a user's own script gets from its first ``npddp.comm.create``: no hang on a failure, a fair share of cores.

:func:`install` runs once per process (``create`` calls it; calling it again does nothing) and
sets up two things, each with an environment variable that turns it off:

* the exception guard (``NPDDP_ABORT_ON_EXCEPTION``, default on; ``0`` turns it off): an
  exception that escapes on one rank of a job of several ends the whole job at once instead of
  leaving the other ranks in their next collective until the timeout. The failing rank prints
  ``[rank R] unhandled exception, aborting all N ranks:`` and its traceback, then ends every rank
  (MPI: ``MPI_Abort``; over TCP it exits and its peers find the connection closed, each saying
  so in one line). Ctrl-C prints one ``interrupted`` line and exits 130. A single process keeps
  Python's own behaviour.
* BLAS threads (``NPDDP_THREADS``: ``auto``, the default, a number, or ``off``): with several
  ranks on this node and no thread variable set (``OMP_NUM_THREADS`` and kin), each rank's BLAS
  is limited to its share of the cores (:func:`npddp.util.cores.auto_threads`), as ``--threads
  auto`` does for the training CLI.

Nothing here imports MPI: a job's MPI is used only when the script has already loaded it.
"""

from __future__ import annotations

import fnmatch
import os
import sys
import time
import traceback

from npddp.util import cores, env, variables

ABORT_VARIABLE = variables.ABORT_ON_EXCEPTION.name
THREADS_VARIABLE = variables.THREADS.name
#: Set by ``python -m npddp.run`` in every rank's environment; that launcher reports a Ctrl-C itself.
LAUNCHER_JOB_VARIABLE = variables.JOB_ID.name
EXIT_FAILED, EXIT_INTERRUPTED = 1, 130
#: Seconds between printing the report and MPI_Abort, so the launcher can still forward it.
_GRACE_S = 0.2
#: Seconds an interrupted rank other than 0 waits, so a Ctrl-C reaching every rank is reported once (by rank 0).
_DEFER_S = 0.5
#: Marks the hook this module installs (and the one ``npddp.process.job`` builds on it).
MARK = "_npddp_guard"


def abort_enabled(environ=None) -> bool:
    """``NPDDP_ABORT_ON_EXCEPTION`` as a bool (unset or empty: True); ValueError naming the valid values."""
    return variables.flag(variables.ABORT_ON_EXCEPTION, environ)


def threads_setting(environ=None) -> int | str | None:
    """``NPDDP_THREADS``: ``"auto"`` (unset or empty), a positive int, or None for ``off``; ValueError otherwise."""
    return variables.threads(environ)


def install(environ=None) -> None:
    """Once per process: the exception guard and the BLAS thread share, each unless turned off."""
    environ = os.environ if environ is None else environ
    if abort_enabled(environ) and not getattr(sys.excepthook, MARK, False):
        install_hook()
        install_exit_hook()
    share_threads(environ)


def exit_status(code) -> int:
    """The process exit status Python gives ``SystemExit(code)``: None -> 0, an int as is, anything else 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code) & 0xFF
    return 1


def install_exit_hook(world_of=None) -> None:
    """Make ``sys.exit(n)`` with ``n`` non-zero on one rank of an MPI job end every rank with status ``n``.

    Without it the other ranks wait for it in their next collective until the timeout (MPI's
    finalize on the leaving rank waits for them too). Over TCP without MPI the launcher ends the job.
    """
    if getattr(sys.exit, MARK, False):
        return
    original_exit, world_of = sys.exit, world_of or mpi_world

    def exit_all(status=None):
        code = exit_status(status)
        world = world_of() if code else None
        if world is not None and world.Get_size() > 1:
            detail = f" ({status})" if not isinstance(status, int) and status is not None else ""
            end_job(world, code, f"[rank {world.Get_rank()}] exit status {code}{detail}, "
                                 f"ending all {world.Get_size()} ranks\n")
        original_exit(status)

    setattr(exit_all, MARK, True)
    sys.exit = exit_all


def share_threads(environ=None) -> int | None:
    """Limit BLAS to this rank's share of the cores; the number applied, or None (off, the user chose, one rank)."""
    environ = os.environ if environ is None else environ
    n = cores.share(threads_setting(environ), environ)
    if n is not None:
        cores.limit(n, export=False)
    return n


def mpi_world():
    """``MPI.COMM_WORLD`` when this process has loaded and initialised MPI (never imports it); else None."""
    mpi = env.mpi_live()
    return None if mpi is None else mpi.COMM_WORLD


def peer_gone(exc: BaseException, tb) -> bool:
    """True for a ConnectionError raised inside ``npddp.comm``: a peer ended, this rank did nothing wrong."""
    if not isinstance(exc, ConnectionError):
        return False
    marker = os.sep + os.path.join("npddp", "comm") + os.sep
    return any(marker in frame.filename for frame in traceback.extract_tb(tb)[-4:])


def report(exc_type, exc, tb, rank: int, size: int, verb: str = "aborting") -> tuple[int, str]:
    """(exit status, what this rank prints) for an exception escaping on ``rank`` of ``size``."""
    if issubclass(exc_type, KeyboardInterrupt):
        return EXIT_INTERRUPTED, f"[rank {rank}] interrupted, {verb} all {size} ranks\n"
    if peer_gone(exc, tb):
        return EXIT_FAILED, f"[rank {rank}] ending: {str(exc).removeprefix(f'[rank {rank}] ')}\n"
    text = "".join(traceback.format_exception(exc_type, exc, tb))
    return EXIT_FAILED, f"[rank {rank}] unhandled exception, {verb} all {size} ranks:\n{text}"


def remove_mapped_segments(patterns=env.MPI_SHM_PATTERNS, maps: str = "/proc/self/maps") -> list[str]:
    """Unlink the MPI shared-memory files this process maps (the job is ending; mappings stay valid)."""
    removed = []
    try:
        with open(maps) as f:
            paths = {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    except OSError:
        return removed
    for path in sorted(paths):
        name = os.path.basename(path)
        if os.path.dirname(path) == env.SHM_DIR and any(fnmatch.fnmatch(name, p) for p in patterns):
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                continue
    return removed


def end_job(world, code: int, text: str) -> None:
    """Print ``text`` in one write, then end: ``MPI_Abort(code)`` through ``world``, else exit ``code``. Never returns."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    if text:
        try:
            sys.stderr.write(text)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
    if world is not None:
        remove_mapped_segments()
        time.sleep(_GRACE_S)  # let the launcher forward the report before it tears the job down
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)          # MPI_Abort's own line would name the rank a second time
        except OSError:
            pass
        world.Abort(code)
    os._exit(code)


def install_hook(exit_code: int = EXIT_FAILED, world_of=mpi_world, environ=None) -> None:
    """Make an exception escaping on one rank of several end the whole job (see the module docstring).

    ``world_of()`` gives ``MPI.COMM_WORLD`` or None (the default never imports MPI);
    ``exit_code`` is the status of an exception other than Ctrl-C.
    """
    previous = sys.excepthook
    environ = os.environ if environ is None else environ

    def hook(exc_type, exc, tb):
        world = world_of()
        size = world.Get_size() if world is not None else env.world_size(environ)
        if size <= 1:
            previous(exc_type, exc, tb)
            return
        rank = world.Get_rank() if world is not None else env.world_rank(environ)
        code, text = report(exc_type, exc, tb, rank, size, "aborting" if world is not None else "ending")
        if code == EXIT_INTERRUPTED:
            if world is None and variables.is_set(variables.JOB_ID, environ):
                text = ""                # python -m npddp.run prints the one line itself
            elif rank != 0:
                time.sleep(_DEFER_S)     # a Ctrl-C of every rank: rank 0 reports it and ends the job first
        else:
            code = exit_code
        end_job(world, code, text)

    setattr(hook, MARK, True)
    sys.excepthook = hook
