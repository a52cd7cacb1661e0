"""What a checkpoint holds, as objects that declare ``state_dict()`` and ``load_state_dict()`` (PyTorch DCP's Stateful).

:func:`npddp.checkpoint.save` takes ``{"model": ModelState, "optim": optimizer, "train": TrainState}``
and a :class:`RunInfo`. An optimizer (``npddp.optim``'s, or a sharded one in a
:class:`CheckpointedOptimizer`) is Stateful as it is. :class:`ModelState` is an engine's side:
its parameters by name, its dropout streams and its comm hook state, on this rank.
:class:`TrainState` is where a run stands and its running sums. :class:`RunInfo` says what the
file records about the run that no object holds (its settings, backend, environment, input).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from npddp.optim import Wrapping
from npddp.parallel.hooks import HookState


class Stateful(Protocol):
    """An object a checkpoint saves and restores."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@dataclass
class TrainState:
    """Where a run stands: complete epochs, batches of the epoch in progress, optimizer steps, running sums."""

    epochs_done: int = 0
    batches_done: int = 0
    step: int = 0
    totals: np.ndarray = field(default_factory=lambda: np.zeros(0))
    columns: tuple = ()

    def state_dict(self) -> dict:
        """The position and a copy of the running sums."""
        return {"epochs_done": int(self.epochs_done), "batches_done": int(self.batches_done),
                "step": int(self.step), "totals": np.array(self.totals, dtype=np.float64),
                "columns": tuple(self.columns)}

    def load_state_dict(self, state: dict) -> None:
        """Take a saved position and running sums."""
        self.epochs_done, self.batches_done, self.step = (int(state[k]) for k in ("epochs_done", "batches_done",
                                                                                  "step"))
        self.totals = np.array(state["totals"], dtype=np.float64)
        self.columns = tuple(state.get("columns", self.columns))


@dataclass
class RunInfo:
    """What the file records of the run beside the objects' state (written as attributes)."""

    config: dict                   # the settings that rebuild the model and continue the run
    backend: str
    optimizer: str                 # the optimizer's name ("sgd", "adamw")
    attrs: dict = field(default_factory=dict)      # the environment (rank 0's)
    input_shape: tuple = ()        # one input row, as the model takes it
    num_classes: int = 0


class ModelState:
    """An engine's state on this rank: parameters by name, dropout streams, comm hook state.

    ``named``: ``(name, holder of .data)`` pairs (a split model's are the whole model's, data on
    rank 0); ``dropouts``: objects with ``get_rng_state``/``set_rng_state``; ``engine``: where the
    comm hook state and the step count live (None: neither). ``per_rank``: replicas differ (local
    SGD), so parameters and optimizer buffers are saved per rank. ``replicas``: the world size the
    file records when it is not the communicator's (a split model's data replicas).
    """

    def __init__(self, named, dropouts=(), engine=None, per_rank: bool = False, replicas: int | None = None):
        self.named, self.dropouts, self.engine = list(named), list(dropouts), engine
        self.per_rank, self.replicas = per_rank, replicas

    @property
    def hooks(self) -> HookState | None:
        """The engine's comm hook state, when it keeps one to save."""
        hook = None if self.engine is None else self.engine.comm_hook_state
        return hook if isinstance(hook, HookState) else None

    def state_dict(self) -> dict:
        """This rank's ``params`` (name -> array), ``dropout`` ((n, 6) uint64 or None) and ``hooks`` (name -> array)."""
        dropout = np.stack([d.get_rng_state() for d in self.dropouts]) if self.dropouts else None
        return {"params": {name: p.data for name, p in self.named}, "dropout": dropout,
                "hooks": self.hooks.state_dict() if self.hooks is not None else {}}

    def load_state_dict(self, state: dict) -> None:
        """Copy what ``state`` holds (any of ``params``, ``dropout``, ``hooks``, ``steps``) into this rank's objects."""
        for name, p in self.named:
            if name in state.get("params", {}):
                np.copyto(p.data, state["params"][name])
        if state.get("dropout") is not None:
            for d, words in zip(self.dropouts, state["dropout"]):
                d.set_rng_state(words)
        if state.get("hooks") and self.hooks is not None:
            self.hooks.load_state_dict(state["hooks"])
        if "steps" in state and self.engine is not None:
            self.engine.steps = int(state["steps"])


class CheckpointedOptimizer(Wrapping):
    """A sharded optimizer (ZeRO) as the training loop and its checkpoints see a plain one."""

    wrapped = "sharded"

    def __init__(self, sharded, comm):
        self.sharded, self.comm = sharded, comm

    def step(self) -> None:
        """Step this rank's shard."""
        self.sharded.step()

    def zero_grad(self) -> None:
        """Zero every gradient."""
        self.sharded.zero_grad()

    def state_dict(self) -> dict:
        """The whole-model state on rank 0, its keys and shapes (zeros) elsewhere; collective once stepped.

        Before the first step the state is all zeros and nothing is exchanged, so rank 0 alone
        may ask for it (a resume checks the checkpoint against it); after steps every rank
        calls it together (a checkpoint being collected).
        """
        if self.sharded.step_count == 0:
            return self.sharded.template_state_dict()
        self.sharded.consolidate_state_dict(to=0)
        return self.sharded.state_dict() if self.comm.rank == 0 else self.sharded.template_state_dict()

    def load_state_dict(self, d: dict) -> None:
        """Load a whole-model state (the same on every rank); each keeps its part."""
        self.sharded.load_state_dict(d)
