"""Data parallelism over a Communicator: DistributedDataParallel, and ZeRO in :mod:`npddp.parallel.zero`."""

from npddp.parallel.ddp import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
