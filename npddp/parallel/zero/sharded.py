"""ZeRO stages 2 and 3: :class:`ZeroDataParallel`, gradients (and, at stage 3, parameters) sharded over ranks.

Parameters are cut into :class:`~npddp.parallel.zero.flat.FlatGroup` s like DDP's buckets
(reverse parameter order, ``bucket_cap_mb``, one dtype each). During backward a group's
gradients are reduce-scattered the moment its last gradient is final (the layer hook DDP's
``overlap`` sync uses), so each rank ends backward holding only the average of its own shard.
The optimizer (:class:`ShardedOptimizer`) steps the shards, elementwise exactly as it would
step whole parameters, so the result equals DDP's.

* Stage 2: every rank keeps all parameter values; after the step each group's shards are
  all-gathered in place (all groups in flight at once, waited for before ``step`` returns).
  Over more than one rank the full gradients exist only while needed: a backward pre-hook on
  every module holding parameters gives its groups gradient buffers (from a small pool), and a
  group's buffer is freed as soon as its reduce-scatter completes (polled between layers), so
  between steps a rank holds its gradient shards only.
* Stage 3: a rank keeps only its shards. Every module that holds parameters gets call hooks
  (:meth:`npddp.nn.Module.register_forward_pre_hook` and its kin) around its ``forward`` and
  ``backward``, registered before the tracer's so a traced layer's time leaves the gathers
  out: before it runs, the groups of its parameters are gathered, and the gather of the next
  group the pass needs (forward: the next in definition order, backward: the one before)
  starts, so it arrives while the current group's modules compute (FSDP's forward and
  backward prefetch); after the last
  module that uses a group (in definition order) has run forward, or the first has run
  backward, the group is freed again. Tied weights keep their group alive between their uses.
  Full gradients exist only from a group's first backward until its reduce-scatter completes
  (polled between layers), so a rank holds its shards plus what is in flight.

The object offers what the training loop uses of DDP (``forward``, ``backward``, ``step``,
``zero_grad``, ``no_sync``, ``reduce_metrics``, ``stats``, ``tracer``, ``buckets``), so it
stands in for it.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np

from npddp.nn.module import Module
from npddp.nn.parameter import Parameter
from npddp.optim import Wrapping
from npddp.parallel.buckets import cut_buckets
from npddp.parallel.ddp import BUCKET_CAP_MB
from npddp.parallel.wrapper import DataParallelModule, StepStats
from npddp.parallel.zero.flat import BufferPool, FlatGroup
from npddp.util import tracing
from npddp.util.shown import shown

#: The ZeRO stages :class:`ZeroDataParallel` runs (stage 1 is :class:`ZeroRedundancyOptimizer` over DDP).
STAGES = (2, 3)


class ZeroDataParallel(DataParallelModule):
    """Data parallelism with sharded gradients and optimizer state (stage 2) and parameters (stage 3).

    ``init``: the :class:`~npddp.parallel.zero.construct.ShardedInit` the model was built in (no
    rank then holds the whole model, and rank 0's values are not broadcast: every rank built the
    same values); None: a model built whole on every rank, rank 0's values broadcast.
    """

    sync = "overlap"
    comm_hook_state = None   # no comm hook: buckets are reduce-scattered, not all-reduced

    def __init__(self, model: Module, comm, stage: int = 2, bucket_cap_mb: float = BUCKET_CAP_MB, tracer=None,
                 init=None):
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {STAGES} (stage 1 is ZeroRedundancyOptimizer over DDP), "
                             f"got {shown(stage)}")
        if not (isinstance(bucket_cap_mb, (int, float)) and bucket_cap_mb > 0):
            raise ValueError(f"bucket_cap_mb must be a positive number, got {shown(bucket_cap_mb)}")
        self.module, self.comm, self.stage = model, comm, stage
        self.bucket_cap_mb = float(bucket_cap_mb)
        self.stats = StepStats()
        self.tracer = tracing.from_env(comm) if tracer is None else tracer
        self.steps = 0
        self._sync_enabled = True
        self._params = model.parameters()
        self._check_same_model()
        if init is None:
            for p in self._params:
                comm.broadcast(p.data, root=0)
        elif init.comm.size != comm.size or init.comm.rank != comm.rank:
            raise ValueError(f"init was built over {init.comm.size} ranks (this is rank {init.comm.rank}), the engine's "
                             f"communicator has {comm.size} (rank {comm.rank}); pass the same communicator to both")
        groups = cut_buckets(self._params, self.bucket_cap_mb * 2**20)
        pool = BufferPool()   # a couple of freed buffers reused by the next gathers and backwards
        source = None if init is None else init.full
        self.buckets = [FlatGroup(i, ps, comm, sharded_values=stage == 3, pool=pool, source=source)
                        for i, ps in enumerate(groups)]
        self._layer_buckets = self._map_leaf_layers(model)
        self._in_backward = False
        model.register_grad_hook(self._on_layer_done)
        self._owners: list[tuple[Module, list[FlatGroup]]] = []
        self._gather_hooks: list = []   # the HookHandles of stage 3's schedule
        if stage == 3:
            self._schedule_gathers(model)
        elif comm.size > 1:
            self._schedule_grads(model)
        model.trace_layers(self.tracer, tracing.COMPUTE)

    # --- stage 3: gather before use, free after ------------------------------------------------
    def _schedule_gathers(self, model: Module) -> None:
        """Hook forward/backward of every module holding parameters with the gather/free schedule."""
        self._owners += self._holders(model)
        first, last = {}, {}
        for i, (_, needs) in enumerate(self._owners):
            for g in needs:
                first.setdefault(g.index, i)
                last[g.index] = i
        for i, (module, needs) in enumerate(self._owners):
            after_fwd = [g for g in needs if last[g.index] == i]
            after_bwd = [g for g in needs if first[g.index] == i]
            ahead, behind = self._next_groups(i, +1), self._next_groups(i, -1)
            self._gather_hooks += [module.register_forward_pre_hook(_gathering(needs, ahead, grads=False)),
                                   module.register_forward_hook(_releasing(after_fwd)),
                                   module.register_backward_pre_hook(_gathering(needs, behind, grads=True)),
                                   module.register_backward_hook(_releasing(after_bwd))]

    def _next_groups(self, i: int, step: int) -> list[FlatGroup]:
        """The groups the pass (forward: ``step`` +1, backward: -1) needs next after module ``i``'s own: those of the
        first module beyond ``i`` that uses a group ``i`` does not (what to prefetch while ``i``'s groups compute)."""
        mine = {g.index for g in self._owners[i][1]}
        j = i + step
        while 0 <= j < len(self._owners):
            new = [g for g in self._owners[j][1] if g.index not in mine]
            if new:
                return new
            j += step
        return []

    def _schedule_grads(self, model: Module) -> None:
        """Stage 2: hook the backward of every module holding parameters to give its groups full gradients."""
        for module, needs in self._holders(model):
            self._owners.append((module, needs))
            self._gather_hooks.append(module.register_backward_pre_hook(_granting(needs)))

    def _holders(self, model: Module) -> list:
        """(module, the groups its own parameters lie in) for every module holding parameters, in module order."""
        group_of = {id(p): g for g in self.buckets for p in g.params}
        out = []
        for _, module in model.named_modules():
            held = [v for v in vars(module).values() if isinstance(v, Parameter)]
            needs = list({id(group_of[id(p)]): group_of[id(p)] for p in held}.values())
            if needs:
                out.append((module, needs))
        return out

    @contextlib.contextmanager
    def full_parameters(self):
        """Within this context every parameter holds its full value (stage 3 gathers them; collective)."""
        if self.stage != 3:
            yield
            return
        for g in self.buckets:
            g.start_gather()
        for g in self.buckets:
            g.finish_gather()
        try:
            yield
        finally:
            for g in self.buckets:   # values written inside (a restored checkpoint) become the shards
                g.keep_values()
                g.release()

    # --- forward / backward --------------------------------------------------------------------
    def backward(self, dout: np.ndarray) -> np.ndarray:
        """Backward through the model; every rank ends with the rank-averaged gradient of its shards."""
        reducing = self._sync_enabled
        self._in_backward = reducing
        t0 = time.perf_counter()
        try:
            dx = self.module.backward(dout)
        finally:
            self._in_backward = False
        t1 = time.perf_counter()
        self.stats.backward_s = t1 - t0
        if reducing:
            for g in self.buckets:
                if g.work is None and not g.reduced:
                    self._start(g)
            for g in self.buckets:
                if g.work is not None:
                    g.finish_reduce()
            self.stats.comm_exposed_s = time.perf_counter() - t1
        for g in self.buckets:
            g.pending, g.reduced = g.reports, False
        return dx

    def _polled(self, group: FlatGroup) -> None:
        """A group's reduction found finished during backward: its full gradients are freed now, not at the end."""
        group.finish_reduce()

    def _start(self, group: FlatGroup) -> None:
        self.stats.comm_calls += 1
        self.stats.comm_bytes += group.padded * group.dtype.itemsize
        group.start_reduce()

    # --- optimizer step ------------------------------------------------------------------------
    def step(self, optimizer) -> None:
        """Step the shards; stage 2 then all-gathers every group's values, stage 3 drops stale ones."""
        self._check_synced()      # the model's own backward reduced nothing
        t0 = time.perf_counter()
        optimizer.step()
        self.steps += 1
        for g in self.buckets:
            if self.stage == 2:
                g.start_gather()
            else:
                g.release()
        for g in self.buckets:
            g.finish_gather()
        self.stats.optimizer_s = time.perf_counter() - t0

    def shard_parameters(self) -> list:
        """This rank's shard of every group, as Parameters for the optimizer (one per group)."""
        return [g.shard for g in self.buckets]

    def zero_grad(self) -> None:
        """Zero every gradient: the full local ones lazily (backward overwrites them, ``_start`` settles the rest), the shards."""
        self._unsynced = False
        for g in self.buckets:
            for p in g.params:
                p.zero_grad()
            g.shard.grad[...] = 0

    def bytes_per_rank(self) -> dict:
        """Bytes this rank keeps between steps: parameter values and gradients (the optimizer's: its own)."""
        full = sum(g.padded * g.dtype.itemsize for g in self.buckets)
        shard = sum(g.shard_size * g.dtype.itemsize for g in self.buckets)
        return {"params": full if self.stage == 2 else shard, "grads": shard}


class ShardedOptimizer(Wrapping):
    """``optimizer_class`` over the shards of a :class:`ZeroDataParallel`; checkpoints in the whole-model layout.

    ``consolidate_state_dict(to)`` (collective) then ``state_dict()`` on rank ``to`` give exactly
    what ``optimizer_class`` over all parameters would; ``load_state_dict`` takes that on every rank.
    """

    def __init__(self, engine: ZeroDataParallel, optimizer_class, **defaults):
        self.engine, self.comm = engine, engine.comm
        self.optim = optimizer_class(engine.shard_parameters(), **defaults)
        self._consolidated: dict | None = None
        self._consolidated_to: int | None = None

    def step(self) -> None:
        """Step this rank's shards."""
        self.optim.step()
        self._consolidated = None

    def zero_grad(self) -> None:
        """Zero every gradient."""
        self.engine.zero_grad()

    def local_state_bytes(self) -> int:
        """Bytes of optimizer state held by this rank."""
        return sum(a.nbytes for arrays in self.optim.state.values() for a in arrays)

    def consolidate_state_dict(self, to: int = 0) -> None:
        """Collective: gather every shard's state on rank ``to`` in the whole-model layout."""
        from npddp.comm.checks import check_rank
        to = check_rank(to, self.comm.size, "to")
        local = self.optim.state_dict()
        full = {k: v for k, v in local.items() if not _is_buffer(k, self.optim.buffers)}
        index = {id(p): i for i, p in enumerate(self.engine.parameters())}
        for b in self.optim.buffers:
            for g, arr in zip(self.engine.buckets, self.optim.state[b]):
                stacked = self.comm.gather(arr, root=to)            # (size, shard_size) on ``to``
                if stacked is not None:
                    for p, piece in zip(g.params, g.state_pieces(stacked.reshape(-1))):
                        full[f"{b}.{index[id(p)]}"] = piece.copy()
        self._consolidated = full if self.comm.rank == to else None
        self._consolidated_to = to

    def state_dict(self) -> dict:
        """The consolidated state (rank ``to`` only); RuntimeError when not consolidated here."""
        if self._consolidated is None:
            raise RuntimeError("ShardedOptimizer.state_dict: the optimizer state has not been consolidated on this "
                               f"rank (rank {self.comm.rank}); call consolidate_state_dict(to=RANK) on every rank "
                               "after the last step, then state_dict() on rank RANK")
        return dict(self._consolidated)

    def template_state_dict(self) -> dict:
        """The keys, shapes and dtypes of :meth:`state_dict` (values zero), on any rank, without communication."""
        local = self.optim.state_dict()
        full = {k: v for k, v in local.items() if not _is_buffer(k, self.optim.buffers)}
        for b in self.optim.buffers:
            for i, p in enumerate(self.engine.parameters()):
                full[f"{b}.{i}"] = np.zeros(p.data.shape, dtype=p.data.dtype)
        return full

    def load_state_dict(self, d: dict) -> None:
        """Load a whole-model state dict (every rank passes the same): keep this rank's shards."""
        buffers = self.optim.buffers
        params = self.engine.parameters()
        expected = {f"{b}.{i}" for b in buffers for i in range(len(params))}
        got = {k for k in d if _is_buffer(k, buffers)}
        if got != expected:
            raise ValueError(f"ShardedOptimizer.load_state_dict: buffer keys do not match {len(params)} parameters; "
                             f"missing {sorted(expected - got)[:4]}, unexpected {sorted(got - expected)[:4]}")
        index = {id(p): i for i, p in enumerate(params)}
        local = {k: v for k, v in d.items() if not _is_buffer(k, buffers)}
        rank = self.comm.rank
        for b in buffers:
            for j, g in enumerate(self.engine.buckets):
                flat = np.zeros(g.padded, dtype=g.dtype)
                for p, piece in zip(g.params, g.state_pieces(flat)):
                    piece[...] = np.asarray(d[f"{b}.{index[id(p)]}"]).reshape(piece.shape)
                local[f"{b}.{j}"] = flat[rank * g.shard_size:(rank + 1) * g.shard_size]
        self.optim.load_state_dict(local)
        self._consolidated = None


def _gathering(needs: list[FlatGroup], prefetch: list[FlatGroup], grads: bool):
    """A pre-hook gathering ``needs`` (``grads``: and giving them gradients), the neighbour's ``prefetch`` started."""
    def gather(module, args) -> None:
        for g in needs:
            g.start_gather()
        for g in prefetch:
            g.start_gather()
        for g in needs:
            g.finish_gather()
        if grads:
            for g in needs:
                g.ensure_grads()
    return gather


def _granting(needs: list[FlatGroup]):
    """A backward pre-hook giving the groups ``needs`` full gradients (stage 2; kept while they accumulate)."""
    def grant(module, args) -> None:
        for g in needs:
            g.ensure_grads()
    return grant


def _releasing(free: list[FlatGroup]):
    """A post-hook releasing the groups ``free`` (their last use in this pass is over)."""
    def release(module, args, out) -> None:
        for g in free:
            g.release()
    return release


def _is_buffer(key: str, buffers) -> bool:
    """True for a per-parameter state key such as ``exp_avg.3``."""
    head, _, tail = key.rpartition(".")
    return head in buffers and tail.isdigit()
