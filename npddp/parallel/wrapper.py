"""What every data-parallel wrapper of a model shares (DDP and the ZeRO stages).

The model check at construction, which bucket each leaf layer's parameters fall in, forward,
``no_sync``, metric sums, the pass-throughs to the wrapped model, and the engine contract's
``train_batch`` and ``evaluate`` (:class:`~npddp.parallel.engine.Engine`). :class:`DataParallelModule`
is an abstract base: a subclass sets the attributes it declares (each annotated there, one line
each, the buckets following :class:`Bucket`) and defines its abstract methods: ``backward``,
``step``, ``zero_grad``, and ``_start``/``_polled``, which the grad hook calls per bucket.

The backward check: the grad hook also hears a backward of the wrapped model that did not go
through the wrapper's ``backward`` (``ddp.module.backward(dloss)``), whose gradients no rank
averages. Outside ``no_sync`` that marks the wrapper, and its next ``step``, ``forward`` or
``reduce_metrics`` raises :class:`UnsyncedGradientsError` (a flag test; nothing is read of the
gradients). Each rank raises on its own, before its next collective; when only some ranks
made the mistake, the others wait in the all-reduce they started until the exception guard
(:mod:`npddp.util.guard`) ends the job, or their deadline passes.
"""

from __future__ import annotations

import abc
import contextlib
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from npddp.nn.module import Module
from npddp.nn.parameter import Parameter
from npddp.parallel.engine import Engine
from npddp.parallel.evaluation import agreed_batch, evaluate_rows

__all__ = ["Bucket", "DataParallelModule", "StepStats", "UnsyncedGradientsError"]


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


def _signature(model: Module) -> bytes:
    """One line per parameter: name, shape and dtype."""
    lines = [f"{name} {tuple(p.data.shape)} {p.data.dtype}" for name, p in model.named_parameters()]
    return "\n".join(lines).encode()


class UnsyncedGradientsError(RuntimeError):
    """The wrapped model's own backward ran where the wrapper's should have: gradients not averaged."""


class Bucket(Protocol):
    """What the grad hook needs of a subclass's bucket (DDP's gradient bucket, ZeRO's flat group)."""

    index: int            # position in ``buckets``
    params: list          # the parameters whose gradients it carries
    reports: int          # gradient-ready reports that complete it in one backward (-1: never)
    pending: int          # reports still missing in this backward
    work: Any             # the communication in flight (``test()``, ``wait()``), None when none


class DataParallelModule(Engine):
    """The parts of a data-parallel wrapper that do not depend on how gradients travel."""

    reports = True               # every rank's loss and validation rows count
    splits_model = False         # every rank holds the whole model (ZeRO-3: gathered by full_parameters)

    # --- what a subclass sets in its constructor
    module: Module               # the wrapped model
    comm: Any                    # the Communicator gradients travel over
    sync: str                    # the gradient sync strategy (one of ddp.SYNCS)
    stats: StepStats             # timings and traffic of the last step
    tracer: Any                  # the timeline tracer (tracing.NULL when untraced)
    buckets: list[Bucket]        # the units communicated, in the order backward fills them
    comm_hook_state: Any         # the comm hook's state a checkpoint saves (None: no comm hook)
    _params: list[Parameter]     # the model's parameters, each once
    _layer_buckets: dict         # id(leaf layer) -> buckets of its parameters (from _map_leaf_layers)
    _sync_enabled: bool          # False inside no_sync
    _in_backward: bool           # True while the wrapper's backward runs and buckets start from the grad hook

    _eval_batch: int | None = None   # rows per validation forward pass, measured by the first evaluate
    _wrapped = False   # True while the wrapper's own backward runs (when _in_backward alone does not say so)
    _unsynced = False  # the model's backward ran outside the wrapper's, outside no_sync, since the last sync

    def _check_synced(self) -> None:
        """Raise UnsyncedGradientsError if a backward since the last averaging bypassed the wrapper."""
        if self._unsynced:
            self._unsynced = False
            raise UnsyncedGradientsError(
                f"{type(self).__name__}: the model's backward was called directly (e.g. ddp.module.backward(dloss)), "
                f"so this step's gradients were not averaged over the {self.comm.size} rank(s) and the replicas "
                "would drift apart; call ddp.backward(dloss) instead (to accumulate without averaging, "
                "do it inside `with ddp.no_sync():`)")

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

    def _on_layer_done(self, layer: Module) -> None:
        """Grad hook: count down the buckets of ``layer``'s parameters; start full ones (``_start``); poll the
        ones in flight (``_polled`` for each that has finished)."""
        if not self._in_backward:
            if not self._wrapped and self._sync_enabled:
                self._unsynced = True      # a backward of the model that bypassed the wrapper
            return
        t0 = time.perf_counter()
        for bucket in self._layer_buckets.get(id(layer), ()):
            bucket.pending -= 1
            if bucket.pending == 0:
                self._start(bucket)
        for bucket in self.buckets:
            if bucket.work is not None and bucket.work.test():
                self._polled(bucket)
        self.stats.comm_issue_s += time.perf_counter() - t0

    # --- what a subclass defines ------------------------------------------------------
    @abc.abstractmethod
    def _start(self, bucket) -> None:
        """Start communicating ``bucket`` (its gradients are final); sets ``bucket.work``."""

    @abc.abstractmethod
    def _polled(self, bucket) -> None:
        """``bucket``'s work was found complete between two layers of backward."""

    @abc.abstractmethod
    def backward(self, dout: np.ndarray) -> np.ndarray:
        """Backward through the model, leaving the gradients reduced over ranks; returns dL/d(input)."""

    # --- forward / backward ---------------------------------------------------------
    def forward(self, x: np.ndarray) -> np.ndarray:
        """Run the wrapped model's forward (UnsyncedGradientsError after a backward that bypassed the wrapper)."""
        self._check_synced()
        t0 = time.perf_counter()
        out = self.module.forward(x)
        self.stats = StepStats(forward_s=time.perf_counter() - t0)
        return out

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.forward(x)

    @property
    def replicas(self):
        """The communicator the data replicas share: every rank is one."""
        return self.comm

    def train_batch(self, x: np.ndarray, y: np.ndarray, loss_fn, local: bool = False):
        """Forward, ``loss_fn`` and backward of one batch; the loss. ``local``: inside :meth:`no_sync`."""
        loss = loss_fn.forward(self(x), y)
        with self.no_sync() if local else contextlib.nullcontext():
            self.backward(loss_fn.backward())
        return loss

    def evaluate(self, X: np.ndarray, y: np.ndarray, loss_fn) -> np.ndarray:
        """(loss sum, correct, rows) over all ranks; rank r evaluates rows r::size, forward only in eval mode.

        The rows per forward pass are measured on the first call (collective) and kept.
        """
        net = self.module.eval()
        if self._eval_batch is None:           # measured once, agreed over ranks
            self._eval_batch = agreed_batch(self.comm, net, X)
        sums = evaluate_rows(net, X, y, self.comm.rank, self.comm.size, self._eval_batch, self.reduce_metrics,
                             loss_fn)
        net.train()
        return sums

    @contextlib.contextmanager
    def no_sync(self):
        """Within this context backward only accumulates local gradients; the next synced backward reduces the sum."""
        previous, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = previous

    def _reducing(self) -> bool:
        return self._sync_enabled and self.comm.size > 1

    def reduce_metrics(self, sums) -> np.ndarray:
        """Sum metric totals (loss sums, correct counts, sample counts) over ranks, in place like every collective.

        An ndarray is updated and returned (summed in float64; any dtype or layout, the sums written
        back into it); a list or number gives a new float64 array. ValueError for a read-only array.
        """
        self._check_synced()
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

    def parameters(self) -> list[Parameter]:
        """The wrapped model's parameters (each once)."""
        return list(self._params)

    def named_parameters(self):
        """The wrapped model's named parameters."""
        return self.module.named_parameters()

    def state_dict(self) -> dict:
        """The wrapped model's parameters by name (copies), as ``module.state_dict()`` gives them (no ``module.``
        prefix, unlike PyTorch's DDP); collective under ZeRO-3, which gathers them first."""
        with self.full_parameters():
            return self.module.state_dict()

    def load_state_dict(self, state, strict: bool = True) -> tuple[list[str], list[str]]:
        """Copy ``state`` (name -> array) into the wrapped model, as ``module.load_state_dict`` does.

        Call it on every rank with the same state, as with PyTorch's DDP: nothing is broadcast,
        so ranks given different values would stay different. Collective under ZeRO-3 (the
        values written become each rank's shard). Returns (missing names, unexpected names).
        """
        with self.full_parameters():
            return self.module.load_state_dict(state, strict)

    def train(self, mode: bool = True):
        """Set training mode on the wrapped model."""
        self.module.train(mode)
        return self

    def eval(self):
        """Set evaluation mode on the wrapped model."""
        return self.train(False)

    def full_parameters(self):
        """A context within which every parameter holds its full value: always so here (ZeRO-3 gathers them)."""
        return contextlib.nullcontext()
