"""The training loop of ``python -m npddp.train``: epochs of steps, validation, checks, checkpoints and metrics.

:class:`Trainer` holds one run's state; :mod:`npddp.train.cli.main` builds it from the flags and runs it.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time

import numpy as np

from npddp import checkpoint
from npddp.process.agree import agree, any_rank
from npddp.train.config import Config
from npddp.train.faults import parse_fault
from npddp.parallel.engine import Engine
from npddp.data import BatchLoader, DistributedSampler
from npddp.parallel.averaging import PeriodicModelAverager
from npddp.util import tracing
from npddp.process.job import EXIT_DIVERGED, EXIT_WRITE, JobError
from npddp.train.console.metrics import TOTALS, MetricsLog, StepRecorder, add_to_totals, epoch_row
from npddp.train.models import shape_rows
from npddp.nn import CrossEntropyLoss
from npddp.train.console.printer import Printer, epoch_line


class InjectedFault(RuntimeError):
    """The exception ``--inject-fault RANK:STEP`` raises."""


def _what(a: np.ndarray) -> str:
    """How an array flagged by :func:`_nonfinite` went wrong."""
    bad = a.size - int(np.count_nonzero(np.isfinite(a)))
    if bad:
        return f"holds {bad} NaN or infinite value{'s' * (bad > 1)}"
    return f"has grown beyond what {a.dtype} can square (largest magnitude {np.max(np.abs(a)):.3g})"


def _nonfinite(arrays) -> int | None:
    """Index of the first array whose squared norm is not finite (a NaN, an inf, or overflow), else None.

    One BLAS dot per array; callers silence NumPy's overflow warnings (``np.errstate``).
    """
    for i, a in enumerate(arrays):
        flat = a.ravel()
        if not math.isfinite(flat.dot(flat)):
            return i
    return None


class Trainer:
    """The training loop and what it writes: metrics rows, checkpoints, epoch lines.

    ``engine`` is any :class:`~npddp.parallel.engine.Engine` (DDP, a ZeRO stage, a split model), driven alike.
    """

    def __init__(self, cfg: Config, comm, out: Printer, ds, model, dropouts, engine: Engine, optimizer, attrs: dict):
        self.cfg, self.comm, self.out = cfg, comm, out
        self.model, self.dropouts, self.engine, self.optimizer = model, dropouts, engine, optimizer
        #: local SGD (--local-sgd K): parameters averaged (over the data replicas) every K steps, gradients never
        self.averager = PeriodicModelAverager(engine.replicas, cfg.local_sgd) if cfg.local_sgd else None
        self.X_val, self.y_val = shape_rows(cfg.model, ds.X_val), ds.y_val
        self.n_train, self.input_shape, self.num_classes = ds.n_train, tuple(ds.input_shape), ds.num_classes
        self.replicas = engine.replicas.size               # the data replicas read the batches
        sampler = DistributedSampler(ds.n_train, self.replicas, engine.replicas.rank, shuffle=True, seed=cfg.seed)
        self.loader = BatchLoader(shape_rows(cfg.model, ds.X_train), ds.y_train, sampler,
                                  batch_size=cfg.batch_size // self.replicas, reuse_buffers=True)
        self.loss_fn = CrossEntropyLoss()
        self.recorder = StepRecorder()
        self.log = MetricsLog() if comm.rank == 0 and cfg.metrics else None
        self.attrs = attrs                                  # rank 0: environment and run description
        self.totals = np.zeros(len(TOTALS))                 # running sums of the epoch in progress
        self.epochs_done, self.batches_done, self.step = 0, 0, 0
        self.last_row: dict | None = None
        self.saved_at = -1
        self.fault = parse_fault(cfg.inject_fault, comm.size) if cfg.inject_fault else None
        self.names = [name for name, _ in engine.named_parameters()]
        self.watched = engine.parameters()[-2:]             # the output layer: weight and bias
        self.progress = None
        self.trace_data, self.trace_save = engine.tracer.name("load batch"), engine.tracer.name("checkpoint")

    # --- failures ----------------------------------------------------------------------
    def diverged(self, what: str, step: int) -> JobError:
        """The error every rank raises when ``what`` (e.g. "the training loss is nan") went wrong at ``step``."""
        kept = (f"; the last checkpoint {self.cfg.checkpoint} (step {self.saved_at}) is kept"
                if self.cfg.checkpoint and self.saved_at >= 0 else "")
        return JobError(f"training diverged at step {step} (epoch {self.epochs_done + 1}): {what}{kept}; "
                        f"try a smaller --lr, or --normalize standard for unscaled inputs", EXIT_DIVERGED)

    def check_gradients(self) -> None:
        """After backward: the output layer's averaged gradients (identical on every rank) must be finite.

        A NaN or inf anywhere reaches the loss, and so the output layer's gradient, by the next
        step at the latest (non-finite weights make non-finite logits); checking that layer
        alone keeps the check to a few microseconds. Parameters are checked in full before every
        checkpoint, so nothing non-finite is ever saved.
        """
        if self.averager is not None and self.comm.size > 1:
            return                                   # replicas differ: checked at averaging and flushes
        bad = _nonfinite([p.grad for p in self.watched])
        if bad is not None:
            param = self.watched[bad]
            raise self.diverged(f"the gradient of {self._name_of(param)!r} {_what(param.grad)}", self.step + 1)

    def check_parameters(self, collective: bool) -> None:
        """The parameters must be finite on every rank (``collective``: agree through one all-reduce)."""
        shards = self.cfg.zero == 3             # this rank's shard of every group: the values it keeps
        params = self.engine.shard_parameters() if shards else self.engine.parameters()
        with np.errstate(over="ignore", invalid="ignore"):
            bad = _nonfinite([p.data for p in params])
        if (any_rank(self.comm, bad is not None) if collective else bad is not None):
            name = f"this rank's shard of parameter group {bad}" if shards else f"parameter {self.names[bad]!r}"
            what = (f"{name} {_what(params[bad].data)}" if bad is not None
                    else "a parameter on another rank is not finite")
            raise self.diverged(what, self.step)

    def _name_of(self, param) -> str:
        return next(n for n, p in self.engine.named_parameters() if p is param)

    def write_metrics(self, status: str = "running") -> None:
        """Rank 0 writes the metrics file (when asked for); every rank agrees on a failure (exit 4)."""
        message, target = None, self.cfg.metrics
        if self.comm.rank == 0 and self.log is not None:
            try:
                self.log.write(target, {**self.attrs, "status": status})
            except OSError as exc:
                kept = "the previous file is kept" if os.path.lexists(target) else "there was no previous file"
                message = f"cannot write {target}: {exc.strerror or exc}; {kept}, training stopped"
        message = agree(self.comm, message)
        if message:
            raise JobError(message, EXIT_WRITE)

    # --- files -------------------------------------------------------------------------
    def flush(self) -> None:
        """Reduce the pending step rows (collective), add them up, and check their losses."""
        cols = self.recorder.flush(self.engine.reduce_metrics)
        bad = np.flatnonzero(~np.isfinite(cols["loss"]))
        if bad.size:
            raise self.diverged(f"the training loss is {cols['loss'][bad[0]]}", int(cols["step"][bad[0]]))
        add_to_totals(self.totals, cols)
        if self.log is not None:
            self.log.add_steps(cols)

    def save(self, status: str = "running") -> None:
        """Check the parameters, then write metrics and checkpoint of the current position (collective)."""
        traced = self.engine.tracer.clock()
        gather = self.cfg.zero != 3             # ZeRO-3 checks its shards and writes a shard file: nothing gathered
        with self.engine.full_parameters() if gather else contextlib.nullcontext():
            self.check_parameters(collective=True)
        self.write_metrics(status)
        if self.cfg.checkpoint is not None and self.saved_at != self.step:
            self.saved_at = self.step
            try:
                checkpoint.save(self.comm, self.cfg.checkpoint, self.saved_objects(), info=checkpoint.RunInfo(
                    self.attrs["config"], self.cfg.backend, self.cfg.optimizer,
                    {k: v for k, v in self.attrs.items() if k != "config"}, self.input_shape, self.num_classes))
            except (TimeoutError, ConnectionError):
                raise            # a peer failed while the file was gathered (OSErrors too): the job ends as on any call
            except OSError as exc:   # the file could not be written, agreed by every rank
                raise JobError(f"{exc}, training stopped", EXIT_WRITE) from None
        self.engine.tracer.add(traced, self.trace_save, tracing.CHECKPOINT)

    def saved_objects(self) -> dict:
        """What a checkpoint holds: the model's state (a split model's whole), the optimizer's, the position."""
        where = checkpoint.TrainState(self.epochs_done, self.batches_done, self.step, self.totals, TOTALS)
        if self.engine.splits_model:            # the whole model, the first replica's, one row per data replica
            named, optimizer, dropouts = self.engine.whole_state(self.optimizer)
            model = checkpoint.ModelState(named, dropouts, self.engine, replicas=self.replicas)
        else:
            model = checkpoint.ModelState(self.model.named_parameters(), self.dropouts, self.engine,
                                          per_rank=self.averager is not None)
            optimizer = self.optimizer
        return {"model": model, "optim": optimizer, "train": where}

    # --- steps -------------------------------------------------------------------------
    def evaluate(self) -> np.ndarray:
        """(loss sum, correct, rows) of the validation rows over all ranks, forward only."""
        return self.engine.evaluate(self.X_val, self.y_val, self.loss_fn)

    def inject(self, xb: np.ndarray) -> np.ndarray:
        """Act out ``--inject-fault`` when this is its rank and step; the batch to train on."""
        rank, step, kind = self.fault
        if (rank, step) != (self.comm.rank, self.step + 1):
            return xb
        if kind == "nan":
            return np.full_like(xb, np.nan)
        if kind == "exit":
            sys.exit(3)
        raise InjectedFault(f"--inject-fault {self.cfg.inject_fault}: rank {rank}, step {step}")

    def run_epoch(self, epoch: int) -> bool:
        """Train from the saved position to the end of ``epoch`` or to --max-steps; True if stopped early."""
        cfg, engine, loss_fn = self.cfg, self.engine, self.loss_fn
        total = len(self.loader)
        self.loader.set_epoch(epoch)
        start = min(self.batches_done, total)
        self.progress.start_epoch(epoch, start)
        stop = False
        t0 = time.perf_counter()
        batches = self.engine.tracer.timed(self.loader.batches(start), self.trace_data, tracing.DATA)
        for b, (xb, yb) in enumerate(batches, start=start + 1):
            if self.fault is not None:
                xb = self.inject(xb)
            engine.zero_grad()
            averager = self.averager
            loss = engine.train_batch(xb, yb, loss_fn, local=averager is not None and averager.local())
            self.check_gradients()
            engine.step(self.optimizer)
            averaged = time.perf_counter()
            if averager is not None and averager.average_parameters(engine.parameters()):
                engine.stats.comm_exposed_s += time.perf_counter() - averaged    # nothing hides it: all exposed
                engine.stats.comm_calls += averager.calls
                engine.stats.comm_bytes += averager.bytes
                self.check_parameters(collective=False)          # identical right after averaging
            self.step, self.batches_done = self.step + 1, b
            now = time.perf_counter()
            counted = engine.reports          # a split model's loss is known on the last stage; the rest report 0
            self.recorder.record(self.step, epoch + 1, b, loss if counted else 0.0, len(yb) if counted else 0,
                                 self.optimizer.lr, now - t0, engine.stats)
            self.progress.update(loss)        # None under --pp: rank 0 is the first stage
            stop = bool(cfg.max_steps) and self.step >= cfg.max_steps
            if b < total and (stop or (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0)):
                self.flush()
                self.save()
            if stop:
                break
            t0 = time.perf_counter()
        self.progress.end_epoch()
        if self.batches_done >= total:
            self.end_epoch(epoch)
        return stop

    def end_epoch(self, epoch: int) -> None:
        """Validate, print the epoch line, start the next epoch's sums, and checkpoint."""
        self.flush()
        t0 = time.perf_counter()
        val = self.evaluate()
        row = epoch_row(epoch + 1, self.step, self.totals, val, time.perf_counter() - t0)
        self.last_row = row
        self.out.info(epoch_line(row, self.cfg.epochs) + self.tokens_per_s(row))
        if self.log is not None:
            self.log.add_epoch(row)
        self.epochs_done, self.batches_done = epoch + 1, 0
        self.totals[:] = 0
        self.save()

    def tokens_per_s(self, row: dict, sep: str = "  ") -> str:
        """GPT: ``sep`` + ``N tokens/s`` (training throughput of the epoch); empty for other models."""
        if self.cfg.model != "gpt":
            return ""
        return f"{sep}{row['samples_per_s'] * self.cfg.context_length:,.0f} tokens/s"

    def run(self) -> str:
        """All remaining epochs; 'complete' or 'stopped' (--max-steps)."""
        steps = len(self.loader)
        total = self.cfg.epochs * steps if not self.cfg.max_steps else min(self.cfg.max_steps, self.cfg.epochs * steps)
        self.progress = self.out.progress(epochs=self.cfg.epochs, steps_per_epoch=steps, total_steps=total,
                                          step=self.step, batch=self.cfg.batch_size)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):     # checked: check_gradients
            for epoch in range(self.epochs_done, self.cfg.epochs):
                if self.run_epoch(epoch):
                    return "complete" if self.epochs_done == self.cfg.epochs else "stopped"
        return "complete"
