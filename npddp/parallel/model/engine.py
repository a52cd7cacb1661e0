"""The engine of a split model (tensor and pipeline parallelism): a Pipeline over a mesh, with DDP over its data group.

:class:`MeshEngine` builds the (dp, pp, tp) groups from the world, splits the full model
(``tensor_parallel``, then ``PipelineStage``) and runs it as a :class:`Pipeline` with DDP over
the data group. It keeps the engine contract (:class:`~npddp.parallel.engine.Engine`):
:meth:`train_batch` and :meth:`evaluate` run through the pipeline, and it offers the whole-model
views a checkpoint is written from and resumed into (:mod:`npddp.parallel.model.whole`). Dropout
streams are seeded as one process's and positioned by sample row, so a run matches one process
on the same global batch.

With a tracer over the world every rank is recorded: the pipeline's micro-batches, sends,
receives and idle stretches, the tensor group's all-reduces and the data group's DDP; each
rank's process is named by its (dp, pp, tp) coordinates.

Over the data group, as for a model that is not split: a comm hook reduces DDP's buckets, a
ZeRO-1 optimizer may shard its state (over :attr:`MeshEngine.data`, clocked), local SGD runs the
step without gradient averaging (``train_batch(local=True)``; an averager works over
:attr:`replicas`). A step's :attr:`stats` count as communication the tensor group's
all-reduces, the pipeline's sends and receives (waiting included) and the data group's sync.
"""

from __future__ import annotations

import contextlib
import time
from types import SimpleNamespace

import numpy as np

from npddp.data import iterate_batches
from npddp.nn import CrossEntropyLoss
from npddp.parallel.engine import Engine
from npddp.parallel.hooks import HookState
from npddp.parallel.model import whole
from npddp.parallel.model.clock import ClockedGroup
from npddp.parallel.model.convert import tensor_parallel
from npddp.parallel.model.groups import mesh_groups
from npddp.parallel.model.mesh import Mesh
from npddp.parallel.model.pipeline import Pipeline
from npddp.parallel.model.stages import PipelineStage
from npddp.parallel.model.tensor import shard_indices
from npddp.parallel.wrapper import StepStats
from npddp.util import tracing


def raw_world(comm):
    """The mpi4py communicator or Transport a Communicator runs on (what the mesh is split from)."""
    transport = getattr(comm, "transport", None)
    return transport if transport is not None else comm.comm


def process_names(mesh: Mesh) -> dict:
    """``{"R": "rank R: dp D, pp P, tp T"}`` for every rank of ``mesh`` (the trace's process names)."""
    coords = {r: mesh.coords(r) for r in range(mesh.world_size)}
    return {str(r): f"rank {r}: dp {c.dp}, pp {c.pp}, tp {c.tp}" for r, c in coords.items()}


class MeshEngine(Engine):
    """A split model's training step, validation and checkpoint views (see the module docstring).

    ``model``: the full model, built alike on every rank, and ``dropouts`` its Dropout layers;
    ``tp``, ``pp``: the mesh (the data replicas are the rest of the world); ``backend``,
    ``timeout``: what the groups are created with; ``micro_batches``, ``schedule``: the
    pipeline's; ``sync``, ``bucket_cap_mb``: DDP's over the data group, and ``comm_hook(group)
    -> (state, hook)`` its hook; ``eval_batch``: rows per validation forward pass; ``tracer``:
    None for ``NPDDP_TRACE``'s; ``sequence_parallel``: a GPT's LayerNorm regions split along the
    sequence over the tensor group (:mod:`npddp.parallel.model.sequence`); ``algorithms``: the groups'
    all-gather/reduce-scatter choice (``create``'s).
    """

    splits_model = True

    def __init__(self, comm, model, dropouts, *, tp: int, pp: int, backend: str, timeout: float,
                 micro_batches: int, schedule: str, sync: str, bucket_cap_mb: float, comm_hook,
                 eval_batch: int, tracer=None, sequence_parallel: bool = False, algorithms: dict | None = None):
        self.comm, self.mesh = comm, Mesh(comm.size, tp=tp, pp=pp)
        self.groups = mesh_groups(self.mesh, raw_world(comm), backend, timeout=timeout, algorithms=algorithms)
        self.here = self.mesh.coords(comm.rank)
        self.tracer = tracing.from_env(comm) if tracer is None else tracer
        self.tracer.describe(process_names=process_names(self.mesh))
        #: the communicator the data replicas share (local SGD averages over it); clocked groups for the stats
        self.replicas = self.groups.data
        self.clocks = [ClockedGroup(self.groups.tensor), ClockedGroup(self.groups.pipeline),
                       ClockedGroup(self.groups.data)]
        full = [(n, p.data.shape, p.data.dtype) for n, p in model.named_parameters()]
        if tp > 1:
            model = tensor_parallel(model, self.clocks[0], tracer=self.tracer, sequence=sequence_parallel)
        shards = shard_indices(model)
        self.stage = PipelineStage(model, pp, self.here.pp)
        self.micro, self.eval_batch = micro_batches, eval_batch
        self.pipeline = Pipeline(self.stage, self.clocks[1], CrossEntropyLoss(), self.micro,
                                 schedule, data=self.groups.data if self.mesh.dp > 1 else None,
                                 tracer=self.tracer, sync=sync, bucket_cap_mb=bucket_cap_mb)
        if self.pipeline.ddp is not None:
            self.pipeline.ddp.register_comm_hook(*comm_hook(self.groups.data))
        names = self.stage.original_names()
        self.local = [(names[n], p) for n, p in self.stage.named_parameters()]
        tied = "" if self.stage.tied is None or not self.pipeline.last or pp == 1 else \
            next(n for n, p in self.local if p is self.stage.tied)
        first_copy = self.here.dp == 0
        self.pieces = whole.Pieces(full, self.local, shards, lambda name: first_copy and name != tied and (
            self.here.tp == 0 or name in shards))
        mine = {id(m) for _, m in self.stage.named_modules()}
        self.dropouts = list(dropouts)
        self.owned = [first_copy and self.here.tp == 0 and id(d) in mine for d in self.dropouts]
        ddp = self.pipeline.ddp
        self.stats = StepStats()
        self.buckets = ddp.buckets if ddp is not None else []
        self.comm_hook_state, self.steps = None, 0
        #: this rank's losses and validation counts are the ones added up (last stage, first tensor slice)
        self.reports = self.pipeline.last and self.here.tp == 0

    @property
    def data(self) -> ClockedGroup:
        """The data group, clocked: a ZeRO-1 optimizer's exchanges over it count as communication."""
        return self.clocks[2]

    def unkept_state(self, local_sgd: bool, comm_hook: str) -> str:
        """What this run's whole-model checkpoints leave out ("" for nothing), for the resume line."""
        parts = []
        if local_sgd and self.mesh.dp > 1:
            parts.append("each data replica's own parameters and optimizer state (local SGD: it holds replica 0's)")
        if self.pipeline.ddp is not None and isinstance(self.pipeline.ddp.comm_hook_state, HookState):
            parts.append(f"the --comm-hook {comm_hook} state (error feedback)")
        return " or ".join(parts)

    def whole_count(self) -> int:
        """Parameters of the whole model."""
        return sum(int(np.prod(shape)) for _, shape, _ in self.pieces.full)

    # --- the engine contract ---------------------------------------------------------------
    def parameters(self):
        """This rank's parameters."""
        return [p for _, p in self.local]

    def named_parameters(self):
        """This rank's parameters, each by its name in the full model."""
        return list(self.local)

    def state_dict(self) -> dict:
        """This rank's parameters (its shards) by their names in the full model (copies)."""
        return {name: p.data.copy() for name, p in self.local}

    def load_state_dict(self, state: dict, strict: bool = True) -> tuple[list[str], list[str]]:
        """Copy ``state`` (name -> this rank's shard) into the parameters; (missing names, unexpected names)."""
        mine = dict(self.local)
        missing, unexpected = sorted(set(mine) - set(state)), sorted(set(state) - set(mine))
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing {missing[:4]}, unexpected {unexpected[:4]}")
        for name, values in state.items():
            if name in mine:
                np.copyto(mine[name].data, np.asarray(values).reshape(mine[name].data.shape))
        return missing, unexpected

    def zero_grad(self) -> None:
        self.pipeline.zero_grad()

    def step(self, optimizer) -> None:
        """The optimizer step; ZeRO-1's exchange of updated parameters counts as communication."""
        shared = self.clocks[2]
        shared.reset()
        t0 = time.perf_counter()
        self.pipeline.step(optimizer)
        self.stats.optimizer_s = time.perf_counter() - t0 - shared.seconds
        self.stats.comm_exposed_s += shared.seconds
        self.stats.comm_calls += shared.calls
        self.stats.comm_bytes += shared.nbytes
        self.steps += 1

    def full_parameters(self):
        """Nothing to gather around a step: checkpoints assemble the whole model themselves."""
        return contextlib.nullcontext()

    def reduce_metrics(self, sums) -> np.ndarray:
        """Sums over every rank of the world (only reporting ranks add non-zero values)."""
        return self.comm.allreduce(np.array(sums, dtype=np.float64))

    # --- steps ---------------------------------------------------------------------------
    def train_batch(self, xb: np.ndarray, yb: np.ndarray, loss_fn, local: bool = False):
        """One step's forward, ``loss_fn`` and backward on this replica's rows; the mean loss on the last stage,
        else None.

        A short last batch of an epoch runs as at most one micro-batch per row. ``local``: the
        gradients are not averaged over the data replicas (local SGD between averagings).
        """
        rows = len(yb)
        self.pipeline.micro_batches = min(self.micro, rows)
        self.pipeline.loss = loss_fn
        ddp = self.pipeline.ddp
        for clock in self.clocks:
            clock.reset()
        t0 = time.perf_counter()
        with ddp.no_sync() if local and ddp is not None else contextlib.nullcontext():
            loss = self.pipeline.train_step(xb, yb, first_row=self.here.dp, global_rows=self.mesh.dp * rows,
                                            row_stride=self.mesh.dp)   # the sampler's shard: every dp-th row
        self.stats = self._step_stats(time.perf_counter() - t0)
        return loss

    def _step_stats(self, elapsed: float) -> StepStats:
        """The step's StepStats: forward and backward interleave, so all of it is ``backward_s``; comm inside it
        (tensor all-reduces, pipeline sends and receives, the data group's gradient sync) is ``comm_issue_s``."""
        data = self.pipeline.ddp.stats if self.pipeline.ddp is not None else StepStats()
        tensor, pipe = self.clocks[0], self.clocks[1]
        return StepStats(backward_s=elapsed,
                         comm_issue_s=tensor.seconds + pipe.seconds + data.comm_issue_s + data.comm_exposed_s,
                         comm_calls=tensor.calls + pipe.calls + data.comm_calls,
                         comm_bytes=tensor.nbytes + pipe.nbytes + data.comm_bytes)

    def evaluate(self, X: np.ndarray, y: np.ndarray, loss_fn) -> np.ndarray:
        """(loss sum, correct, rows) over all ranks, through the pipeline: replica r evaluates rows r::replicas
        in passes of ``eval_batch`` rows, and only reporting ranks add theirs (collective)."""
        sums = np.zeros(3)
        idx = np.arange(self.here.dp, len(X), self.mesh.dp)
        self.stage.eval()
        for xb, yb in iterate_batches(X, y, idx, self.eval_batch):
            logits = self.pipeline.predict(xb)
            if self.reports:
                sums += (loss_fn.forward(logits, yb) * len(yb), loss_fn.correct(logits, yb) / yb[0].size, len(yb))
        self.stage.train()
        return self.reduce_metrics(sums)

    # --- checkpoints ---------------------------------------------------------------------
    def whole_state(self, optimizer):
        """(full named parameters, full optimizer state, dropout streams) for ``state.collect`` (collective)."""
        return (whole.whole_parameters(self.comm, self.pieces),
                whole.WholeOptimizerState(self.comm, self.pieces, optimizer, gather=True),
                whole.whole_dropout_states(self.comm, self.dropouts, self.owned))

    def resume_targets(self, optimizer):
        """(full-shaped parameters, optimizer template) for ``state.restore``; :meth:`slice_resumed` after it."""
        named = [(n, SimpleNamespace(data=np.zeros(shape, dtype))) for n, shape, dtype in self.pieces.full]
        return named, whole.WholeOptimizerState(self.comm, self.pieces, optimizer, gather=False)

    def slice_resumed(self, named) -> None:
        """Copy the restored full parameters into this rank's shards (and the tied copy)."""
        self.pieces.slice_into({n: h.data for n, h in named})

    def restore_dropouts(self, ckpt) -> None:
        """One process's dropout streams (row 0 of the checkpoint's) on every rank, so every split agrees."""
        if not self.dropouts:
            return
        words = np.zeros((len(self.dropouts), 6), np.int64)
        have = np.zeros(1, np.int64)
        if self.comm.rank == 0 and ckpt.dropout_rng is not None:
            words[:] = ckpt.dropout_rng[0].view(np.int64)
            have[0] = 1
        self.comm.broadcast(have, root=0)
        self.comm.broadcast(words, root=0)
        if have[0]:
            for d, w in zip(self.dropouts, words):
                d.set_rng_state(w.view(np.uint64))
