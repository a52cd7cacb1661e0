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

Gradients are summed by the backend and divided by the world size exactly once, here.

Tracing (``tracer=``, or ``NPDDP_TRACE=FILE.json``: :mod:`npddp.util.tracing`): every layer's
forward and backward, each bucket's all-reduce from issue to the first moment it is seen
complete, the wait after backward and the optimizer step are recorded on a timeline.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np

from npddp.nn.module import Module, Parameter
from npddp.util import tracing

#: Default bucket cap in MiB (PyTorch's ``bucket_cap_mb``); the CLI's ``--bucket-mb`` default too.
BUCKET_CAP_MB = 25.0

SYNCS = ("per_param", "flat", "bucketed", "overlap")
COMPRESSIONS = ("none", "fp16", "topk")


@dataclass
class StepStats:
    """Timings (seconds) and traffic of the last training step on this rank."""

    forward_s: float = 0.0
    backward_s: float = 0.0       # wall time of model.backward, hooks and issued comm included
    comm_issue_s: float = 0.0     # time inside communication calls made during backward
    comm_exposed_s: float = 0.0   # time spent communicating after backward returned
    optimizer_s: float = 0.0
    comm_calls: int = 0           # collective calls this step
    comm_bytes: int = 0           # bytes all-reduced this step (per rank)

    def as_dict(self) -> dict:
        """The fields as a plain dict."""
        return asdict(self)


class _Bucket:
    """A flat gradient buffer and the parameters whose ``.grad`` are views into it."""

    __slots__ = ("index", "params", "buffer", "reports", "pending", "work", "scratch", "residual",
                 "trace_name", "trace_t0")

    def __init__(self, index: int, params: list[Parameter], buffer: np.ndarray):
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
        self.work = None
        self.scratch = None   # fp16 copy for fp16 compression
        self.residual = None  # error feedback for top-k compression
        self.trace_name = 0   # the tracer's name of this bucket's all-reduce event
        self.trace_t0 = 0     # issue time of the all-reduce being traced (0: none)


def _cut_buckets(params: list[Parameter], cap_bytes: float) -> list[list[Parameter]]:
    """Group parameters in reverse order into buckets of at most ``cap_bytes`` (one dtype each)."""
    groups: list[list[Parameter]] = []
    current: list[Parameter] = []
    size = 0
    for p in reversed(params):
        if current and (size + p.data.nbytes > cap_bytes or p.data.dtype != current[0].data.dtype):
            groups.append(current)
            current, size = [], 0
        current.append(p)
        size += p.data.nbytes
    if current:
        groups.append(current)
    return groups


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


def _signature(model: Module) -> bytes:
    """One line per parameter: name, shape and dtype."""
    lines = [f"{name} {tuple(p.data.shape)} {p.data.dtype}" for name, p in model.named_parameters()]
    return "\n".join(lines).encode()


class DistributedDataParallel:
    """Wrap ``model`` so that ``backward`` leaves every rank with the rank-averaged gradient."""

    def __init__(self, model: Module, comm, sync: str = "overlap", bucket_cap_mb: float = BUCKET_CAP_MB,
                 compression: str = "none", topk_ratio: float = 0.01, local_sgd: int = 0, tracer=None):
        if sync not in SYNCS:
            raise ValueError(f"unknown sync {sync!r}; valid: {', '.join(SYNCS)}")
        if not (isinstance(bucket_cap_mb, (int, float)) and bucket_cap_mb > 0):
            raise ValueError(f"bucket_cap_mb must be a positive number, got {bucket_cap_mb!r}")
        if compression not in COMPRESSIONS:
            raise ValueError(f"unknown compression {compression!r}; valid: {', '.join(COMPRESSIONS)}")
        if not 0.0 < topk_ratio <= 1.0:
            raise ValueError(f"topk_ratio must be in (0, 1], got {topk_ratio!r}")
        if isinstance(local_sgd, bool) or not isinstance(local_sgd, int) or local_sgd < 0:
            raise ValueError(f"local_sgd must be an int >= 0 (0 = average gradients every step), got {local_sgd!r}")
        if local_sgd and compression != "none":
            raise ValueError("local_sgd averages parameters, so it cannot be combined with gradient compression")
        self.module = model
        self.comm = comm
        self.sync = sync
        self.bucket_cap_mb = float(bucket_cap_mb)
        self.compression = compression
        self.topk_ratio = float(topk_ratio)
        self.local_sgd = local_sgd
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
        groups = _cut_buckets(self._params, cap)
        buffers = _arenas(groups, comm.empty)
        self.buckets = [_Bucket(i, ps, buf) for i, (ps, buf) in enumerate(zip(groups, buffers))]
        self._layer_buckets = self._map_leaf_layers(model)
        self._in_backward = False
        model.register_grad_hook(self._on_layer_done)
        self._trace_names = self._name_trace_events()

    def _name_trace_events(self) -> dict:
        """Name every traced event once (layers wrapped, buckets named); {what: name id}."""
        tracer, comm = self.tracer, self.comm
        self.module.trace_layers(tracer, tracing.COMPUTE)
        for b in self.buckets:
            nbytes = b.buffer.size * (2 if self.compression == "fp16" else b.buffer.itemsize)
            algorithm = comm.algorithm_for(nbytes, b.buffer.dtype) if comm.name == "auto" else comm.name
            b.trace_name = tracer.name(f"all-reduce bucket {b.index}", bucket=b.index, bytes=nbytes,
                                       params=len(b.params), dtype=str(b.buffer.dtype), backend=comm.name,
                                       algorithm=algorithm, sync=self.sync, compression=self.compression)
        return {"wait": tracer.name("all-reduce wait"), "optimizer": tracer.name("optimizer step")}

    @property
    def steps(self) -> int:
        """Optimizer steps taken (restored on resume); setting it moves the tracer's window."""
        return self._steps

    @steps.setter
    def steps(self, value: int) -> None:
        self._steps = value
        self.tracer.at_step(value)

    # --- construction ---------------------------------------------------------------
    def _check_same_model(self) -> None:
        """Raise on every rank if any rank's parameter names, shapes or dtypes differ from rank 0's."""
        mine = np.frombuffer(_signature(self.module), dtype=np.uint8)
        length = np.array([mine.size], dtype=np.int64)
        longest = int(self.comm.allreduce(length.copy(), op="max")[0])
        padded = np.zeros(longest, dtype=np.uint8)
        padded[:mine.size] = mine
        lengths = self.comm.allgather(length)[:, 0]               # (size,)
        # uint8 is not a reduction dtype; ship the bytes as int32 for a portable allgather
        table = self.comm.allgather(padded.astype(np.int32))     # (size, longest)
        sigs = [bytes(table[r, :lengths[r]].astype(np.uint8)).decode().split("\n")
                for r in range(self.comm.size)]
        for r in range(1, self.comm.size):
            if sigs[r] == sigs[0]:
                continue
            for i in range(max(len(sigs[0]), len(sigs[r]))):
                a = sigs[0][i] if i < len(sigs[0]) else "<none>"
                b = sigs[r][i] if i < len(sigs[r]) else "<none>"
                if a != b:
                    raise ValueError(f"model mismatch: rank {r} differs from rank 0 at parameter #{i}: "
                                     f"rank 0 has '{a}', rank {r} has '{b}'")

    def _map_leaf_layers(self, model: Module) -> dict:
        """id(leaf layer) -> the bucket of each of its parameters; sets how many reports fill each bucket."""
        bucket_of = {id(p): b for b in self.buckets for p in b.params}
        leaves = [m for _, m in model.named_modules() if next(m.children(), None) is None]
        owned = [(m, m.parameters()) for m in leaves]
        reports = Counter(id(p) for _, params in owned for p in params)
        for b in self.buckets:  # a parameter shared by k leaves (tied weights) is final after k reports;
            counts = [reports[id(p)] for p in b.params]  # one that no leaf reports waits for the end
            b.reports = b.pending = sum(counts) if all(counts) else -1
        return {id(m): [bucket_of[id(p)] for p in params] for m, params in owned if params}

    # --- forward / backward ---------------------------------------------------------
    def forward(self, x: np.ndarray) -> np.ndarray:
        """Run the wrapped model's forward."""
        t0 = time.perf_counter()
        out = self.module.forward(x)
        self.stats = StepStats(forward_s=time.perf_counter() - t0)
        return out

    __call__ = forward

    @contextlib.contextmanager
    def no_sync(self):
        """Within this context backward only accumulates local gradients; the next synced backward reduces the sum."""
        previous, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = previous

    def _reducing(self) -> bool:
        return self._sync_enabled and not self.local_sgd and self.comm.size > 1

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """Backward through the model, then leave every ``.grad`` averaged over ranks."""
        reducing = self._reducing()
        self._in_backward = reducing and self.sync == "overlap"
        t0 = time.perf_counter()
        try:
            dx = self.module.backward(dout)
        finally:
            self._in_backward = False
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

    def _on_layer_done(self, layer: Module) -> None:
        """Grad hook: count down the buckets of ``layer``'s parameters; start full ones; poll."""
        if not self._in_backward:
            return
        t0 = time.perf_counter()
        for bucket in self._layer_buckets.get(id(layer), ()):
            bucket.pending -= 1
            if bucket.pending == 0:
                self._start(bucket)
        for bucket in self.buckets:
            if bucket.work is not None and bucket.work.test() and bucket.trace_t0:
                self._traced_done(bucket)
        self.stats.comm_issue_s += time.perf_counter() - t0

    # --- per-bucket communication ---------------------------------------------------
    def _start(self, bucket: _Bucket) -> None:
        """Begin reducing ``bucket`` (non-blocking when overlapping)."""
        stats = self.stats
        stats.comm_calls += 1
        bucket.trace_t0 = self.tracer.clock()
        if self.compression == "topk":
            bucket.work = _Done()
            self._reduce_topk(bucket)
            return
        target = bucket.buffer
        if self.compression == "fp16":
            if bucket.scratch is None:
                bucket.scratch = np.empty(bucket.buffer.size, dtype=np.float16)
            # pre-divide so the half-precision sum cannot overflow
            np.multiply(bucket.buffer, 1.0 / self.comm.size, out=bucket.scratch, casting="same_kind")
            target = bucket.scratch
        stats.comm_bytes += target.nbytes
        if self.sync == "overlap":
            bucket.work = self.comm.iallreduce(target)
        else:
            self.comm.allreduce(target)
            bucket.work = _Done()

    def _finish(self, bucket: _Bucket) -> None:
        """Wait for ``bucket``'s reduction and turn the sum into the average."""
        bucket.work.wait()
        if bucket.trace_t0:
            self._traced_done(bucket)
        if self.compression == "fp16":
            np.copyto(bucket.buffer, bucket.scratch, casting="same_kind")
        elif self.compression == "none":
            np.divide(bucket.buffer, self.comm.size, out=bucket.buffer, casting="same_kind")

    def _traced_done(self, bucket: _Bucket) -> None:
        """Record ``bucket``'s all-reduce, issued at ``trace_t0``, as complete now."""
        self.tracer.add(bucket.trace_t0, bucket.trace_name, tracing.COMM)
        bucket.trace_t0 = 0

    def _reduce_topk(self, bucket: _Bucket) -> None:
        """Top-k sparsification with error feedback: exchange the k largest entries of grad + residual."""
        buf = bucket.buffer
        if bucket.residual is None:
            bucket.residual = np.zeros_like(buf)
        acc = bucket.residual
        acc += buf                                                    # (n,) gradient plus carried error
        k = max(1, int(math.ceil(self.topk_ratio * buf.size)))
        idx = np.argpartition(np.abs(acc), buf.size - k)[buf.size - k:].astype(np.int64)  # (k,)
        idx.sort()
        values = acc[idx]                                            # (k,)
        acc[idx] = 0                                                 # what is sent leaves the residual
        all_idx = self.comm.allgather(idx)                           # (size, k)
        all_values = self.comm.allgather(values)                     # (size, k)
        self.stats.comm_calls += 1
        self.stats.comm_bytes += idx.nbytes + values.nbytes
        buf[...] = 0
        for r in range(self.comm.size):                              # fixed rank order: same bits everywhere
            np.add.at(buf, all_idx[r], all_values[r])
        np.divide(buf, self.comm.size, out=buf, casting="same_kind")

    # --- optimizer step, local SGD and metrics --------------------------------------
    def step(self, optimizer) -> None:
        """Run ``optimizer.step()``; with local SGD, average parameters every ``local_sgd`` steps."""
        t0 = time.perf_counter()
        traced = self.tracer.clock()
        optimizer.step()
        self.tracer.add(traced, self._trace_names["optimizer"], tracing.OPTIMIZER)
        self.steps += 1
        if self.local_sgd and self.comm.size > 1 and self.steps % self.local_sgd == 0:
            self.average_parameters()
        self.stats.optimizer_s = time.perf_counter() - t0

    def average_parameters(self) -> None:
        """Replace every parameter by its mean over ranks."""
        for p in self._params:
            self.comm.allreduce(p.data)
            np.divide(p.data, self.comm.size, out=p.data, casting="same_kind")
            self.stats.comm_calls += 1
            self.stats.comm_bytes += p.data.nbytes

    def reduce_metrics(self, sums) -> np.ndarray:
        """Sum metric totals (loss sums, correct counts, sample counts) over ranks, in place like every collective.

        An ndarray is updated and returned (summed in float64; any dtype or layout, the sums written
        back into it); a list or number gives a new float64 array. ValueError for a read-only array.
        """
        if not isinstance(sums, np.ndarray):
            return self.comm.allreduce(np.array(sums, dtype=np.float64))
        if not sums.flags.writeable:
            raise ValueError("reduce_metrics sums in place, but the array given is read-only; pass a writable "
                             "array (or a list, to get a new one)")
        if sums.dtype == np.float64 and sums.flags.c_contiguous:
            self.comm.allreduce(sums)
            return sums
        totals = np.array(sums, dtype=np.float64)             # a contiguous float64 copy, written back below
        self.comm.allreduce(totals)
        sums[...] = totals
        return sums

    # --- pass-throughs ----------------------------------------------------------------
    def zero_grad(self) -> None:
        """Zero every gradient bucket."""
        for bucket in self.buckets:
            bucket.buffer[...] = 0

    def parameters(self) -> list[Parameter]:
        """The wrapped model's parameters (each once)."""
        return list(self._params)

    def named_parameters(self):
        """The wrapped model's named parameters."""
        return self.module.named_parameters()

    def train(self, mode: bool = True):
        """Set training mode on the wrapped model."""
        self.module.train(mode)
        return self

    def eval(self):
        """Set evaluation mode on the wrapped model."""
        return self.train(False)


class _Done:
    """Work handle of an operation that already completed."""

    __slots__ = ()

    def wait(self):
        return None

    def test(self):
        return True
