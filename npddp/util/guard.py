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
* with it, under MPI, departures (:class:`Departures`): a rank that leaves with status 0 (``sys.exit(0)``,
  or the script's end) tells every peer at its exit; a peer still waiting on it (it is a member of the
  waited call's communicator, and the call needs it) ends with one line naming it, a grace interval
  after the notice (:mod:`npddp.comm.engine.deadline`), instead of waiting for the timeout.
* BLAS threads (``NPDDP_THREADS``: ``auto``, the default, a number, or ``off``): with several
  ranks on this node and no thread variable set (``OMP_NUM_THREADS`` and kin), each rank's BLAS
  is limited to its share of the cores (:func:`npddp.util.threads.auto_threads`), as ``--threads
  auto`` does for the training CLI.

Nothing here imports MPI: a job's MPI is used only when the script has already loaded it.
"""

from __future__ import annotations

import atexit
import fnmatch
import os
import sys
import threading
import time
import traceback

import numpy as np

from npddp.util import env, threads, variables

ABORT_VARIABLE = variables.ABORT_ON_EXCEPTION.name
THREADS_VARIABLE = variables.THREADS.name
#: Set by ``python -m npddp.run`` in every rank's environment; that launcher reports a Ctrl-C itself.
LAUNCHER_JOB_VARIABLE = variables.JOB_ID.name
EXIT_FAILED, EXIT_INTERRUPTED = 1, 130
#: Seconds between printing the report and MPI_Abort, so the launcher can still forward it.
_GRACE_S = 0.2
#: Seconds an interrupted rank other than 0 waits, so a Ctrl-C reaching every rank is reported once (by rank 0).
_DEFER_S = 0.5
#: Seconds a leaving rank takes in the notices of peers leaving with it, and its nap between looks.
_DRAIN_S, _DRAIN_NAP_S = 0.1, 0.002
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
    exit_all.departures = None   # the job's Departures, once a world-wide create() has made them
    sys.exit = exit_all


class Departures:
    """Notices of ranks that left the job normally: at exit each rank sends its world rank (one int64) to every
    peer on a duplicate of the world of their own, never waited on; a receive stays posted for them here.

    :meth:`gone` is read by the waits of ``npddp.comm`` at their clock reads only; each wait decides
    itself whether a rank that left is one it still needs."""

    def __init__(self, world, mpi):
        self.comm = world.Dup()   # collective: made by the first world-wide create() on every rank
        self.world = world
        self.rank, self.size = world.Get_rank(), world.Get_size()
        self.inbox, self.outbox = np.zeros(1, dtype=np.int64), np.array([self.rank], dtype=np.int64)
        self.source = mpi.ANY_SOURCE
        self.receive = self.comm.Irecv(self.inbox, source=self.source)
        self.left: dict[int, float] = {}   # world rank -> monotonic time its notice was seen here
        self.sends: list = []
        self._testing = threading.Lock()   # one thread at a time tests the posted receive (a progress thread waits too)

    def gone(self) -> dict[int, float]:
        """The ranks whose notice has come so far (world rank -> when it was seen); takes in any new ones."""
        if not self._testing.acquire(blocking=False):
            return self.left
        try:
            receive = self.receive
            while receive is not None and receive.Test():
                self.left.setdefault(int(self.inbox[0]), time.monotonic())
                receive = self.receive = (self.comm.Irecv(self.inbox, source=self.source)
                                          if len(self.left) < self.size - 1 else None)
        finally:
            self._testing.release()
        return self.left

    def world_ranks(self, comm, ranks=None) -> list[int]:
        """The world ranks of ``ranks`` of the MPI communicator ``comm`` (None: all its members)."""
        group, world = comm.Get_group(), self.world.Get_group()
        try:
            ranks = range(group.Get_size()) if ranks is None else ranks
            return [int(r) for r in group.Translate_ranks(list(ranks), world)]
        finally:
            group.Free()
            world.Free()

    def leave(self) -> None:
        """Tell every peer not known to have left that this rank leaves (sends never waited on), take in the
        notices of peers leaving at about the same time (at most ``_DRAIN_S``), and withdraw the posted receive.

        A notice that comes after the receive is withdrawn stays unmatched, which some MPIs report at
        finalize (MPICH over UCX prints a warning per message): hence no notice to a rank already gone,
        and the short wait for the notices of ranks that leave together."""
        left = self.gone()
        self.sends = [self.comm.Isend(self.outbox, peer) for peer in range(self.size)
                      if peer != self.rank and peer not in left]
        until = time.monotonic() + _DRAIN_S
        while len(self.gone()) < self.size - 1 and time.monotonic() < until:
            time.sleep(_DRAIN_NAP_S)
        with self._testing:
            if self.receive is not None:
                self.receive.Cancel()
                self.receive.Wait()
                self.receive = None


def watch_departures() -> None:
    """At a world-wide create() under MPI with the exit hook installed: make the job's :class:`Departures`
    (once, collective) and send this rank's notice at its exit. Nothing for one rank or without MPI."""
    hook, mpi = sys.exit, env.mpi_live()
    if not getattr(hook, MARK, False) or hook.departures is not None or mpi is None:
        return
    world = mpi.COMM_WORLD
    if world.Get_size() > 1:
        hook.departures = Departures(world, mpi)
        atexit.register(_leave, hook.departures)


def _leave(departures: Departures) -> None:
    """At this rank's exit, while MPI still runs: :meth:`Departures.leave`."""
    if env.mpi_live() is not None:
        departures.leave()


def departures() -> Departures | None:
    """The job's :class:`Departures`, or None (no world-wide create() under MPI, or the guard is off)."""
    return getattr(sys.exit, "departures", None)


def share_threads(environ=None) -> int | None:
    """Limit BLAS to this rank's share of the cores; the number applied, or None (off, the user chose, one rank)."""
    environ = os.environ if environ is None else environ
    n = threads.share(threads_setting(environ), environ)
    if n is not None:
        threads.limit(n, export=False)
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
