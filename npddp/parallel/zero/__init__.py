"""Sharded data parallelism (ZeRO): stage 1 shards optimizer state, 2 also gradients, 3 also parameters.

* :class:`ZeroRedundancyOptimizer` (stage 1, PyTorch's semantics): wraps any optimizer over DDP;
* :class:`ZeroDataParallel` with :class:`ShardedOptimizer` (stages 2 and 3): stands in for DDP;
* :class:`ShardedInit`: builds a model with each rank keeping only its part (ZeRO-3's construction);
* :func:`partition_parameters`: the whole-parameter, greedy-by-size partition stage 1 uses.
"""

from npddp.parallel.zero.construct import ShardedInit
from npddp.parallel.zero.optimizer import ZeroRedundancyOptimizer
from npddp.parallel.zero.partition import partition_parameters
from npddp.parallel.zero.sharded import STAGES, ShardedOptimizer, ZeroDataParallel

__all__ = ["STAGES", "ShardedInit", "ShardedOptimizer", "ZeroDataParallel", "ZeroRedundancyOptimizer", "partition_parameters"]
