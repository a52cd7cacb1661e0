"""Cross-memory attach: copy straight between this process and a peer's private memory (one copy, no staging).

Linux's ``process_vm_readv`` / ``process_vm_writev`` copy between two address spaces inside the
kernel. They need the same user and a ptrace policy that lets one process attach to the other
(``kernel.yama.ptrace_scope`` 0, or 1 after the target declared any process may, which
:func:`allow_peers` does); containers may forbid the calls outright. :func:`why_not` says, in
one line, why they cannot be used here, or returns "" when they can; the node group then
probes its peers once (:func:`npddp.comm.node.single_copy.agree_on_single_copy`) before relying on them.

A peer that has exited makes a call fail with ESRCH, raised here as ConnectionError, so a rank
killed while its memory is read ends the collective at once.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

import numpy as np

from npddp.util import variables

_YAMA = "/proc/sys/kernel/yama/ptrace_scope"
_PR_SET_PTRACER, _PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1).value


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _bind():
    """``(readv, writev, prctl)`` from the C library, or None where there are none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        readv, writev, prctl = libc.process_vm_readv, libc.process_vm_writev, libc.prctl
    except (OSError, AttributeError):
        return None
    for f in (readv, writev):
        f.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.POINTER(_IOVec),
                      ctypes.c_ulong, ctypes.c_ulong]
        f.restype = ctypes.c_ssize_t
    return readv, writev, prctl


_CALLS = _bind()


def ptrace_scope() -> int:
    """``kernel.yama.ptrace_scope`` (-1 where Yama is absent: plain same-user rules)."""
    try:
        with open(_YAMA) as f:
            return int(f.read().strip() or -1)
    except (OSError, ValueError):
        return -1


def why_not(environ=None) -> str:
    """One line saying why single-copy transfers are off on this process, or "" when they may be tried."""
    if not variables.flag(variables.SINGLE_COPY, environ):
        return f"{variables.SINGLE_COPY.name}={variables.text(variables.SINGLE_COPY, environ).lower()}"
    if _CALLS is None:
        return "no process_vm_readv on this platform (Linux only)"
    scope = ptrace_scope()
    if scope >= 2:
        return f"kernel.yama.ptrace_scope={scope} forbids attaching to peers (0 or 1 allows it)"
    return ""


def allow_peers() -> None:
    """Under ptrace_scope 1, let processes other than our ancestors read our memory (as MPI libraries do)."""
    if _CALLS is not None and ptrace_scope() == 1:
        _CALLS[2](_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0)


def _move(which: int, pid: int, remote: int, local: np.ndarray) -> None:
    """Copy ``local.nbytes`` between ``local`` and address ``remote`` of process ``pid`` (0: read, 1: write)."""
    call = _CALLS[which]
    done, total, base = 0, local.nbytes, local.ctypes.data
    mine, theirs = _IOVec(), _IOVec()
    while done < total:
        mine.base, mine.len = base + done, total - done
        theirs.base, theirs.len = remote + done, total - done
        got = call(pid, ctypes.byref(mine), 1, ctypes.byref(theirs), 1, 0)
        if got <= 0:
            err = ctypes.get_errno() if got < 0 else errno.EIO
            if err == errno.ESRCH:
                raise ConnectionError(f"process {pid} on this node has died")
            what = "read from" if which == 0 else "write to"
            raise ConnectionError(f"cannot {what} the memory of process {pid} on this node: {os.strerror(err)}")
        done += got


def read(pid: int, remote: int, into: np.ndarray) -> None:
    """Fill ``into`` with the bytes at address ``remote`` of process ``pid``."""
    _move(0, pid, remote, into)


def write(pid: int, remote: int, data: np.ndarray) -> None:
    """Write ``data`` to address ``remote`` of process ``pid``."""
    _move(1, pid, remote, data)
