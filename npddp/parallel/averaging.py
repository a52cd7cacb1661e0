"""Model averaging outside DDP: local SGD as an averager the loop calls after ``optimizer.step()``.

An averager derives from the abstract :class:`ModelAverager`. Like PyTorch's ``PeriodicModelAverager``: for the first ``warmup_steps`` steps it does nothing
(DDP averages gradients then, as usual); afterwards every ``period`` steps it replaces each
parameter by its mean over ranks. Between averagings the replicas differ. To train with local
SGD, wrap the model in DDP and run the steps inside ``ddp.no_sync()`` once the warm-up is over
(the training CLI's ``--local-sgd K`` does exactly that)::

    averager = PeriodicModelAverager(comm, period=4, warmup_steps=0)
    ...
    optimizer.step()
    averager.average_parameters(model.parameters())
"""

from __future__ import annotations

import abc

import numpy as np

from npddp.util.shown import shown

__all__ = ["ModelAverager", "PeriodicModelAverager"]


class ModelAverager(abc.ABC):
    """Base of model averagers (PyTorch's ``ModelAverager``): called after each optimizer step."""

    __slots__ = ()

    comm: object   # the communicator parameters are averaged over
    step: int      # calls of average_parameters so far (restored on resume)

    @abc.abstractmethod
    def average_parameters(self, params) -> bool:
        """Count a step; when this step averages, replace every parameter by its mean over ranks. True if averaged."""


class PeriodicModelAverager(ModelAverager):
    """Average parameters over ranks every ``period`` steps once ``warmup_steps`` steps have passed."""

    __slots__ = ("comm", "period", "warmup_steps", "step", "calls", "bytes")

    def __init__(self, comm, period: int, warmup_steps: int = 0):
        for name, value, low in (("period", period, 1), ("warmup_steps", warmup_steps, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {shown(value)}")
        self.comm, self.period, self.warmup_steps = comm, period, warmup_steps
        self.step = 0    # calls of average_parameters so far (restored on resume)
        self.calls = 0   # all-reduces made by the last call
        self.bytes = 0   # bytes they moved (per rank)

    def local(self) -> bool:
        """True once the warm-up is over: the steps run without gradient averaging (inside ``ddp.no_sync()``)."""
        return self.step >= self.warmup_steps

    def average_parameters(self, params) -> bool:
        """Count a step; on an averaging step replace every parameter by its mean over ranks. True if averaged."""
        self.step += 1
        self.calls = self.bytes = 0
        if self.step <= self.warmup_steps or (self.step - self.warmup_steps) % self.period or self.comm.size == 1:
            return False
        for p in params:
            self.comm.allreduce(p.data)
            np.divide(p.data, self.comm.size, out=p.data, casting="same_kind")
            self.calls += 1
            self.bytes += p.data.nbytes
        return True
