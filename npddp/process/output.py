"""Forwarding the ranks' output through the launcher: whole lines, optionally tagged, never blocked by a closed pipe.

Every rank writes to a pipe of its own; one thread per pipe copies what arrives to the
launcher's stdout or stderr. A line goes out in one write under a lock all the threads share,
so two ranks' lines never mix, whatever the ranks' buffering. A partial line (a prompt with no
newline) goes out once nothing more arrived for :data:`PARTIAL_AFTER_S`, or at the end.
When the launcher's own output is closed (``| head`` exited), what arrives is read and
dropped: a rank never blocks on a full pipe nor dies of a broken one, and the job runs on.
"""

from __future__ import annotations

import os
import select
import sys
import threading

#: Seconds a partial line (no newline yet) waits for the rest before it is written as it is.
PARTIAL_AFTER_S = 0.5
_CHUNK = 1 << 16


class Output:
    """One of the launcher's outputs (stdout or stderr), written whole lines at a time under a shared lock."""

    def __init__(self, stream, lock):
        self.stream, self.lock, self.closed = stream, lock, False

    def write(self, data: bytes) -> None:
        """Write ``data`` in one go; once the reader is gone, drop this and everything after it."""
        with self.lock:
            if self.closed:
                return
            try:
                self.stream.write(data)
                self.stream.flush()
            except (BrokenPipeError, ValueError, OSError):
                self.closed = True
                try:  # the interpreter's flush at exit must not complain either
                    os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
                except (OSError, ValueError):
                    pass


    def say(self, text: str) -> None:
        """Write a message of the launcher's own (text)."""
        self.write(text.encode(errors="replace"))


def launcher_outputs() -> tuple[Output, Output]:
    """This process's stdout and stderr as :class:`Output` objects sharing one lock."""
    lock = threading.RLock()   # re-entrant: a signal handler may report while the main thread writes
    return Output(sys.stdout.buffer, lock), Output(sys.stderr.buffer, lock)


def _tagged(data: bytes, tag: bytes, at_line_start: bool) -> bytes:
    """``data`` with ``tag`` before each line that starts in it."""
    if not tag:
        return data
    lines = data.splitlines(keepends=True)
    return b"".join((tag if i or at_line_start else b"") + line for i, line in enumerate(lines))


def forward(fd: int, out: Output, tag: bytes = b"", partial_after_s: float = PARTIAL_AFTER_S) -> None:
    """Copy pipe ``fd`` to ``out`` until end of file, whole lines at a time, each prefixed with ``tag``; closes ``fd``."""
    pending, at_line_start = b"", True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    try:
        while True:
            if pending and not poller.poll(partial_after_s * 1000):
                out.write(_tagged(pending, tag, at_line_start))     # a prompt: nothing more came
                pending, at_line_start = b"", False
                continue
            data = os.read(fd, _CHUNK)
            if not data:
                break
            pending += data
            cut = pending.rfind(b"\n") + 1
            if cut:
                out.write(_tagged(pending[:cut], tag, at_line_start))
                pending, at_line_start = pending[cut:], True
        if pending:
            out.write(_tagged(pending, tag, at_line_start))
    finally:
        os.close(fd)


def start(fd: int, out: Output, tag: bytes = b"") -> threading.Thread:
    """A daemon thread running :func:`forward` on ``fd``."""
    thread = threading.Thread(target=forward, args=(fd, out, tag), daemon=True)
    thread.start()
    return thread
