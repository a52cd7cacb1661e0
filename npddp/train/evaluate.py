"""Evaluate a training checkpoint on a data set: loss and accuracy, on one process or N ranks.

    python -m npddp.evaluate run.h5                          # the validation rows it trained with
    python -m npddp.evaluate run.h5 --split train            # its training rows
    python -m npddp.evaluate run.h5 --dataset test.npz --split all
    mpirun -n 4 python -m npddp.evaluate run.h5              # each rank evaluates rows r::4
    python -m npddp.evaluate run.h5 --batch-size 64          # rows per forward pass (default: by memory)

The model is rebuilt from the settings stored in the checkpoint (:func:`npddp.load_model`);
the data set, keys and --normalize default to the run's (the split into train and validation
rows is the training run's, from the same seed). Rank 0 reads the checkpoint and broadcasts it;
every rank reads the data set. Prints one line; exit 0, or 2 with one ``error: ...`` line
(a missing, damaged or foreign checkpoint, unreadable data, rows that do not fit the model).
One process needs no MPI. The rows go through forward passes only, as many per pass as fit
the working set of :mod:`npddp.parallel.evaluation` unless ``--batch-size`` says.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from npddp.process.job import EXIT_USAGE, JobError, open_communicator, run_main
from npddp.process.agree import agree, share_text
from npddp.checkpoint import fileformat
from npddp.train.cli.inputs import load_data
from npddp.train.models import build_model, shape_rows
from npddp.parallel.evaluation import WORKING_SET, agreed_batch, evaluate_rows
from npddp.util import env

PROG = "python -m npddp.evaluate"
SPLITS = ("val", "train", "all")


class _Solo:
    """The communicator of a single process: every collective returns its own data."""

    rank, size, name = 0, 1, "solo"

    def broadcast(self, buf, root=0):
        """Nothing to send: ``buf`` as it is."""
        return buf

    def allreduce(self, buf, op="sum", out=None):
        """The reduction over one rank is the buffer itself."""
        if out is not None:
            np.copyto(out, buf)
            return out
        return buf

    def allgather(self, buf):
        """``buf`` with a leading axis of one rank."""
        return np.asarray(buf)[None].copy()


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise JobError(message, EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    """The command line: a checkpoint, and where the rows come from."""
    p = _Parser(prog=PROG, description="Loss and accuracy of a training checkpoint's model on a data set.",
                allow_abbrev=False)
    p.add_argument("checkpoint", metavar="PATH.h5", help="a checkpoint written by python -m npddp.train")
    p.add_argument("--dataset", metavar="NAME|PATH", help="data set (default: the one it trained on)")
    p.add_argument("--data-dir", metavar="DIR", help="directory of MNIST files and relative paths (default: the run's)")
    p.add_argument("--x-key", metavar="KEY", help="array of inputs in an array file (default: the run's)")
    p.add_argument("--y-key", metavar="KEY", help="array of labels in an array file (default: the run's)")
    p.add_argument("--split", choices=SPLITS, default="val",
                   help="rows to evaluate: the validation or training rows of the run's split, or all (default: val)")
    p.add_argument("--batch-size", type=int, default=None, metavar="B",
                   help=f"rows per forward pass (default: as many as fit a {WORKING_SET >> 20} MiB working set, "
                        "measured on the model)")
    p.add_argument("--replica", type=int, default=0, metavar="R",
                   help="with local SGD, whose parameters to use (default: rank 0's)")
    return p


def _load(comm, args):
    """(model, settings) on every rank: rank 0 reads the checkpoint, the rest receive it."""
    ckpt, message, text = None, None, ""
    if comm.rank == 0:
        try:
            ckpt = fileformat.read(args.checkpoint)
            if not ckpt.input_shape or not ckpt.num_classes:
                raise fileformat.CheckpointError(f"checkpoint {args.checkpoint!r} does not record the model's "
                                                 "input shape and classes")
            if ckpt.per_rank and not 0 <= args.replica < ckpt.world_size:
                raise fileformat.CheckpointError(f"--replica {args.replica} is out of range; valid: "
                                                 f"0..{ckpt.world_size - 1}")
            text = json.dumps({"config": ckpt.config, "input_shape": list(ckpt.input_shape),
                               "num_classes": ckpt.num_classes, "step": ckpt.step})
        except fileformat.CheckpointError as exc:
            message = str(exc)
    message = agree(comm, message)
    if message:
        raise JobError(message, EXIT_USAGE)
    meta = json.loads(share_text(comm, text))
    model, _, description = build_model(meta["config"], meta["input_shape"], meta["num_classes"])
    for name, p in model.named_parameters():
        if comm.rank == 0:
            value = ckpt.params[name]
            np.copyto(p.data, value[args.replica] if ckpt.per_rank else value)
        comm.broadcast(p.data, root=0)
    return model.eval(), meta, description


def run(argv=None) -> int:
    """Parse, load, evaluate and print; the exit status."""
    hint = env.world_rank()
    say = (lambda text, stream=sys.stdout: print(text, file=stream, flush=True)) if hint == 0 else \
        (lambda text, stream=None: None)
    try:
        args = build_parser().parse_args(argv)
        if args.batch_size is not None and args.batch_size < 1:
            raise JobError(f"--batch-size must be a positive integer, got {args.batch_size}")
        comm = open_communicator("mpi") if env.world_size() > 1 else _Solo()
        model, meta, description = _load(comm, args)
        settings = dict(meta["config"])
        for key in ("dataset", "data_dir", "x_key", "y_key"):
            if getattr(args, key) is not None:
                settings[key] = getattr(args, key)
        ds, message = load_data(settings, check_sizes=False)
        if ds is not None and tuple(ds.input_shape) != tuple(meta["input_shape"]):
            message = (f"--dataset {ds.name} has rows of shape {tuple(ds.input_shape)}, but the model takes "
                       f"{tuple(meta['input_shape'])}")
        message = agree(comm, message)
        if message:
            raise JobError(message, EXIT_USAGE)
    except JobError as exc:
        say(f"error: {exc}", sys.stderr)
        return exc.code
    name = settings["model"]
    parts = {"val": [(ds.X_val, ds.y_val)], "train": [(ds.X_train, ds.y_train)],
             "all": [(ds.X_train, ds.y_train), (ds.X_val, ds.y_val)]}[args.split]
    totals = np.zeros(3)
    for X, y in parts:
        X = shape_rows(name, X)
        batch = args.batch_size or agreed_batch(comm, model, X)
        totals += evaluate_rows(model, X, y, comm.rank, comm.size, batch,
                                lambda s: comm.allreduce(np.asarray(s, dtype=np.float64)))
    loss, correct, rows = totals
    loss_text = f"{loss / rows:.4f}" if rows else "nan"
    acc_text = f"{100 * correct / rows:.2f}%" if rows else "nan"
    say(f"evaluate: {args.checkpoint} (step {meta['step']}, {description}) on {ds.name} {args.split}, "
        f"{int(rows)} rows, {comm.size} rank{'s' * (comm.size > 1)}: loss {loss_text}, accuracy {acc_text}")
    return 0


def main(argv=None) -> int:
    """The CLI under npddp.process.job's abort hooks; the exit status."""
    return run_main(run, argv)
