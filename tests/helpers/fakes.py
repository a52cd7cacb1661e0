"""Stand-ins for serial and DDP tests: a world of one rank, a spy on all-reduces, a layer that may leave its
parameter unused."""

from __future__ import annotations

import numpy as np

from npddp.nn import Module, Parameter


class IallreduceSpy:
    """Communicator wrapper that appends ``("iallreduce", buf)`` to ``events`` as each non-blocking all-reduce starts."""

    def __init__(self, inner, events: list):
        self.inner, self.events = inner, events

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def iallreduce(self, buf, op="sum"):
        self.events.append(("iallreduce", buf))
        return self.inner.iallreduce(buf, op)


class Idle(Module):
    """A layer whose parameter its backward writes only when ``writes`` (an unused parameter otherwise)."""

    def __init__(self, writes: bool = False):
        super().__init__()
        self.scale = Parameter(np.ones(3))
        self.writes = writes

    def forward(self, x):
        return x

    def backward(self, dout):
        if self.writes:
            self.scale.grad += 1.0
        return dout


def stale_then_backward(wrapper, model, x, via="model"):
    """Gradients full of stale 5s, a lazy zero_grad (of the model or of the wrapper), one backward through ``wrapper``."""
    for p in model.parameters():
        p.grad[...] = 5.0
    (model if via == "model" else wrapper).zero_grad()
    wrapper.backward(np.ones_like(wrapper(x)))


class OneRank:
    """The communicator of a world of one (nothing is ever sent): stands in for a Communicator in serial tests."""

    rank, size, name, shared_memory = 0, 1, "mpi", False

    def empty(self, n, dtype=np.float32):
        return np.zeros(n, dtype=dtype)

    def broadcast(self, buf, root=0):
        return buf

    def allreduce(self, buf, op="sum", out=None):
        return buf

    def allgather(self, buf):
        return buf[None].copy()
