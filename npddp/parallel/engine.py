"""The one contract every training engine keeps: DDP, the ZeRO stages and a split (tensor/pipeline) model.

A training loop drives any engine the same way, and never asks which one it holds::

    engine.zero_grad()
    loss = engine.train_batch(x, y, loss_fn)      # forward, loss, backward (micro-batches, schedules inside)
    engine.step(optimizer)
    sums = engine.evaluate(X_val, y_val, loss_fn)  # (loss sum, correct, rows) over all ranks

:class:`Engine` is the base class that declares it: a subclass defines the abstract methods and
sets the attributes annotated below in its constructor; the optimizer step counter
(:attr:`Engine.steps`, which moves the tracer's window) is shared. Subclasses:
:class:`~npddp.parallel.wrapper.DataParallelModule` (DDP, ZeRO-2/3; ZeRO-1 is DDP with a sharded
optimizer) and :class:`~npddp.parallel.model.engine.SplitEngine`.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

__all__ = ["Engine"]


class Engine(abc.ABC):
    """A model's training step over ranks: ``train_batch``, ``step``, ``zero_grad``, ``evaluate``, state dicts."""

    # --- what a subclass sets in its constructor
    stats: Any                   # StepStats: timings and traffic of the last step on this rank
    tracer: Any                  # the timeline tracer (tracing.NULL when untraced)
    replicas: Any                # the Communicator the data replicas share (batches are split over it)
    reports: bool                # this rank's losses and validation counts are among the ones added up
    splits_model: bool           # each rank holds part of the model (a checkpoint assembles the whole)

    @property
    def steps(self) -> int:
        """Optimizer steps taken (restored on resume); setting it moves the tracer's window."""
        return self._steps

    @steps.setter
    def steps(self, value: int) -> None:
        self._steps = value
        self.tracer.at_step(value)

    @abc.abstractmethod
    def train_batch(self, x: np.ndarray, y: np.ndarray, loss_fn, local: bool = False):
        """Forward, loss and backward of one batch (this replica's rows); the mean loss where it is known.

        ``local``: the gradients are not averaged over the data replicas (local SGD between averagings).
        """

    @abc.abstractmethod
    def step(self, optimizer) -> None:
        """Step ``optimizer`` on the reduced gradients and count the step."""

    @abc.abstractmethod
    def zero_grad(self) -> None:
        """Zero every gradient this engine reduces."""

    @abc.abstractmethod
    def evaluate(self, X: np.ndarray, y: np.ndarray, loss_fn) -> np.ndarray:
        """(loss sum, correct, rows) of ``X``, ``y`` over all ranks, forward only (collective)."""

    @abc.abstractmethod
    def reduce_metrics(self, sums) -> np.ndarray:
        """Sum metric totals over ranks."""

    @abc.abstractmethod
    def parameters(self) -> list:
        """The parameters this rank trains (each once)."""

    @abc.abstractmethod
    def named_parameters(self) -> list:
        """``(name, parameter)`` of the parameters this rank trains."""

    @abc.abstractmethod
    def full_parameters(self):
        """A context within which every parameter this rank trains holds its full value."""

    @abc.abstractmethod
    def state_dict(self) -> dict:
        """This rank's parameters by name (copies)."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict, strict: bool = True) -> tuple[list[str], list[str]]:
        """Copy ``state`` (name -> array) into the parameters; (missing names, unexpected names)."""
