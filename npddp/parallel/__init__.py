"""Parallel training over a Communicator, as ``torch.nn.parallel`` and ``torch.distributed.algorithms``:

* data parallelism: :class:`DistributedDataParallel`; ZeRO (:mod:`npddp.parallel.zero`) shards the
  optimizer state (:class:`ZeroRedundancyOptimizer`, stage 1), also the gradients and parameters
  (:class:`ZeroDataParallel` with :class:`ShardedOptimizer`, stages 2 and 3; :class:`ShardedInit`);
* DDP comm hooks (:mod:`npddp.parallel.hooks`, :mod:`npddp.parallel.powersgd`) and the registry of
  hooks by name that ``--comm-hook`` and plugins use (:func:`register_comm_hook_factory`);
* model averagers called after the optimizer step (local SGD, :mod:`npddp.parallel.averaging`);
* model parallelism (tensor, pipeline, a device mesh) in :mod:`npddp.parallel.model`.

Importing this package loads no communication (:mod:`npddp.comm` is imported when a wrapper is built).
"""

from npddp.parallel.averaging import ModelAverager, PeriodicModelAverager
from npddp.parallel.hook_registry import comm_hook_names, register_comm_hook_factory
from npddp.parallel.ddp import DistributedDataParallel
from npddp.parallel.hooks import (GradBucket, Handle, HookState, TopKState, allreduce_hook, allreduce_prescaled,
                                  fp16_compress_hook, fp16_compress_wrapper, topk_hook)
from npddp.parallel.model import Mesh, Pipeline, PipelineStage, mesh_groups, tensor_parallel
from npddp.parallel.powersgd import PowerSGDState, powersgd_hook
from npddp.parallel.wrapper import UnsyncedGradientsError
from npddp.parallel.zero import ShardedInit, ShardedOptimizer, ZeroDataParallel, ZeroRedundancyOptimizer

__all__ = ["DistributedDataParallel", "UnsyncedGradientsError",
           "ZeroRedundancyOptimizer", "ZeroDataParallel", "ShardedOptimizer", "ShardedInit",
           "GradBucket", "Handle", "HookState", "allreduce_hook", "allreduce_prescaled", "fp16_compress_hook",
           "fp16_compress_wrapper", "TopKState", "topk_hook", "PowerSGDState", "powersgd_hook",
           "register_comm_hook_factory", "comm_hook_names",
           "ModelAverager", "PeriodicModelAverager",
           "Mesh", "Pipeline", "PipelineStage", "mesh_groups", "tensor_parallel"]
