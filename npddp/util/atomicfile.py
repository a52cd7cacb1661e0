"""Crash-safe file writes: build the file in memory, write it to a recognisable temporary file
beside the target, fsync it and ``os.replace`` it onto the target.

A crash leaves the old file or the new one, never half of one. HDF5 files are built by the
HDF5 library in memory (``driver="core"``) and written with plain Python I/O, so a full disk or
an I/O error is one ``OSError`` (``ENOSPC``, ``EIO``, ...) raised by :func:`atomic_h5`, with
the temporary file removed and the target untouched; the HDF5 library never sees the failure.

Temporary files are named ``.<target name>.<host>.<pid>.<random>.npddp.tmp``. One whose writer
is gone (same host, no live process with that pid started before the file was last written)
is stale: what a crash, a ``SIGKILL`` or an ``MPI_Abort`` during a write leaves behind.
:func:`remove_stale_temps` removes the stale ones of a target; :func:`atomic_h5` calls it
before every write.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
import stat
import sys
from pathlib import Path

#: The end of every temporary file name.
TEMP_SUFFIX = ".npddp.tmp"


def temp_path(target: Path) -> Path:
    """A fresh temporary file name beside ``target``, naming this host and process."""
    host = socket.gethostname().replace("/", "_") or "localhost"
    return target.parent / f".{target.name}.{host}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}"


def temp_owner(path: Path, target: Path) -> tuple[str, int] | None:
    """(host, pid) of the writer when ``path`` is a temporary file of ``target``, else None."""
    name, head = path.name, f".{target.name}."
    if not (name.startswith(head) and name.endswith(TEMP_SUFFIX)):
        return None
    parts = name[len(head):-len(TEMP_SUFFIX)].rsplit(".", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def _started_after(pid: int, moment: float) -> bool | None:
    """Whether process ``pid`` started after ``moment`` (epoch seconds); None when it cannot be told."""
    try:
        with open("/proc/stat") as f:
            boot = next(float(line.split()[1]) for line in f if line.startswith("btime"))
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        return boot + ticks / os.sysconf("SC_CLK_TCK") > moment + 1.0
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def writer_alive(pid: int, written_at: float) -> bool:
    """True when a process ``pid`` that may have written a file at ``written_at`` still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass                                   # someone else's live process
    return _started_after(pid, written_at) is not True   # a newer process reusing the pid is not the writer


def stale_temps(target) -> list[Path]:
    """Temporary files of ``target`` left by writers on this host that no longer run."""
    target = Path(target)
    host = socket.gethostname().replace("/", "_") or "localhost"
    found = []
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return []
    for entry in entries:
        owner = temp_owner(Path(entry.name), target)
        if owner is None or owner[0] != host or owner[1] == os.getpid():
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode) and not writer_alive(owner[1], info.st_mtime):
            found.append(Path(entry.path))
    return sorted(found)


def remove_stale_temps(target) -> tuple[int, int]:
    """Remove the stale temporary files of ``target``; (files removed, bytes freed)."""
    count = freed = 0
    for path in stale_temps(target):
        with contextlib.suppress(OSError):
            size = path.stat().st_size
            path.unlink()
            count, freed = count + 1, freed + size
    return count, freed


def write_bytes_atomic(target, data) -> None:
    """Write ``data`` to ``target`` through a temporary file: the old file or the new one, never half.

    On any failure (``OSError`` such as ``ENOSPC``, or an interrupt) the temporary file is
    removed and the exception propagates; the target is untouched.
    """
    target = Path(target)
    tmp = temp_path(target)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        try:
            view = memoryview(data).cast("B")
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(target.parent)


def target_problem(where: str, path) -> str | None:
    """Why ``path`` (named ``where`` in the message) cannot be replaced by an atomic write, or None.

    Refused: a directory, anything that is not a regular file (a FIFO would block, a device such
    as /dev/null would be replaced by a regular file), a missing or read-only directory, one
    where a file cannot be created (tried).
    """
    parent = os.path.dirname(os.path.abspath(path))
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        return f"{where}: {exc.strerror or exc}"
    if mode is not None and stat.S_ISDIR(mode):
        return f"{where} is a directory"
    if mode is not None and not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        return f"{where} is {kind}, not a regular file; refusing to use it (choose a file path)"
    if not os.path.isdir(parent):
        return f"{where}: directory {parent!r} does not exist"
    if not os.access(parent, os.W_OK):
        return f"{where}: directory {parent!r} is not writable"
    return _create_problem(where, Path(os.path.abspath(path)))


def _create_problem(where: str, target: Path) -> str | None:
    """Why a temporary file cannot be created beside ``target`` (tried, then removed), or None.

    Catches what permission bits do not tell (to root, above all): /proc, a read-only mount.
    """
    probe = temp_path(target)
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        return f"{where}: cannot create a file in directory {str(target.parent)!r}: {exc.strerror or exc}"
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


def _check_target(path) -> Path:
    """``path`` as a Path whose directory exists and that is not itself a directory."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    target = Path(path)
    if target.is_dir():      # strerror says why; the callers' "cannot write PATH: ..." names the path once
        raise IsADirectoryError(errno.EISDIR, "it is a directory; expected a file path", str(target))
    if not target.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, f"directory {target.parent} does not exist", str(target))
    return target


@contextlib.contextmanager
def atomic_h5(path, finish=None, **h5py_kwargs):
    """Open a new in-memory HDF5 file that appears at ``path`` only once complete.

    Yields an ``h5py.File``; on normal exit its image (``finish(image)`` when given, e.g. to
    prepend a user block) is written with :func:`write_bytes_atomic`, stale temporary files of
    ``path`` being removed first. On an exception nothing is written and the exception
    propagates; an existing file at ``path`` is left untouched either way until the new one is
    complete on disk.
    """
    import h5py

    target = _check_target(path)
    f = h5py.File(f"{target.name}.{os.getpid()}.{secrets.token_hex(8)}", "w", driver="core",
                  backing_store=False, **h5py_kwargs)
    try:
        yield f
        f.flush()
        image = f.id.get_file_image()
    finally:
        f.close()
    if finish is not None:
        image = finish(image)
    remove_stale_temps(target)
    write_bytes_atomic(target, image)


def _fsync_dir(directory: Path) -> None:
    """fsync a directory so a rename in it is durable (skipped where unsupported)."""
    if sys.platform.startswith("win"):
        return
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
