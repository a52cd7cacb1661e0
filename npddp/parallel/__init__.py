"""Data parallelism over a Communicator: DistributedDataParallel, and ZeRO in :mod:`npddp.parallel.zero`;
model parallelism (tensor, pipeline, a device mesh) in :mod:`npddp.parallel.model`."""

from npddp.parallel.ddp import DistributedDataParallel
from npddp.parallel.model import Mesh, Pipeline, PipelineStage, mesh_groups, tensor_parallel

__all__ = ["DistributedDataParallel", "Mesh", "Pipeline", "PipelineStage", "mesh_groups", "tensor_parallel"]
