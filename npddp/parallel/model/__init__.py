"""Model parallelism: a data x pipeline x tensor mesh, tensor-parallel layers, pipeline stages and schedules.

See docs/guide/model-parallel.md. Nothing here imports :mod:`npddp.comm` at import time; the groups of
a mesh are built by :func:`mesh_groups` from the raw world (mpi4py communicator or Transport).
"""

from npddp.parallel.model.convert import tensor_parallel
from npddp.parallel.model.groups import MeshGroups, mesh_groups, split_group
from npddp.parallel.model.mesh import Mesh
from npddp.parallel.model.pipeline import Pipeline
from npddp.parallel.model.randomness import RowAlignedDropout
from npddp.parallel.model.schedules import SCHEDULES, schedule
from npddp.parallel.model.stages import PipelineStage, balanced_cut
from npddp.parallel.model.tensor import ColumnParallelLinear, RowParallelLinear, shard_indices

__all__ = ["Mesh", "MeshGroups", "mesh_groups", "split_group", "tensor_parallel", "ColumnParallelLinear",
           "RowParallelLinear", "shard_indices", "PipelineStage", "balanced_cut", "Pipeline", "SCHEDULES",
           "schedule", "RowAlignedDropout"]
