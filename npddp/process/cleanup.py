"""Shared-memory segments MPI jobs leave in /dev/shm, and removing a failed job's own.

MPICH (like Open MPI) creates files in /dev/shm for on-node messages when a job starts and
removes them in ``MPI_Finalize``. A job that ends by ``MPI_Abort`` (any rank's exception) or by
a kill never finalizes, and its segments (a few MiB each) stay until a reboot.

Launchers also leave files in the temporary directory after a killed job: hydra's topology file
(``hydra_hwloc_xmlfile_*``, MPICH and Intel MPI), Open MPI's session directory (``ompi.*``); the
names of each library are in :mod:`npddp.util.mpilibs`. Such a file belongs to the job when one
of the job's processes holds it open or maps it (hydra's proxy holds its file open while the job
runs); files that merely appeared while the job ran may be another job's, starting beside it, that
still needs them, so they are never taken as the job's. A job that fails before the watch's first
look at its processes (50 ms) can leave its file behind.

A segment belongs to a job when one of the job's processes maps it. :class:`Watch` runs a
launcher command, polls ``/proc/<pid>/maps`` of the launcher's descendants for /dev/shm
files while it runs, and when it ends abnormally removes those still present that no live
process maps -- only that job's, never another job's (a segment the job never mapped is
never a candidate). ``./mpi_run.sh`` launches through it.

    python -m npddp.process.cleanup run -- mpirun -n 2 python -m npddp.train   # what mpi_run.sh does
    python -m npddp.process.cleanup clean              # after a bare mpirun: remove your orphaned MPI segments
    python -m npddp.process.cleanup clean --dry-run    # only list them

``clean`` removes files in /dev/shm owned by you, named like MPI segments (:data:`PATTERNS`),
older than a minute and mapped by no live process.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from npddp.comm.node.names import PREFIX, remove_job_segments
from npddp.util import variables
from npddp.util.env import MPI_SHM_PATTERNS, SHM_DIR
from npddp.util.mpilibs import TEMP_PATTERNS

SHM = Path(SHM_DIR)
#: Names of the segments MPI libraries create in /dev/shm (MPICH, Open MPI, Intel MPI, UCX, libfabric), and npddp's own.
PATTERNS = (*MPI_SHM_PATTERNS, f"{PREFIX}*")
_FAST_S, _SLOW_S, _FAST_FOR_S = 0.05, 0.5, 5.0   # poll interval while starting, then later


def mapped_segments(pid: int, directory: Path = SHM) -> set[str]:
    """The files in ``directory`` (/dev/shm) process ``pid`` maps (empty when it is gone or unreadable)."""
    found = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith(f"{directory}/"):
                    found.add(parts[5].strip().removesuffix(" (deleted)"))
    except OSError:
        pass
    return found


def open_files(pid: int) -> set[str]:
    """The paths of the files process ``pid`` holds open (empty when it is gone or unreadable)."""
    found = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return found
    for fd in fds:
        try:
            found.add(os.readlink(f"/proc/{pid}/fd/{fd}").removesuffix(" (deleted)"))
        except OSError:
            continue
    return found


def temp_entries(paths, directory: str | None = None) -> set[str]:
    """The launcher files or directories in the temporary directory that ``paths`` lie in (``TEMP_PATTERNS``)."""
    directory = tempfile.gettempdir() if directory is None else directory
    found = set()
    for path in paths:
        top = os.path.relpath(path, directory).split(os.sep)[0] if path.startswith(f"{directory}/") else ""
        if any(fnmatch.fnmatch(top, p) for p in TEMP_PATTERNS):
            found.add(os.path.join(directory, top))
    return found


def held_temp_entries(pid: int, directory: str | None = None) -> set[str]:
    """The launcher files in the temporary directory that process ``pid`` holds open or maps."""
    directory = tempfile.gettempdir() if directory is None else directory
    return temp_entries(open_files(pid) | mapped_segments(pid, Path(directory)), directory)


def _remove_entry(path: str) -> int:
    """Remove this user's file or directory tree ``path``; its size in bytes (0 when it could not go)."""
    try:
        info = os.lstat(path)
        if info.st_uid != os.getuid():
            return 0
        if os.path.isdir(path) and not os.path.islink(path):
            size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
            shutil.rmtree(path)
            return size
        os.unlink(path)
        return info.st_size
    except OSError:
        return 0


def _parents() -> dict[int, list[int]]:
    """Parent pid -> child pids of every live process."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    return children


def descendants(root: int) -> list[int]:
    """Pids of every live process below ``root``."""
    children, found, todo = _parents(), [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def in_use(directory: Path = SHM) -> set[str]:
    """Every file in ``directory`` some live process (that this user may inspect) maps."""
    used = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            used |= mapped_segments(int(entry), directory)
    return used


def remove_unused(paths, directory: Path = SHM) -> list[tuple[str, int]]:
    """Remove those of ``paths`` that still exist and no live process maps; (path, bytes) of each removed."""
    used, removed = in_use(directory), []
    for path in sorted(set(paths) - used):
        try:
            size = os.stat(path).st_size
            os.unlink(path)
            removed.append((path, size))
        except OSError:
            continue
    return removed


def orphans(min_age_s: float = 60.0, uid: int | None = None, directory: Path = SHM) -> list[Path]:
    """This user's MPI-named files in ``directory`` older than ``min_age_s`` that no live process maps."""
    uid = os.getuid() if uid is None else uid
    now, used, found = time.time(), in_use(directory), []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    for entry in entries:
        if not any(fnmatch.fnmatch(entry.name, p) for p in PATTERNS) or entry.path in used:
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if info.st_uid == uid and now - info.st_mtime >= min_age_s:
            found.append(Path(entry.path))
    return sorted(found)


def _owned(directory, patterns) -> set[str]:
    """This user's files in ``directory`` whose names match one of ``patterns``."""
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return set()
    uid, found = os.getuid(), set()
    for entry in entries:
        if any(fnmatch.fnmatch(entry.name, p) for p in patterns):
            try:
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    found.add(entry.path)
            except OSError:
                continue
    return found


def segment_files(directory: Path = SHM) -> set[str]:
    """This user's files in ``directory`` named like MPI's (or npddp's) segments."""
    return _owned(directory, PATTERNS)


class Watch:
    """Run ``command``; record the /dev/shm files its processes map; clean them up if it fails."""

    def __init__(self, command: list[str], **popen):
        self.command, self.popen = command, popen     # popen: more keyword arguments of subprocess.Popen
        self.seen: set[str] = set()
        self.temps: set[str] = set()                  # launcher files in the temporary directory the job held
        self.segments_before: set[str] = set()
        self.proc: subprocess.Popen | None = None
        self.job = variables.text(variables.JOB_ID) or f"watch{secrets.token_hex(6)}"  # names npddp's segments
        self.signalled: int | None = None    # the signal forwarded to the command, if one came

    def _forward(self, signum, _frame) -> None:
        self.signalled = signum
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)

    def run(self, reraise: bool = True) -> int:
        """The command's exit status (128 + N when killed by signal N).

        A SIGINT, SIGTERM or SIGHUP that arrives meanwhile goes to the command; once it has ended the
        signal is raised again in this process (its own handler decides) unless ``reraise`` is False.
        """
        self.segments_before = segment_files()
        environ = {**(self.popen.get("env") or os.environ), variables.JOB_ID.name: self.job}
        self.proc = subprocess.Popen(self.command, **{**self.popen, "env": environ})
        previous = {sig: signal.signal(sig, self._forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            return self._poll()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if reraise and self.signalled is not None:
                signal.raise_signal(self.signalled)   # a caller's SIGTERM must still end the caller

    def _poll(self) -> int:
        started, pids, listed = time.monotonic(), [], 0.0
        while self.proc.poll() is None:
            now = time.monotonic()
            fast = now - started < _FAST_FOR_S
            if fast or now - listed > 2.0:
                pids, listed = [self.proc.pid, *descendants(self.proc.pid)], now   # the launcher, too
            for pid in pids:
                self.seen |= mapped_segments(pid)
                self.temps |= held_temp_entries(pid)
            try:
                self.proc.wait(_FAST_S if fast else _SLOW_S)
            except subprocess.TimeoutExpired:
                pass
        code = self.proc.returncode
        return 128 - code if code < 0 else code

    def clean(self, code: int) -> list[tuple[str, int]]:
        """After an abnormal end (``code`` != 0): remove the job's segments that nothing maps any more."""
        if code == 0:
            return []
        deadline = time.monotonic() + 2.0            # let the job's last processes go
        while time.monotonic() < deadline and any(descendants(self.proc.pid) if self.proc else ()):
            time.sleep(0.05)
        # what the watch saw mapped, and what appeared while the job ran and nothing maps now (a job that dies
        # within milliseconds of making its segments can end between two looks at its processes' maps)
        removed = remove_unused(self.seen | (segment_files() - self.segments_before))
        gone = {p for p, _ in removed}
        for name in remove_job_segments(self.job, str(SHM)):  # npddp's own, even those nobody mapped in time
            if str(SHM / name) not in gone:
                removed.append((str(SHM / name), 0))
        held = set()                                  # what a live process (another job's, too) still holds
        for entry in os.listdir("/proc") if self.temps else ():
            if entry.isdigit():
                held |= held_temp_entries(int(entry))
        for path in sorted(self.temps - held):        # the launcher's files this job held, and nobody holds now
            if os.path.lexists(path):
                removed.append((path, _remove_entry(path)))
        return removed


def report_removed(removed: list[tuple[str, int]]) -> None:
    """One stderr line naming the files a failed job left that were removed (nothing when there were none)."""
    if removed:
        sys.stderr.write(f"removed {len(removed)} file{'s' * (len(removed) > 1)} "
                         f"({_mib(sum(n for _, n in removed))}) left by the failed job: "
                         f"{', '.join(os.path.basename(p) for p, _ in removed)}\n")


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def main(argv=None) -> int:
    """``run -- COMMAND...`` or ``clean [--dry-run]``; see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m npddp.process.cleanup", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    run = sub.add_parser("run", help="run a launcher command; remove its job's segments if it fails")
    run.add_argument("command", nargs=argparse.REMAINDER, help="the launcher command (after --)")
    clean = sub.add_parser("clean", help="remove your MPI segments that no process uses")
    clean.add_argument("--dry-run", action="store_true", help="only list them")
    clean.add_argument("--min-age", type=float, default=60.0, metavar="S",
                       help="leave segments younger than S seconds (default 60: a job may be starting)")
    args = parser.parse_args(argv)
    if args.what == "clean":
        found = orphans(args.min_age)
        total = 0
        for path in found:
            with_size = path.stat().st_size if path.exists() else 0
            total += with_size
            if not args.dry_run:
                path.unlink(missing_ok=True)
            print(f"{'would remove' if args.dry_run else 'removed'} {path} ({_mib(with_size)})")
        print(f"{len(found)} orphaned segment{'s' * (len(found) != 1)}, {_mib(total)}")
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("run needs a command, e.g. run -- mpirun -n 2 python -m npddp.train")
    watch = Watch(command)
    code = watch.run(reraise=False)            # exits 128 + N itself, after the cleanup
    report_removed(watch.clean(code))
    return code


if __name__ == "__main__":
    sys.exit(main())
