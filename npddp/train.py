"""Train a NumPy model with Distributed Data Parallel over MPI.

    python -m npddp.train                          # one rank: an MLP on the synthetic data set
    mpirun -n 2 python -m npddp.train              # the same on 2 ranks; the global batch is split
    mpirun -n 4 python -m npddp.train --backend ring --model cnn --epochs 5 --checkpoint run.h5
    mpirun -n 4 python -m npddp.train --backend ring --model cnn --epochs 5 --checkpoint run.h5 --resume
    mpirun -n 2 python -m npddp.train --sync bucketed --bucket-mb 0.1 --metrics m.h5
    mpirun -n 2 python -m npddp.train --max-steps 100 --checkpoint run.h5   # stop early, resume later
    mpirun -n 2 python -m npddp.train --backend ring --timeout 60 --inject-fault 1:5   # must end, exit 1
    mpirun -n 2 python -m npddp.train --model gpt --optimizer adamw --lr 1e-3 --epochs 2   # tiny GPT
    mpirun -n 2 python -m npddp.train --model gpt --dataset text:README.md --context-length 128
    python -m npddp.train --help                   # every flag with its default

The steps: config (argv, checked identically on every rank) -> data -> model -> DDP ->
optimizer -> (resume) -> epochs of training steps with validation. Rank 0 prints a header, a
progress bar per epoch (only when stderr is a terminal), one line per epoch and a summary, and
writes the HDF5 checkpoint (--checkpoint) and metrics (--metrics). Bad input ends every rank
with exit code 2 after one ``error: ...`` line; an exception on any rank (a --timeout, or the
one --inject-fault raises) aborts the whole job.
"""

from __future__ import annotations

import io
import os
import sys
import time

import h5py
import numpy as np
from mpi4py import MPI

from . import checkpoint
from .comm import create
from .config import Config, ConfigError, check_config, fixed_on_resume, flag, parse_config, parse_fault
from .data import BatchLoader, DistributedSampler, iterate_batches, load_dataset
from .ddp import DistributedDataParallel
from .launch import abort_on_exception
from .metrics import FORMAT as METRICS_FORMAT
from .metrics import TOTALS, MetricsLog, StepRecorder, add_to_totals, epoch_row
from .nn import CrossEntropyLoss, Dropout, Linear, ReLU, Sequential, cnn, gpt_preset, mlp
from .optim import SGD, AdamW
from .progress import Printer, epoch_line, format_bytes
from .runinfo import environment

_MESSAGE_BYTES = 2048   # longest error message shared between ranks
_EVAL_BATCH = 1024      # validation rows per forward pass
_SYNTHETIC_ROWS = {"synthetic": (32768, 1024), "synthetic-image": (8192, 1024),
                   "synthetic-tokens": (8192, 512)}  # default (train, val)
_EVAL_ELEMENTS = 1 << 24  # GPT: validation sequences per forward pass hold at most this many logits


def agree(comm, message: str | None) -> str | None:
    """Share each rank's error (None: none) so every rank returns the same first one, or None."""
    raw = (message or "").encode()[:_MESSAGE_BYTES]
    mine = np.zeros(_MESSAGE_BYTES + 1, dtype=np.int32)                 # (1 + bytes,) length, bytes
    mine[0] = len(raw)
    mine[1:1 + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    table = comm.allgather(mine)                                       # (size, 1 + bytes)
    for r in range(comm.size):
        n = int(table[r, 0])
        if n:
            text = bytes(table[r, 1:1 + n].astype(np.uint8)).decode(errors="replace")
            return text if r == 0 else f"(on rank {r}) {text}"
    return None


class InjectedFault(RuntimeError):
    """The exception ``--inject-fault RANK:STEP`` raises."""


def limit_threads(n: int) -> str | None:
    """Cap BLAS threads at ``n`` (0: leave alone); a warning when that is not possible."""
    if not n:
        return None
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        current = os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
        if current == str(n):
            return None
        return (f"--threads {n} not applied: threadpoolctl is not installed and NumPy's BLAS is already "
                f"loaded; launch with OMP_NUM_THREADS={n} OPENBLAS_NUM_THREADS={n} instead "
                f"(or pip install threadpoolctl)")
    threadpool_limits(limits=n, user_api="blas")
    return None


def load_data(cfg: Config):
    """The data set for ``cfg``, or (None, message) when it cannot be loaded or does not fit."""
    name = cfg.dataset_name()
    kwargs = {}
    if name in _SYNTHETIC_ROWS:
        kwargs = {"n_train": cfg.train_samples or _SYNTHETIC_ROWS[name][0],
                  "n_val": cfg.val_samples or _SYNTHETIC_ROWS[name][1]}
    elif name == "digits" and cfg.model == "cnn":
        kwargs = {"as_images": True}
    if cfg.model == "gpt":                                  # token data: windows of context_length + 1
        kwargs["context_length"] = cfg.context_length
        if name == "synthetic-tokens":
            kwargs["vocab_size"] = cfg.vocab_size or 256
        else:
            kwargs = {"context_length": cfg.context_length, "vocab_size": cfg.vocab_size}
    try:
        ds = load_dataset(name, data_dir=cfg.data_dir, seed=0, dtype=np.dtype(cfg.dtype), **kwargs)
    except (OSError, ValueError, TypeError, KeyError, ImportError) as exc:
        text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        return None, f"--dataset {name}: {text}"
    if ds.task != ("language_model" if cfg.model == "gpt" else "classification"):
        return None, (f"--dataset {name} holds float targets; npddp.train trains classifiers, "
                      "so y must hold integer class labels")
    for what, count, have in (("train", cfg.train_samples, ds.n_train), ("val", cfg.val_samples, ds.n_val)):
        if count > have:
            return None, f"--{what}-samples {count} exceeds the {have} {what} rows of --dataset {name}"
    if cfg.model == "cnn" and len(ds.input_shape) != 3:
        return None, (f"--model cnn needs image rows (C, H, W), but --dataset {name} has rows of shape "
                      f"{tuple(ds.input_shape)}; use --model mlp or an image data set")
    return ds, None


def build_model(cfg: Config, ds, rank: int):
    """(model, its dropout layers, a one-line description); the same weights on every rank."""
    dtype = np.dtype(cfg.dtype)
    if cfg.model == "gpt":
        net = gpt_preset(cfg.model_size, ds.num_classes, cfg.context_length, dtype=dtype, seed=cfg.seed)
        c = net.config
        return net, [], (f"gpt {cfg.model_size} (d_model {c['d_model']}, {c['num_layers']} layers, "
                         f"{c['num_heads']} heads, d_ff {c['d_ff']}), vocab {c['vocab_size']}, context "
                         f"{cfg.context_length}, tied LM head")
    if cfg.model == "mlp":
        net = mlp(ds.in_features, cfg.hidden, ds.num_classes, dtype=dtype, seed=cfg.seed)
        text = "mlp " + "-".join(str(w) for w in (ds.in_features, *cfg.hidden, ds.num_classes))
    else:
        net = cnn(tuple(ds.input_shape), cfg.channels, cfg.hidden, ds.num_classes, dtype=dtype, seed=cfg.seed)
        text = (f"cnn {tuple(ds.input_shape)}, conv {'-'.join(map(str, cfg.channels))}, dense "
                f"{'-'.join(str(w) for w in (*cfg.hidden, ds.num_classes))}")
    dropouts = []
    if cfg.dropout > 0:
        layers = []
        for i, layer in enumerate(net.layers):
            layers.append(layer)
            if isinstance(layer, ReLU) and i + 1 < len(net.layers) and isinstance(net.layers[i + 1], Linear):
                # each rank (and layer) draws its own masks from a stream seeded by (seed, rank, layer)
                seed = int(np.random.SeedSequence([cfg.seed, rank, len(dropouts)]).generate_state(1)[0])
                dropouts.append(Dropout(cfg.dropout, seed=seed))
                layers.append(dropouts[-1])
        net = Sequential(*layers)
        text += f", dropout {cfg.dropout}"
    return net, dropouts, text


def make_optimizer(cfg: Config, params):
    """SGD (with momentum and L2 weight decay) or AdamW (decoupled decay), as --optimizer says."""
    if cfg.optimizer == "sgd":
        return SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    return AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def check_outputs(cfg: Config) -> str | None:
    """Rank 0: why --checkpoint or --metrics cannot be written there, or None.

    A file already there is replaced only if it is one of ours of the same kind.
    """
    for name, kind in (("checkpoint", checkpoint.FORMAT), ("metrics", METRICS_FORMAT)):
        path = getattr(cfg, name)
        if path is None:
            continue
        parent = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            return f"{flag(name)} {path!r} is a directory"
        if not os.path.isdir(parent):
            return f"{flag(name)} {path!r}: directory {parent!r} does not exist"
        if not os.access(parent, os.W_OK):
            return f"{flag(name)} {path!r}: directory {parent!r} is not writable"
        resuming = name == "checkpoint" and cfg.resume         # resume() explains a bad checkpoint
        if os.path.exists(path) and not resuming and _format_of(path) != kind:
            return (f"{flag(name)} {path!r} exists and is not an npddp {name} file; refusing to replace "
                    "it (move it away or choose another path)")
    return None


def _format_of(path: str) -> str | None:
    """The ``format`` attribute of an HDF5 file, or None (not HDF5, unreadable, no such attribute)."""
    try:
        with h5py.File(path, "r") as f:
            value = f.attrs.get("format")
    except OSError:
        return None
    return value.decode() if isinstance(value, bytes) else value


class Trainer:
    """The training loop and what it writes: metrics rows, checkpoints, epoch lines."""

    def __init__(self, cfg: Config, comm, out: Printer, ds, model, dropouts, ddp, optimizer, attrs: dict):
        self.cfg, self.comm, self.out = cfg, comm, out
        self.model, self.dropouts, self.ddp, self.optimizer = model, dropouts, ddp, optimizer
        flat = cfg.model == "mlp"
        shape = lambda X: X.reshape(len(X), -1) if flat else X   # noqa: E731  (N, features) for the MLP
        self.X_val, self.y_val = shape(ds.X_val), ds.y_val
        sampler = DistributedSampler(ds.n_train, comm.size, comm.rank, shuffle=True, seed=cfg.seed)
        self.loader = BatchLoader(shape(ds.X_train), ds.y_train, sampler,
                                  batch_size=cfg.batch_size // comm.size, reuse_buffers=True)
        self.loss_fn = CrossEntropyLoss()
        self.recorder = StepRecorder()
        self.log = MetricsLog() if comm.rank == 0 and cfg.metrics else None
        self.attrs = attrs                                  # rank 0: environment and run description
        self.totals = np.zeros(len(TOTALS))                 # running sums of the epoch in progress
        self.eval_batch = (max(1, _EVAL_ELEMENTS // (cfg.context_length * ds.num_classes))
                           if cfg.model == "gpt" else _EVAL_BATCH)
        self.epochs_done, self.batches_done, self.step = 0, 0, 0
        self.last_row: dict | None = None
        self.saved_at = -1
        self.fault = parse_fault(cfg.inject_fault, comm.size) if cfg.inject_fault else None

    # --- files -------------------------------------------------------------------------
    def flush(self, status: str = "running") -> None:
        """Reduce the pending step rows (collective), add them up, and rewrite the metrics file."""
        cols = self.recorder.flush(self.ddp.reduce_metrics)
        add_to_totals(self.totals, cols)
        if self.log is not None:
            self.log.add_steps(cols)
            self.log.write(self.cfg.metrics, {**self.attrs, "status": status})

    def save(self) -> None:
        """Write the checkpoint of the current position (collective; rank 0 writes)."""
        if self.cfg.checkpoint is None or self.saved_at == self.step:
            return
        ckpt = checkpoint.collect(
            self.comm, named_params=self.model.named_parameters(), optimizer=self.optimizer,
            ddp=self.ddp, dropouts=self.dropouts,
            position=(self.epochs_done, self.batches_done, self.step), totals=self.totals,
            totals_columns=TOTALS, config=self.attrs["config"], backend=self.cfg.backend,
            optimizer_name=self.cfg.optimizer,
            attrs={k: v for k, v in self.attrs.items() if k != "config"})
        if ckpt is not None:
            checkpoint.write(self.cfg.checkpoint, ckpt)
        self.saved_at = self.step

    # --- steps -------------------------------------------------------------------------
    def evaluate(self) -> np.ndarray:
        """(loss sum, correct, rows) over all ranks; rank r evaluates validation rows r::size."""
        net, sums = self.model, np.zeros(3)
        idx = np.arange(self.comm.rank, len(self.X_val), self.comm.size)
        net.eval()
        for xb, yb in iterate_batches(self.X_val, self.y_val, idx, self.eval_batch):
            logits = net.forward(xb)                                  # (b, classes) or (b, T, vocab)
            sums += (self.loss_fn.forward(logits, yb) * len(yb), self.loss_fn.correct(logits, yb) / yb[0].size,
                     len(yb))
        net.train()
        return self.ddp.reduce_metrics(sums)

    def run_epoch(self, epoch: int) -> bool:
        """Train from the saved position to the end of ``epoch`` or to --max-steps; True if stopped early."""
        cfg, ddp, loss_fn = self.cfg, self.ddp, self.loss_fn
        total = len(self.loader)
        self.loader.set_epoch(epoch)
        start = min(self.batches_done, total)
        bar = self.out.bar(total, f"epoch {epoch + 1}/{cfg.epochs}")
        stop = False
        t0 = time.perf_counter()
        for b, (xb, yb) in enumerate(self.loader.batches(start), start=start + 1):
            if self.fault == (self.comm.rank, self.step + 1):
                raise InjectedFault(f"--inject-fault {cfg.inject_fault}: rank {self.comm.rank}, step {self.step + 1}")
            ddp.zero_grad()
            loss = loss_fn.forward(ddp(xb), yb)
            ddp.backward(loss_fn.backward())
            ddp.step(self.optimizer)
            self.step, self.batches_done = self.step + 1, b
            now = time.perf_counter()
            self.recorder.record(self.step, epoch + 1, b, loss, len(yb), self.optimizer.lr, now - t0, ddp.stats)
            bar.update(b, loss, now - t0)
            stop = bool(cfg.max_steps) and self.step >= cfg.max_steps
            if b < total and (stop or (cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0)):
                self.flush()
                self.save()
            if stop:
                break
            t0 = time.perf_counter()
        bar.close()
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
        if self.log is not None:
            self.log.write(self.cfg.metrics, {**self.attrs, "status": "running"})
        self.save()

    def tokens_per_s(self, row: dict, sep: str = "  ") -> str:
        """GPT: ``sep`` + ``N tokens/s`` (training throughput of the epoch); empty for other models."""
        if self.cfg.model != "gpt":
            return ""
        return f"{sep}{row['samples_per_s'] * self.cfg.context_length:,.0f} tokens/s"

    def run(self) -> str:
        """All remaining epochs; 'complete' or 'stopped' (--max-steps)."""
        for epoch in range(self.epochs_done, self.cfg.epochs):
            if self.run_epoch(epoch):
                return "complete" if self.epochs_done == self.cfg.epochs else "stopped"
        return "complete"


def resume(trainer: Trainer, cfg: Config, comm, out: Printer) -> str | None:
    """Load --checkpoint into ``trainer`` (collective); an error message for every rank, or None."""
    ddp, named = trainer.ddp, trainer.model.named_parameters()
    ckpt, message = None, None
    if comm.rank == 0:
        try:
            ckpt = checkpoint.read(cfg.checkpoint)
            message = checkpoint.incompatibility(
                ckpt, cfg.checkpoint, config=trainer.attrs["config"], fixed=fixed_on_resume(),
                flags={f: flag(f) for f in fixed_on_resume()}, world_size=comm.size,
                allow_world_size_change=cfg.allow_world_size_change, named_params=named,
                optimizer=trainer.optimizer, ddp=ddp, optimizer_name=cfg.optimizer)
        except checkpoint.CheckpointError as exc:
            message = f"--resume: {exc}"
    message = agree(comm, message)
    if message:
        return message
    state = checkpoint.restore(comm, ckpt, named_params=named, optimizer=trainer.optimizer, ddp=ddp,
                               dropouts=trainer.dropouts)
    trainer.optimizer.lr = cfg.lr                       # the one hyperparameter a resumed run may change
    trainer.epochs_done, trainer.batches_done, trainer.step = \
        state["epochs_done"], state["batches_done"], state["step"]
    trainer.saved_at = trainer.step
    if len(state["totals"]) == len(TOTALS):
        trainer.totals[:] = state["totals"]
    if state["world_size"] != comm.size:
        out.warn(f"resuming a {state['world_size']}-rank checkpoint on {comm.size} ranks: "
                 + (f"{' and '.join(state['fresh'])} start afresh; " if state["fresh"] else "")
                 + "the run is no longer bit-identical to an uninterrupted one")
    trainer.attrs["resumed_from_step"] = trainer.step
    if trainer.log is not None:
        trainer.log, note = MetricsLog.resume(cfg.metrics, trainer.step, trainer.epochs_done)
        if note:
            out.warn(note)
    return None


def header(cfg: Config, comm, ds, model_text: str, model, ddp, trainer: Trainer, env: dict) -> list[str]:
    """The lines rank 0 prints before training."""
    per_rank = cfg.batch_size // comm.size
    nbytes = model.num_bytes()
    lines = [f"npddp.train: {comm.size} rank{'s' * (comm.size > 1)}, backend {cfg.backend}, "
             f"MPI {env.get('mpi_library', '?')}",
             f"model: {model_text}; {model.num_parameters():,} parameters ({cfg.dtype}, {format_bytes(nbytes)})",
             f"sync: {cfg.sync}, {len(ddp.buckets)} bucket{'s' * (len(ddp.buckets) > 1)}, compression "
             f"{cfg.compression}" + (f", local SGD every {cfg.local_sgd} steps" if cfg.local_sgd else ""),
             (f"data: {ds.name}, {ds.n_train} train / {ds.n_val} val sequences of {cfg.context_length} tokens, "
              f"vocabulary {ds.num_classes}; batch {cfg.batch_size} = {comm.size} x {per_rank} sequences, "
              if cfg.model == "gpt" else
              f"data: {ds.name}, {ds.n_train} train / {ds.n_val} val rows of shape {tuple(ds.input_shape)}, "
              f"{ds.num_classes} classes; batch {cfg.batch_size} = {comm.size} x {per_rank}, ")
             + f"{len(trainer.loader)} steps per epoch",
             f"optimizer: {cfg.optimizer}, lr {cfg.lr}"
             + (f", momentum {cfg.momentum}" if cfg.optimizer == "sgd" else "")
             + f", weight decay {cfg.weight_decay}; {cfg.epochs} epochs, seed {cfg.seed}"]
    if cfg.resume:
        lines.append(f"resuming {cfg.checkpoint} at epoch {trainer.epochs_done + 1}, batch "
                     f"{trainer.batches_done} done (step {trainer.step})")
    return lines


def main(argv=None) -> int:
    """Run the CLI; the exit code (0 done, 2 bad input)."""
    abort_on_exception()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    started = time.perf_counter()
    try:
        cfg = parse_config(argv, help_file=sys.stdout if rank == 0 else io.StringIO())
        check_config(cfg, size)
    except ConfigError as exc:
        Printer(rank).error(str(exc))
        return 2
    out = Printer(rank, cfg.quiet, progress=cfg.progress)
    try:
        comm = create(cfg.backend, world, timeout=cfg.timeout)
    except ValueError as exc:           # NPDDP_DEBUG / NPDDP_TIMEOUT malformed: the same on every rank
        out.error(str(exc))
        return 2
    note = limit_threads(cfg.threads)
    if note:
        out.warn(note)

    ds, message = load_data(cfg)
    if ds is not None:
        try:
            model, dropouts, model_text = build_model(cfg, ds, rank)
        except (ValueError, TypeError) as exc:
            message = f"--model {cfg.model}: {exc}"
    message = agree(comm, message or (check_outputs(cfg) if rank == 0 else None))
    if message:
        out.error(message)
        return 2

    ddp = DistributedDataParallel(model, comm, sync=cfg.sync, bucket_cap_mb=cfg.bucket_mb,
                                  compression=cfg.compression, topk_ratio=cfg.topk_ratio,
                                  local_sgd=cfg.local_sgd)
    optimizer = make_optimizer(cfg, ddp.parameters())
    env = environment(world_size=size, backend=cfg.backend) if rank == 0 else {}
    attrs = {**env, "config": {**cfg.as_dict(), "dataset": cfg.dataset_name()}, "model": model_text,
             "parameters": model.num_parameters(), "dataset_rows": [ds.n_train, ds.n_val]}
    trainer = Trainer(cfg, comm, out, ds, model, dropouts, ddp, optimizer, attrs)
    if cfg.resume:
        message = resume(trainer, cfg, comm, out)
        if message:
            out.error(message)
            return 2
    for line in header(cfg, comm, ds, model_text, model, ddp, trainer, env):
        out.info(line)
    if trainer.epochs_done >= cfg.epochs or (cfg.max_steps and trainer.step >= cfg.max_steps):
        out.summary(f"nothing to do: {cfg.checkpoint} is at step {trainer.step}, epoch "
                    f"{trainer.epochs_done} of {cfg.epochs}" + (f" (--max-steps {cfg.max_steps})" if cfg.max_steps else ""))
        return 0

    t0 = time.perf_counter()
    status = trainer.run()
    trained = time.perf_counter() - t0
    if status == "stopped":
        trainer.flush("stopped")
        trainer.save()
    elif trainer.log is not None:
        trainer.log.write(cfg.metrics, {**attrs, "status": "complete"})
    out.summary(summary(cfg, status, trainer, trained, time.perf_counter() - started))
    return 0


def summary(cfg: Config, status: str, trainer: Trainer, trained: float, total: float) -> str:
    """The final line."""
    row = trainer.last_row
    text = (f"{'done' if status == 'complete' else 'stopped (--max-steps)'}: epoch {trainer.epochs_done}"
            f"/{cfg.epochs}, step {trainer.step}, {trained:.1f} s training, {total:.1f} s in all")
    if row is not None:
        text += f"; last val_acc {100 * row['val_acc']:.2f}%, val_loss {row['val_loss']:.4f}"
        text += trainer.tokens_per_s(row, sep=", ")
    for name in ("checkpoint", "metrics"):
        if getattr(cfg, name):
            text += f"; {name} {getattr(cfg, name)}"
    return text


if __name__ == "__main__":
    sys.exit(main())
