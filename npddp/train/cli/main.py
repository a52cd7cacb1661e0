"""Train a NumPy model with Distributed Data Parallel over MPI.

    python -m npddp.train                          # one rank: an MLP on the synthetic data set
    mpirun -n 2 python -m npddp.train              # the same on 2 ranks; the global batch is split
    mpirun -n 4 python -m npddp.train --backend ring --model cnn --epochs 5 --checkpoint run.h5
    mpirun -n 4 python -m npddp.train --checkpoint run.h5 --resume      # settings come from run.h5
    mpirun -n 2 python -m npddp.train --sync bucketed --bucket-mb 0.1 --metrics m.h5
    mpirun -n 2 python -m npddp.train --max-steps 100 --checkpoint run.h5   # stop early, resume later
    mpirun -n 2 python -m npddp.train --dataset images.npz --normalize standard
    mpirun -n 2 python -m npddp.train --backend ring --timeout 60 --inject-fault 1:5   # must end, exit 1
    mpirun -n 2 python -m npddp.train --model gpt --optimizer adamw --lr 1e-3 --epochs 2   # tiny GPT
    mpirun -n 2 python -m npddp.train --model gpt --dataset text:code.txt --batch-size 16 --lr 3e-3 --optimizer adamw
    python -m npddp.train --help                   # every flag with its default

The steps: flags (parsed identically on every rank) -> communicator -> (the checkpoint's
settings, on --resume) -> checks -> BLAS threads -> data -> model -> DDP -> optimizer ->
(restore) -> epochs of training steps with validation. Rank 0 prints a header, progress
within each epoch (a bar on a terminal, else a line every --log-every seconds), one line per
epoch and a summary, and writes the HDF5 checkpoint (--checkpoint) and metrics (--metrics).

Exit status (npddp.process.job): 0 done; 2 bad input, one ``error: ...`` line, nothing overwritten;
3 a non-finite loss, gradient or parameter (one line; the last checkpoint is kept); 4 a
checkpoint or metrics file could not be written (one line; the previous file is kept; a file-size
limit too: SIGXFSZ is ignored, so the write fails with EFBIG); 1 an
exception on any rank (a --timeout, --inject-fault) aborts the whole job, as does sys.exit(N)
on one rank, with status N.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import signal
import sys
import time

from npddp.train.cli import outputs
from npddp.train.checkpoint import resume
from npddp.train import engines, sharding
from npddp.process.agree import agree
from npddp.train.console.banner import header, summary, transport_of
from npddp.train.config import Config, ConfigError, default_backend
from npddp.train.cli.parser import load_plugins, parse_args
from npddp.train.cli.validate import OWN_SCHEDULES, check_algorithms, check_config
from npddp.train.cli import layout
from npddp.comm.node.memory import node_ids
from npddp.comm.transports.base import resolve_transport
from npddp.comm.transports.mpi import mpi_missing
from npddp.train.cli.inputs import dataset_name, load_data, scaling_warning
from npddp.util import env, threads, tracing
from npddp.parallel.model.engine import MeshEngine
from npddp.process.job import EXIT_USAGE, EXIT_WRITE, JobError, open_communicator, run_main
from npddp.train.models import build_model
from npddp.train.console.printer import Printer
from npddp.util.runinfo import environment
from npddp.train.trainer import Trainer

def train(argv=None) -> int:
    """Parse, set up and train; the exit status."""
    started = time.perf_counter()
    hint = env.world_rank()                       # before the communicator exists
    try:
        given = parse_args(argv, help_file=sys.stdout if hint == 0 else io.StringIO())
        cfg = Config(**given)
        check_algorithms(cfg)
    except ConfigError as exc:
        Printer(hint).error(str(exc))
        return EXIT_USAGE
    if cfg.resume is True and not cfg.checkpoint:      # before any MPI: nothing is left in /dev/shm
        Printer(hint).error("--resume needs --checkpoint PATH.h5: the checkpoint to continue")
        return EXIT_USAGE
    if not cfg.resume and "backend" not in given:
        cfg = dataclasses.replace(cfg, backend=default_backend(cfg.transport)[0])
    if cfg.resume and "backend" not in given:
        # the backend comes from the checkpoint, read once the ranks can talk: open a provisional
        # communicator this transport can run (over tcp a hand-written one), the saved one after
        cfg = dataclasses.replace(cfg, backend="ring" if resolve_transport(cfg.transport, probe=True) == "tcp"
                                  else cfg.backend)
    elif _mpi_over_tcp(cfg):
        Printer(hint).error(_mpi_over_tcp(cfg))
        return EXIT_USAGE
    try:
        comm = open_communicator(cfg.backend, timeout=cfg.timeout, transport=cfg.transport,
                                 algorithms=_algorithms(cfg))
    except JobError as exc:
        Printer(0 if exc.local else hint).error(str(exc))
        return exc.code
    out = Printer(comm.rank, cfg.quiet, progress=cfg.progress, log_every=cfg.log_every)
    try:
        return _run(cfg, given, comm, out, started)
    except JobError as exc:
        out.error(str(exc))
        return exc.code


def _algorithms(cfg: Config) -> dict | None:
    """``--algorithms`` for the communicator; None where the backend runs its own schedules (check_config says so)."""
    return None if cfg.backend in OWN_SCHEDULES else check_algorithms(cfg) or None


def _mpi_over_tcp(cfg: Config) -> str | None:
    """The error when ``--backend mpi`` meets a job over TCP, else None."""
    if cfg.backend != "mpi" or resolve_transport(cfg.transport, probe=True) != "tcp":
        return None
    missing = mpi_missing() if cfg.transport == "auto" else None
    why = "--transport tcp" if cfg.transport != "auto" else \
        f"--transport auto chose tcp: {f'no MPI here, {missing}' if missing else 'no MPI launcher started it'}"
    return (f"--backend mpi runs MPI's own collectives, which a job over TCP ({why}) does not have; use a "
            "hand-written backend, e.g. --backend ring or --backend auto")


def _run(cfg: Config, given: dict, comm, out: Printer, started: float) -> int:
    """Everything after the communicator exists; JobError for failures every rank agrees on."""
    cfg, comm, ckpt, saved, picked = _settle_config(cfg, given, comm)
    n_threads, why = threads.resolve(cfg.threads)
    threads.apply(n_threads)
    settings, ds, model, dropouts, model_text, init = _inputs_and_model(cfg, comm)
    env = _environment(cfg, comm, n_threads)
    attrs = {**env, "config": settings, "model": model_text,
             "parameters": model.num_parameters(), "dataset_rows": [ds.n_train, ds.n_val]}
    ddp, optimizer = engines.build(cfg, comm, model, dropouts, ds.num_classes, init)
    if layout.is_split(cfg):
        model = ddp.stage                          # this rank's part; the checkpoint holds the whole model
    trainer = Trainer(cfg, comm, out, ds, model, dropouts, ddp, optimizer, attrs)
    ddp.tracer.describe(config=settings, backend=cfg.backend, model=model_text)
    if cfg.resume and layout.is_split(cfg):
        _resume_split(trainer, ddp, ckpt, saved, out)
    elif cfg.resume:
        with ddp.full_parameters():
            resume.restore_into(trainer, ckpt, saved, out)
    chosen = picked or ("" if "backend" in given or cfg.resume else default_backend(cfg.transport)[1])
    for line in header(cfg, comm, ds, model_text, model, ddp, trainer, env, threads.describe(n_threads, why),
                       chosen, _nodes(comm)):
        out.info(line)
    _announce(cfg, given, saved, comm, out, ddp, optimizer, scaling_warning(ds, settings))
    if _nothing_to_do(cfg, trainer, out):
        return 0
    return _train(cfg, comm, out, trainer, ddp, started)


def _settle_config(cfg: Config, given: dict, comm):
    """The run's settings (from the checkpoint on --resume), checked; the communicator they ask for.

    Returns ``(cfg, comm, ckpt, saved, picked)``: the checkpoint read on --resume (rank 0), its settings, and why
    the backend is not the checkpoint's when this transport cannot run that one ("" otherwise).
    """
    opened, ckpt, saved, picked = (cfg.backend, cfg.transport), None, None, ""
    if cfg.resume == "auto":  # resume when the checkpoint exists (rank 0 looks), else start fresh
        cfg = resume.auto(comm, cfg)
        if not cfg.resume and "backend" not in given:  # fresh: the default backend, not the provisional one
            cfg = dataclasses.replace(cfg, backend=default_backend(cfg.transport)[0])
            if _mpi_over_tcp(cfg):
                raise JobError(_mpi_over_tcp(cfg), EXIT_USAGE)
    try:
        if cfg.resume:
            ckpt, saved = resume.read_saved(comm, cfg.checkpoint)
            cfg = resume.merge(given, saved, cfg.checkpoint)
            load_plugins(cfg.plugin)           # the checkpoint's plugins, before its backend is opened
            if _mpi_over_tcp(cfg) and "backend" not in given:   # not inherited: the default of this transport
                backend, why = default_backend(cfg.transport)
                picked = f"the checkpoint's --backend {cfg.backend} needs an MPI launcher; {why}"
                cfg = dataclasses.replace(cfg, backend=backend)
            if _mpi_over_tcp(cfg):
                raise ConfigError(_mpi_over_tcp(cfg))
        check_config(cfg, comm.size)
    except ConfigError as exc:
        raise JobError(str(exc), EXIT_USAGE) from None
    if (cfg.backend, cfg.transport) != opened:  # the checkpoint's backend, taken over on --resume
        comm = open_communicator(cfg.backend, timeout=cfg.timeout, transport=cfg.transport,
                                 algorithms=_algorithms(cfg))
    return cfg, comm, ckpt, saved, picked


def _inputs_and_model(cfg: Config, comm):
    """The data set and model, and the output paths checked; JobError (usage) alike on every rank.

    Returns ``(settings, ds, model, dropouts, model_text, init)``; ``init``: the ShardedInit a ``--zero 3``
    model was built in (each rank holding its part only), else None.
    """
    settings = {**cfg.as_dict(), "dataset": dataset_name(cfg.as_dict())}
    ds, message = load_data(settings)
    model = dropouts = model_text = None
    init = sharding.construction(cfg, comm)
    if ds is not None:
        rank = 0 if layout.is_split(cfg) else comm.rank      # split: one process's dropout streams
        try:
            with init or contextlib.nullcontext():
                model, dropouts, model_text = build_model(settings, ds.input_shape, ds.num_classes, rank)
        except (ValueError, TypeError) as exc:
            message = f"--model {cfg.model}: {exc}"
        if not message and layout.is_split(cfg):
            message = layout.dry_check(lambda: build_model(settings, ds.input_shape, ds.num_classes)[0], cfg)
    if ds is not None and not message and cfg.batch_size > ds.n_train:
        message = (f"--batch-size {cfg.batch_size} is larger than the {ds.n_train} training rows of "
                   f"{settings['dataset']}: no step would see a full batch; use --batch-size {ds.n_train} or "
                   f"less (a multiple of the {comm.size} ranks), or more rows (--train-samples)")
    if comm.rank == 0 and not message:
        message = outputs.check_outputs(cfg.checkpoint, cfg.metrics, bool(cfg.resume), cfg.overwrite)
    if comm.rank == 0 and not message and cfg.trace:
        message = tracing.unwritable(cfg.trace, cfg.overwrite, bool(cfg.resume))
    message = agree(comm, message)
    if message:
        raise JobError(message, EXIT_USAGE)
    return settings, ds, model, dropouts, model_text, init


def _resume_split(trainer: Trainer, engine: MeshEngine, ckpt, saved: dict, out: Printer) -> None:
    """Resume a split model: every rank reads the whole model and optimizer state, then keeps its shards."""
    named, optimizer = engine.resume_targets(trainer.optimizer)
    resume.restore_into(trainer, ckpt, saved, out, named=named, optimizer=optimizer)
    engine.slice_resumed(named)
    engine.restore_dropouts(ckpt)


def _environment(cfg: Config, comm, n_threads: int) -> dict:
    """The run's environment for the header and the files (rank 0; empty elsewhere)."""
    if comm.rank != 0:
        return {}
    env = environment(world_size=comm.size, backend=cfg.backend, mpi=transport_of(comm) == "mpi")
    env["threads_per_rank"] = n_threads
    return env


def _announce(cfg: Config, given: dict, saved, comm, out: Printer, ddp, optimizer, warning: str | None) -> None:
    """The lines after the header: ZeRO memory, what a resume changed, stale files removed, a scaling warning."""
    replicas = ddp.mesh.dp if layout.is_split(cfg) else comm.size
    if cfg.zero:
        out.info(sharding.memory_line(cfg.zero, ddp, optimizer, replicas))
    if layout.is_split(cfg):
        out.info(layout.layout_line(cfg, comm.size) + f"; rank 0 holds {ddp.stage.num_parameters():,} of "
                 f"{ddp.whole_count():,} parameters")
    if cfg.resume:
        unkept = ddp.unkept_state(cfg.local_sgd, cfg.comm_hook) if layout.is_split(cfg) else ""
        for line in resume.changes(cfg, given, saved, replicas, unkept):
            out.info(line)
    if comm.rank == 0:
        for line in outputs.remove_stale([cfg.checkpoint, cfg.metrics]):
            out.warn(line)
    if warning:
        out.warn(warning)


def _nothing_to_do(cfg: Config, trainer: Trainer, out: Printer) -> bool:
    """True (and a summary line) when the checkpoint is already at the last epoch or --max-steps."""
    if trainer.epochs_done < cfg.epochs and not (cfg.max_steps and trainer.step >= cfg.max_steps):
        return False
    limit = f" (--max-steps {cfg.max_steps})" if cfg.max_steps else ""
    out.summary(f"nothing to do: {cfg.checkpoint} is at step {trainer.step}, epoch "
                f"{trainer.epochs_done} of {cfg.epochs}{limit}")
    return True


def _train(cfg: Config, comm, out: Printer, trainer: Trainer, ddp, started: float) -> int:
    """The epochs, the files at the end, the trace and the summary; JobError when the trace failed."""
    t0 = time.perf_counter()
    try:
        status = trainer.run()
        trained = time.perf_counter() - t0
        if status == "stopped":
            trainer.flush()
            trainer.save("stopped")
        else:
            trainer.write_metrics("complete")
    except BaseException as exc:
        _trace_failure(ddp.tracer, exc, comm.rank, out)
        raise
    ddp.tracer.close()                         # collective: the trace, if the traced steps have not ended
    out.summary(summary(cfg, status, trainer, trained, time.perf_counter() - started))
    failure = agree(comm, ddp.tracer.failure)
    if failure:
        raise JobError(f"{failure} (training finished; the checkpoint and metrics are written)", EXIT_WRITE)
    return 0


def _nodes(comm) -> list[int]:
    """Each rank's node (collective); JobError on a bad NPDDP_RANKS_PER_NODE, alike on every rank."""
    if comm.size == 1:
        return [0]
    try:
        return node_ids(comm)
    except ValueError as exc:
        raise JobError(str(exc), EXIT_USAGE) from None


def _trace_failure(tracer, exc: BaseException, rank: int, out: Printer) -> None:
    """Failure path: this rank's trace events go into the file (no communication)."""
    tracer.write_partial(f"rank {rank}: {type(exc).__name__}: {exc}")
    if tracer.failure:
        out.warn(tracer.failure)


def main(argv=None) -> int:
    """The CLI: ``train(argv)`` under npddp.process.job's abort hooks; the exit status."""
    _writes_fail_past_the_file_size_limit()
    return run_main(train, argv)


def _writes_fail_past_the_file_size_limit() -> None:
    """A write over RLIMIT_FSIZE fails with EFBIG (one line, exit 4) instead of SIGXFSZ killing the process."""
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
