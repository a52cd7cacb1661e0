"""What ``./mpi_run.sh`` runs in place of itself: mpirun under the segment watch, restarts, and prompt stops.

    python -m npddp.process.supervise [--max-restarts K] [--no-watch] -- mpirun -n 2 python -m npddp.train

Each start runs the command under :class:`npddp.process.cleanup.Watch` (``--no-watch``: bare),
with ``NPDDP_RESTART_COUNT`` set. A failure other than exit 2 starts it again, at most K
times. SIGINT, SIGTERM or SIGHUP goes to mpirun (which stops its ranks) and is final: no
restart; mpirun gets SIGKILL if it has not ended ``--grace`` seconds later, and this process
exits 128 + the signal. mpirun gets SIGTERM when this process dies, even by SIGKILL
(``PR_SET_PDEATHSIG``), so killing the wrapper's pid always ends the job.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading

from npddp.process.cleanup import Watch, report_removed
from npddp.process.job import EXIT_USAGE
from npddp.process.spawn import RESTART_VARIABLE

PROG = "mpi_run.sh"
_STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _mpirun_dies_with_us() -> None:
    """In the child, before exec: SIGTERM when this process dies (mpirun then stops its ranks)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class _Start(Watch):
    """One start of the job; a stop signal reaching it is noted for the supervisor."""

    def __init__(self, command, supervisor, **popen):
        super().__init__(command, **popen)
        self.supervisor = supervisor

    def _forward(self, signum, frame) -> None:
        self.supervisor.proc = self.proc
        self.supervisor.stop(signum)


class Supervisor:
    """Run ``command`` until it succeeds, fails finally, or is stopped; its exit status."""

    def __init__(self, command: list[str], max_restarts: int = 0, watch: bool = True, grace: float = 5.0):
        self.command, self.max_restarts, self.watch, self.grace = command, max_restarts, watch, grace
        self.stopped: int | None = None          # the stop signal, once one came
        self.proc: subprocess.Popen | None = None

    def stop(self, signum: int, _frame=None) -> None:
        """A stop signal: pass it to mpirun, SIGKILL it after the grace period; never restart."""
        self.stopped = self.stopped or signum
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signum)
            timer = threading.Timer(self.grace, lambda: proc.poll() is None and proc.kill())
            timer.daemon = True
            timer.start()

    def _run_once(self, restart: int) -> int:
        env = {**os.environ, RESTART_VARIABLE: str(restart)}
        if not self.watch:
            self.proc = subprocess.Popen(self.command, env=env, preexec_fn=_mpirun_dies_with_us)
            code = self.proc.wait()
            return 128 - code if code < 0 else code
        start = _Start(self.command, self, env=env, preexec_fn=_mpirun_dies_with_us)
        code = start.run()
        self.proc = None
        report_removed(start.clean(code))
        return code

    def run(self) -> int:
        for sig in _STOPS:
            signal.signal(sig, self.stop)
        restart = 0
        while True:
            if self.stopped:
                return 128 + self.stopped
            code = self._run_once(restart)
            if self.stopped:
                sys.stderr.write(f"{PROG}: stopped by {signal.Signals(self.stopped).name}; not restarted\n")
                return 128 + self.stopped
            if code == 0 or code == EXIT_USAGE or restart >= self.max_restarts:
                if code and self.max_restarts:
                    sys.stderr.write(f"{PROG}: the job failed (exit {code}) after {restart} restart(s); giving up\n")
                return code
            restart += 1
            sys.stderr.write(f"{PROG}: the job failed (exit {code}); restarting every rank ({restart} of "
                             f"{self.max_restarts}, {RESTART_VARIABLE}={restart})\n")


def main(argv=None) -> int:
    """``[--max-restarts K] [--no-watch] -- COMMAND...``; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m npddp.process.supervise", description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-restarts", type=int, default=0, metavar="K", help="restarts after a failure (default 0)")
    parser.add_argument("--no-watch", action="store_true", help="do not watch the job's shared-memory segments")
    parser.add_argument("--grace", type=float, default=5.0, metavar="S",
                        help="seconds between passing a stop signal to mpirun and SIGKILL (default 5)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the launcher command (after --)")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given, e.g. -- mpirun -n 2 python -m npddp.train")
    if not 0 <= args.max_restarts <= 1000:
        parser.error(f"--max-restarts {args.max_restarts} is out of range; valid: 0..1000")
    if not 0 < args.grace < 3600:
        parser.error(f"--grace {args.grace} is out of range; valid: 0 < seconds < 3600")
    return Supervisor(command, args.max_restarts, not args.no_watch, args.grace).run()


if __name__ == "__main__":
    sys.exit(main())
