"""Progress outstanding non-blocking all-reduces from a background thread (``create(..., progress="thread")``).

By default a non-blocking all-reduce moves only when its owner calls ``test()`` or ``wait()``
(DDP polls between layers). With a progress thread, a daemon thread keeps calling ``test()`` on
every outstanding handle, so a bucket's reduction runs while backward computes, on another
core, the way Horovod's and oneCCL's background threads do. NumPy's reductions and copies, and
MPI's calls, release the GIL, so the thread's work overlaps the main thread's BLAS work. It
helps only when the rank has a core to spare; on a node where every core runs a rank it costs a
little (the thread competes for the rank's own core), which is why it is off by default.

:class:`ThreadedCommunicator` wraps any backend: every call into the wrapped communicator holds
one lock, so the thread and the caller never drive it at the same time.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

PROGRESS = ("caller", "thread")
_IDLE_S = 0.0005  # seconds between two sweeps over outstanding handles
_GRACE_S = 2.0    # seconds a wait past the timeout still gives the thread to report the call's own error


class ThreadedWork:
    """Handle of a non-blocking call the progress thread drives; ``wait()`` sleeps until it is done."""

    __slots__ = ("inner", "done", "error", "operation", "_owner")

    def __init__(self, owner, inner, operation: str):
        self._owner, self.inner, self.operation = owner, inner, operation
        self.done = threading.Event()
        self.error: BaseException | None = None

    def test(self) -> bool:
        """True once the thread has completed it; the error the thread met (a peer's mismatch, the timeout) raises."""
        if not self.done.is_set():   # (read first: the thread sets the error, then done)
            return False
        if self.error is not None:
            raise self.error
        return True

    def wait(self) -> np.ndarray:
        """Block until complete; return the result. The thread's own test() raises at the call's deadline; this
        waits the communicator's timeout and a grace for that error before it names the call itself."""
        timeout = self._owner.timeout
        if timeout != float("inf") and not self.done.wait(timeout + min(timeout, _GRACE_S)):
            raise TimeoutError(f"[rank {self._owner.rank}] {self._owner.name} {self.operation} did not complete "
                               f"within {timeout:g} s (driven by the progress thread): a peer crashed, hangs, or "
                               "called a different collective")
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.inner.wait()


class ThreadedCommunicator:
    """Any communicator, with its outstanding all-reduces driven by a background thread."""

    def __init__(self, inner):
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "lock", threading.RLock())
        object.__setattr__(self, "_works", [])
        object.__setattr__(self, "_wake", threading.Event())
        thread = threading.Thread(target=self._run, name="npddp-progress", daemon=True)
        object.__setattr__(self, "_thread", thread)
        thread.start()

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if not callable(attr) or name in ("iallreduce", "ireduce_scatter", "iallgather", "ialltoall", "ialltoallv"):
            return attr

        def locked(*args, **kwargs):
            with self.lock:
                return attr(*args, **kwargs)
        locked.__doc__ = attr.__doc__
        return locked

    def __setattr__(self, name, value):
        setattr(self.inner, name, value)

    @property
    def progress(self) -> str:
        """``thread``."""
        return "thread"

    def iallreduce(self, buf, op="sum") -> ThreadedWork:
        """Start the all-reduce; the progress thread drives it from now on."""
        with self.lock:
            return self._driven(self.inner.iallreduce(buf, op), "iallreduce")

    def ireduce_scatter(self, buf, op="sum", out=None) -> ThreadedWork:
        """Start the reduce-scatter; the progress thread drives it from now on."""
        with self.lock:
            return self._driven(self.inner.ireduce_scatter(buf, op, out), "ireduce_scatter")

    def iallgather(self, buf, out=None) -> ThreadedWork:
        """Start the all-gather; the progress thread drives it from now on."""
        with self.lock:
            return self._driven(self.inner.iallgather(buf, out), "iallgather")

    def ialltoall(self, buf, out=None) -> ThreadedWork:
        """Start the all-to-all; the progress thread drives it from now on."""
        with self.lock:
            return self._driven(self.inner.ialltoall(buf, out), "ialltoall")

    def ialltoallv(self, buf, sendcounts, recvcounts, out=None) -> ThreadedWork:
        """Start the all-to-all-v; the progress thread drives it from now on."""
        with self.lock:
            return self._driven(self.inner.ialltoallv(buf, sendcounts, recvcounts, out), "ialltoallv")

    def _driven(self, inner, operation: str) -> ThreadedWork:
        """Hand ``inner`` (a call of ``operation``) to the progress thread (the caller holds the lock)."""
        work = ThreadedWork(self, inner, operation)
        self._works.append(work)
        self._wake.set()
        return work

    def _run(self) -> None:
        """Sweep the outstanding handles until none is left, then sleep until one arrives."""
        while True:
            self._wake.wait()
            with self.lock:
                for work in tuple(self._works):
                    try:
                        finished = work.inner.test()
                    except BaseException as exc:  # noqa: BLE001  (handed to the waiting caller)
                        work.error, finished = exc, True
                    if finished:
                        self._works.remove(work)
                        work.done.set()
                if not self._works:
                    self._wake.clear()
            if self._works:
                os.sched_yield()
                time.sleep(_IDLE_S)
