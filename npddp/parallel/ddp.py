"""DistributedDataParallel: keep replicas of a model identical by averaging gradients.

Written against the :class:`npddp.comm.Communicator` protocol only, so one argument switches
a training run between MPI's own collectives and the hand-written ones.

Every parameter's ``.grad`` becomes a view into a flat bucket buffer (buckets are cut in
reverse parameter order, the order backward produces gradients), so a bucket is all-reduced
in place with no packing copy. The buckets of one dtype are stretches of one arena; when
the communicator offers ``empty(n, dtype)`` (the shared-memory backends) the arena comes from
it, so gradients are born in memory the other ranks of the node read directly. Sync strategies:

* ``per_param``: one blocking all-reduce per tensor after backward (the naive baseline);
* ``flat``: one buffer per dtype, one all-reduce after backward;
* ``bucketed``: buckets of ``bucket_cap_mb``, all-reduced one after another after backward;
* ``overlap``: a bucket's non-blocking all-reduce starts the moment its last gradient is
  final during backward; outstanding work is polled between layers and waited for at the end.

How a bucket becomes the averaged gradient is a comm hook (:mod:`npddp.parallel.hooks`):
``register_comm_hook(state, hook)``, PyTorch's API; the default all-reduces with ``op="avg"``
(the backend scales the sum by 1/N while each reduced block is in cache), so no separate pass over
a bucket remains. Compression (fp16, top-k, PowerSGD) is a hook; local SGD is an averager
called after the optimizer step (:mod:`npddp.parallel.averaging`); DDP itself holds neither.

Tracing (``tracer=``, or ``NPDDP_TRACE=FILE.json``: :mod:`npddp.util.tracing`): every layer's
forward and backward, each bucket's all-reduce from issue to the first moment it is seen
complete, the wait after backward and the optimizer step are recorded on a timeline.
"""

from __future__ import annotations

import math
import time
from collections import Counter

import numpy as np

from npddp.nn.module import Module
from npddp.nn.parameter import Parameter, settle_grads
from npddp.parallel.buckets import cut_buckets
from npddp.parallel.hooks import GradBucket, Handle, allreduce_hook
from npddp.parallel.wrapper import DataParallelModule, StepStats
from npddp.util import tracing
from npddp.util.shown import shown

#: Default bucket cap in MiB (PyTorch's ``bucket_cap_mb``); the CLI's ``--bucket-mb`` default too.
BUCKET_CAP_MB = 25.0

SYNCS = ("per_param", "flat", "bucketed", "overlap")


class _Bucket:
    """A flat gradient buffer and the parameters whose ``.grad`` are views into it."""

    __slots__ = ("index", "params", "buffer", "reports", "pending", "work", "done", "grad_bucket",
                 "trace_name", "trace_t0")

    def __init__(self, index: int, params: list[Parameter], buffer: np.ndarray, done):
        self.index = index
        self.params = params
        self.buffer = buffer  # (n,) this bucket's stretch of its dtype's gradient arena
        offset = 0
        for p in params:
            view = self.buffer[offset:offset + p.data.size].reshape(p.data.shape)
            view[...] = p.grad
            p.grad = view  # the one rebinding of .grad, before any backward of the wrapper
            offset += p.data.size
        self.reports = len(params)  # gradient-ready reports that complete the bucket (-1: never)
        self.pending = self.reports
        self.work = None      # the comm hook's handle while the bucket is being reduced, then ``done``
        self.done = done      # the completed work handle that marks the bucket reduced for this step
        self.grad_bucket = None  # what the comm hook sees of this bucket (set once buckets are cut)
        self.trace_name = 0   # the tracer's name of this bucket's all-reduce event
        self.trace_t0 = 0     # issue time of the all-reduce being traced (0: none)


def _arenas(groups: list[list[Parameter]], empty) -> list[np.ndarray]:
    """One flat buffer per bucket, cut from one arena per dtype (from the communicator's ``empty``)."""
    totals: Counter = Counter()
    for ps in groups:
        totals[ps[0].data.dtype] += sum(p.data.size for p in ps)
    arenas = {dt: empty(n, dt) for dt, n in totals.items()}
    used: Counter = Counter()
    buffers = []
    for ps in groups:
        dt, n = ps[0].data.dtype, sum(p.data.size for p in ps)
        buffers.append(arenas[dt][used[dt]:used[dt] + n])
        used[dt] += n
    return buffers


class DistributedDataParallel(DataParallelModule):
    """Wrap ``model`` so that ``backward`` leaves every rank with the rank-averaged gradient."""

    def __init__(self, model: Module, comm, sync: str = "overlap", bucket_cap_mb: float = BUCKET_CAP_MB,
                 tracer=None):
        if not isinstance(sync, str) or sync not in SYNCS:
            raise ValueError(f"unknown sync {shown(sync)}; valid: {', '.join(SYNCS)}")
        if not (isinstance(bucket_cap_mb, (int, float)) and bucket_cap_mb > 0):
            raise ValueError(f"bucket_cap_mb must be a positive number, got {shown(bucket_cap_mb)}")
        self.module = model
        self.comm = comm
        self.sync = sync
        self.bucket_cap_mb = float(bucket_cap_mb)
        self.comm_hook_state, self.comm_hook = comm, allreduce_hook
        self.stats = StepStats()
        self.tracer = tracing.from_env(comm) if tracer is None else tracer   # collective when tracing
        self.steps = 0
        self._sync_enabled = True

        named = model.named_parameters()
        seen: set[int] = set()
        self._params = [p for _, p in named if not (id(p) in seen or seen.add(id(p)))]
        self._check_same_model()
        for p in self._params:
            comm.broadcast(p.data, root=0)

        cap = {"per_param": 0.0, "flat": math.inf}.get(sync, self.bucket_cap_mb * 2**20)
        groups = cut_buckets(self._params, cap)
        buffers = _arenas(groups, comm.empty)
        from npddp.comm import DoneWork   # here, not at import: importing npddp.parallel loads no npddp.comm
        self.buckets = [_Bucket(i, ps, buf, DoneWork(buf)) for i, (ps, buf) in enumerate(zip(groups, buffers))]
        for b in self.buckets:
            b.grad_bucket = GradBucket(b.index, b.buffer, b.params, b.index == len(self.buckets) - 1)
        self._layer_buckets = self._map_leaf_layers(model)
        self._in_backward = False
        model.register_grad_hook(self._on_layer_done)
        self._trace_names = self._name_trace_events()

    def _name_trace_events(self) -> dict:
        """Name every traced event once (layers wrapped, buckets named); {what: name id}."""
        tracer, comm = self.tracer, self.comm
        self.module.trace_layers(tracer, tracing.COMPUTE)
        for b in self.buckets:
            nbytes = b.buffer.nbytes
            pick = getattr(comm, "algorithm_for", None)     # declared by the Communicator protocol, optional
            algorithm = comm.name if pick is None else pick(nbytes, b.buffer.dtype)
            b.trace_name = tracer.name(f"all-reduce bucket {b.index}", bucket=b.index, bytes=nbytes,
                                       params=len(b.params), dtype=str(b.buffer.dtype), backend=comm.name,
                                       algorithm=algorithm, sync=self.sync)
        return {"wait": tracer.name("all-reduce wait"), "optimizer": tracer.name("optimizer step")}

    # --- forward / backward ---------------------------------------------------------
    def register_comm_hook(self, state, hook) -> None:
        """Reduce every bucket with ``hook(state, bucket) -> handle`` (see :mod:`npddp.parallel.hooks`).

        ``hook`` is called on every rank, bucket by bucket in the same order; ``handle.wait()``
        returns the bucket's averaged gradient. Call before the first backward.
        """
        if not callable(hook):
            raise TypeError(f"hook must be a function hook(state, bucket), got {type(hook).__name__}")
        self.comm_hook_state, self.comm_hook = state, hook

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """Backward through the model, then leave every ``.grad`` averaged over ranks."""
        reducing = self._reducing()
        self._in_backward = reducing and self.sync == "overlap"
        self._wrapped = True
        if self._sync_enabled:
            self._unsynced = False   # what a bypassing backward accumulated is averaged with this step's
        t0 = time.perf_counter()
        try:
            dx = self.module.backward(dout)
        finally:
            self._in_backward = self._wrapped = False
        t1 = time.perf_counter()
        self.stats.backward_s = t1 - t0
        if reducing:
            traced = self.tracer.clock()
            for bucket in self.buckets:  # buckets no layer reported (or all, when not overlapping)
                if bucket.work is None:
                    self._start(bucket)
            for bucket in self.buckets:
                self._finish(bucket)
            self.tracer.add(traced, self._trace_names["wait"], tracing.COMPUTE)
            self.stats.comm_exposed_s = time.perf_counter() - t1
        for bucket in self.buckets:  # reset per-step state
            bucket.pending = bucket.reports
            bucket.work = None
        return dx

    def _polled(self, bucket: _Bucket) -> None:
        """A bucket found finished while backward runs: its trace event ends here."""
        if bucket.trace_t0:
            self._traced_done(bucket)

    # --- per-bucket communication ---------------------------------------------------
    def _start(self, bucket: _Bucket) -> None:
        """Hand ``bucket`` to the comm hook (and, unless overlapping, finish it at once)."""
        stats = self.stats
        stats.comm_calls += 1
        settle_grads(bucket.params)   # a parameter no layer wrote since zero_grad sends zeros
        bucket.trace_t0 = self.tracer.clock()
        bucket.work = self.comm_hook(self.comm_hook_state, bucket.grad_bucket)
        stats.comm_bytes += bucket.work.nbytes if isinstance(bucket.work, Handle) else bucket.buffer.nbytes
        if self.sync != "overlap":
            self._finish(bucket)

    def _finish(self, bucket: _Bucket) -> None:
        """Wait for the hook's handle; its result is the averaged gradient (copied in if another array)."""
        if bucket.work is bucket.done:
            return
        result = bucket.work.wait()
        bucket.work = bucket.done
        if bucket.trace_t0:
            self._traced_done(bucket)
        if result is not bucket.buffer:
            np.copyto(bucket.buffer, result, casting="same_kind")

    def _traced_done(self, bucket: _Bucket) -> None:
        """Record ``bucket``'s all-reduce, issued at ``trace_t0``, as complete now."""
        self.tracer.add(bucket.trace_t0, bucket.trace_name, tracing.COMM)
        bucket.trace_t0 = 0

    # --- optimizer step and metrics --------------------------------------------------
    def step(self, optimizer) -> None:
        """Run ``optimizer.step()`` and count the step (UnsyncedGradientsError if the gradients were not averaged)."""
        self._check_synced()
        t0 = time.perf_counter()
        traced = self.tracer.clock()
        optimizer.step()
        self.tracer.add(traced, self._trace_names["optimizer"], tracing.OPTIMIZER)
        self.steps += 1
        self.stats.optimizer_s = time.perf_counter() - t0

    # --- pass-throughs ----------------------------------------------------------------
    def zero_grad(self) -> None:
        """Zero every gradient, lazily: backward overwrites them, and a bucket settles the rest before it is sent."""
        self._unsynced = False
        for p in self._params:
            p.zero_grad()

