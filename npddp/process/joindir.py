"""The launcher's join directory (``$TMPDIR/npddp-join-*``): made per job, removed by whoever outlives its launcher.

``python -m npddp.run`` gives its ranks a directory where each marks joining and having joined
the TCP world (:func:`npddp.util.env.mark_join`). The launcher removes it when the job ends;
a launcher killed by SIGKILL cannot, and its ranks die with it. So the launcher holds an
exclusive ``flock`` on a file in the directory for as long as it lives (the kernel drops it
when the process dies, however it dies), and every launch first removes this user's join
directories whose lock nobody holds. A directory without the lock file (still being made, or
made by an older launcher) is never touched, nor is one whose launcher lives.
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import tempfile

PREFIX = "npddp-join-"
#: The file whose lock says the directory's launcher is alive.
OWNER = "launcher.lock"


class JoinDir:
    """A join directory held by this process: ``path``, and :meth:`remove` when the job ends."""

    def __init__(self, path: str, lock_fd: int):
        self.path, self._lock_fd = path, lock_fd

    def remove(self) -> None:
        """Remove the directory and let go of its lock (twice does nothing)."""
        if self._lock_fd < 0:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock_fd)
        self._lock_fd = -1


def create(job: str, parent: str | None = None) -> JoinDir:
    """Remove abandoned join directories in ``parent`` (the temporary directory), then make and lock a new one."""
    parent = tempfile.gettempdir() if parent is None else parent
    sweep(parent)
    path = tempfile.mkdtemp(prefix=f"{PREFIX}{job}-", dir=parent)
    staging = os.path.join(path, f".{OWNER}")
    fd = os.open(staging, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(staging, os.path.join(path, OWNER))   # a sweep sees the lock file only once it is locked
    return JoinDir(path, fd)


def abandoned(parent: str) -> list[str]:
    """This user's join directories in ``parent`` whose launcher is gone (nobody holds their lock)."""
    found = []
    for path in sorted(glob.glob(os.path.join(glob.escape(parent), f"{PREFIX}*"))):
        try:
            if os.lstat(path).st_uid != os.getuid():
                continue
            fd = os.open(os.path.join(path, OWNER), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue                     # no lock file: being made, or not ours to judge
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            found.append(path)
        except OSError:
            pass                         # its launcher holds it: a live job
        finally:
            os.close(fd)
    return found


def sweep(parent: str) -> list[str]:
    """Remove the join directories in ``parent`` that :func:`abandoned` finds; the paths removed."""
    removed = abandoned(parent)
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed
