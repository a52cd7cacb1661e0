"""Checkpoints, a library layer: Stateful objects saved to one whole file or to shards and an index.

``save(comm, path, {"model": ModelState(...), "optim": opt, "train": TrainState(...)}, info=RunInfo(...))``
and ``load(comm, path, objects, optimizer=name)`` (saveload); the objects (stateful); the file
(fileformat); every rank's state gathered and restored (state); ``--zero``'s sharded files
(shardwrite, shardread).
"""

from npddp.checkpoint.fileformat import CheckpointError
from npddp.checkpoint.saveload import load, save
from npddp.checkpoint.stateful import CheckpointedOptimizer, ModelState, RunInfo, Stateful, TrainState

__all__ = ["save", "load", "Stateful", "ModelState", "TrainState", "RunInfo", "CheckpointedOptimizer",
           "CheckpointError"]
