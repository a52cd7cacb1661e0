"""A group's communicator with a stopwatch: the seconds its blocking calls took, for a split run's comm share.

:class:`ClockedGroup` stands in for a mesh group's Communicator (the tensor group whose
all-reduces the tensor-parallel layers make, the pipeline group whose sends and receives carry
activations and their gradients). Every blocking call it times (``allreduce``, ``send``,
``recv``, ``broadcast``, and sequence parallelism's ``allgather`` and ``reduce_scatter``) adds its wall time, waiting for the peer included, to ``seconds``, and
one to ``calls``; the moved bytes go to ``nbytes``. Anything else passes through unchanged.
"""

from __future__ import annotations

import time

import numpy as np

#: The blocking calls counted, each moving the array given first.
TIMED = ("allreduce", "send", "recv", "broadcast", "allgather", "reduce_scatter")


class ClockedGroup:
    """``comm`` with its blocking calls timed (see the module docstring); ``reset()`` zeroes the counts."""

    def __init__(self, comm):
        self.comm = comm
        self.seconds, self.calls, self.nbytes = 0.0, 0, 0

    def reset(self) -> None:
        """Zero the time, calls and bytes counted so far."""
        self.seconds, self.calls, self.nbytes = 0.0, 0, 0

    def _timed(self, name: str, buf: np.ndarray, args, kwargs):
        t0 = time.perf_counter()
        try:
            return getattr(self.comm, name)(buf, *args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0
            self.calls += 1
            self.nbytes += getattr(buf, "nbytes", 0)

    def allreduce(self, buf, *args, **kwargs):
        """The group's all-reduce, timed."""
        return self._timed("allreduce", buf, args, kwargs)

    def send(self, buf, *args, **kwargs):
        """The group's blocking send, timed."""
        return self._timed("send", buf, args, kwargs)

    def recv(self, buf, *args, **kwargs):
        """The group's blocking receive, timed (the wait for the sender included)."""
        return self._timed("recv", buf, args, kwargs)

    def broadcast(self, buf, *args, **kwargs):
        """The group's broadcast, timed."""
        return self._timed("broadcast", buf, args, kwargs)

    def allgather(self, buf, *args, **kwargs):
        """The group's all-gather, timed (``buf``: this rank's block)."""
        return self._timed("allgather", buf, args, kwargs)

    def reduce_scatter(self, buf, *args, **kwargs):
        """The group's reduce-scatter, timed (``buf``: the whole vector)."""
        return self._timed("reduce_scatter", buf, args, kwargs)

    def __getattr__(self, name: str):
        return getattr(self.comm, name)
