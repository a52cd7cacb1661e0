"""Check that DDP on N ranks ends with the weights of one process trained on the whole batch.

    mpirun -n 2 python benchmarks/verify.py                  # every model and sync, 5 steps
    python benchmarks/verify.py --world-size 2               # the same: launches itself on 2 ranks
    mpirun -n 3 python benchmarks/verify.py --models gpt --syncs overlap --num-steps 10 --backend ring

For each model (``mlp`` 32-64-64-5, ``cnn`` on 1x8x8 images with conv 4-8 and a dense 16
head, ``gpt``: the ``tiny`` preset with vocabulary 64, context 16 and a tied LM head) and each
sync strategy, every rank builds the same model (seed 0), trains a copy alone on the whole
global batch (``--num-samples`` rows per step, the reference "one process"), and trains
another copy under :class:`npddp.parallel.ddp.DistributedDataParallel` on its own ``num-samples / N``
rows of the same batches; ``--num-steps`` steps of AdamW (lr 1e-3, weight decay 0.01) or
SGD (lr 0.05, momentum 0.9). Inputs are standard-normal with random labels (MLP, CNN) or
windows of the synthetic Markov-chain tokens (GPT).

Printed per model and sync: the largest |DDP parameter - one-process parameter| over every
parameter and rank, and whether all ranks hold bit-identical parameters. The exit status is
0 when every difference is <= ``--tolerance`` (default 1e-10 for float64, 1e-4 for float32)
and the ranks agree, 1 otherwise, 2 on bad arguments.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder, so `benchmarks` imports as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import subprocess  # noqa: E402

import numpy as np  # noqa: E402

from npddp import comm as npcomm  # noqa: E402
from npddp.data import synthetic_tokens  # noqa: E402
from npddp.parallel.ddp import SYNCS, DistributedDataParallel  # noqa: E402
from npddp.nn import CrossEntropyLoss, cnn, gpt_preset, mlp  # noqa: E402
from npddp.optim import SGD, AdamW  # noqa: E402

from benchmarks import _common as bc

MODELS = ("mlp", "cnn", "gpt")
TOLERANCE = {"float64": 1e-10, "float32": 1e-4}
CLASSES, VOCAB, CONTEXT = 5, 64, 16
REPO = Path(__file__).resolve().parent.parent


def build_parser(verbose: bool = True) -> argparse.ArgumentParser:
    """The command-line parser; only a ``verbose`` one prints."""
    p = bc.RankParser(prog="verify.py", verbose=verbose, description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)} (default all)")
    p.add_argument("--syncs", default=",".join(SYNCS), help=f"comma-separated, from {', '.join(SYNCS)} (default all)")
    p.add_argument("--backend", choices=npcomm.BACKENDS, default="mpi", help="all-reduce backend (default mpi)")
    p.add_argument("--num-steps", type=int, default=5, help="optimizer steps (default 5)")
    p.add_argument("--num-samples", type=int, default=24,
                   help="global batch: rows (sequences for gpt) per step, split over the ranks (default 24)")
    p.add_argument("--world-size", type=int, default=0,
                   help="ranks to check with; run without mpirun, the script launches itself on that many "
                        "(default: the MPI world)")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--dtype", choices=tuple(TOLERANCE), default="float64")
    p.add_argument("--tolerance", type=float, default=None, help="largest allowed difference "
                   "(default 1e-10 for float64, 1e-4 for float32)")
    return p


def parse(argv, world_size: int, verbose: bool):
    """Checked arguments for ``world_size`` ranks (SystemExit(2) on bad input)."""
    p = build_parser(verbose)
    a = p.parse_args(argv)
    a.models = tuple(m.strip() for m in a.models.split(","))
    a.syncs = tuple(s.strip() for s in a.syncs.split(","))
    for flag, values, valid in (("--models", a.models, MODELS), ("--syncs", a.syncs, SYNCS)):
        bad = [v for v in values if v not in valid]
        if bad:
            p.error(f"{flag}: unknown {bad[0]!r}; valid: {', '.join(valid)}")
    for flag, value in (("--num-steps", a.num_steps), ("--num-samples", a.num_samples), ("--world-size", a.world_size)):
        if value < (0 if flag == "--world-size" else 1):
            p.error(f"{flag} must be >= 1, got {value}")
    n = a.world_size or world_size
    if a.num_samples % n:
        p.error(f"--num-samples {a.num_samples} does not split over {n} ranks: use a multiple of {n}")
    if a.tolerance is None:
        a.tolerance = TOLERANCE[a.dtype]
    elif not a.tolerance >= 0:
        p.error(f"--tolerance must be >= 0, got {a.tolerance}")
    return a


def relaunch(argv, n: int) -> int:
    """Run this script on ``n`` ranks through ./mpi_run.sh; its exit status."""
    cmd = [str(REPO / "mpi_run.sh"), "-n", str(n), sys.executable, str(Path(__file__).resolve()), *argv]
    return subprocess.call(cmd)


# ----------------------------------------------------------------------------- models and data

def make(name: str, dtype):
    """(model, global batches: inputs (steps, B, ...), targets (steps, B, ...)) for model ``name``."""
    if name == "mlp":
        return mlp(32, (64, 64), CLASSES, dtype=dtype, seed=0), (32,)
    if name == "cnn":
        return cnn((1, 8, 8), (4, 8), (16,), CLASSES, dtype=dtype, seed=0), (1, 8, 8)
    return gpt_preset("tiny", VOCAB, CONTEXT, dtype=dtype, seed=0), None


def batches(name: str, shape, steps: int, samples: int, dtype):
    """Inputs (steps, B, ...) and targets (steps, B[, T]) the same on every rank."""
    if shape is None:
        ds = synthetic_tokens(n_train=steps * samples, n_val=0, context_length=CONTEXT, vocab_size=VOCAB, seed=2)
        return (ds.X_train.reshape(steps, samples, CONTEXT), ds.y_train.reshape(steps, samples, CONTEXT))
    rng = np.random.default_rng(1)
    x = rng.standard_normal((steps, samples) + shape).astype(dtype)
    return x, rng.integers(0, CLASSES, (steps, samples))


def optimizer(name: str, params):
    """AdamW(lr 1e-3, wd 0.01) or SGD(lr 0.05, momentum 0.9)."""
    return AdamW(params, lr=1e-3, weight_decay=0.01) if name == "adamw" else SGD(params, lr=0.05, momentum=0.9)


def train(model, step_model, opt, X, Y, rows) -> np.ndarray:
    """Steps over ``rows`` of each batch through ``step_model`` (the model or its DDP); final flat parameters."""
    loss = CrossEntropyLoss()
    for x, y in zip(X, Y):
        step_model.zero_grad()
        loss.forward(step_model.forward(x[rows]), y[rows])
        step_model.backward(loss.backward())
        if isinstance(step_model, DistributedDataParallel):
            step_model.step(opt)
        else:
            opt.step()
    return np.concatenate([p.data.ravel() for p in model.parameters()])


def check(name: str, sync: str, a, comm, world) -> tuple[int, float, bool]:
    """(parameters, largest difference from one process over all ranks, ranks bit-identical)."""
    from mpi4py import MPI

    dtype = np.dtype(a.dtype).type
    model, shape = make(name, dtype)
    X, Y = batches(name, shape, a.num_steps, a.num_samples, dtype)
    reference = train(model, model, optimizer(a.optimizer, model.parameters()), X, Y, slice(None))
    model, _ = make(name, dtype)
    ddp = DistributedDataParallel(model, comm, sync=sync, bucket_cap_mb=0.01)
    per = a.num_samples // comm.size
    got = train(model, ddp, optimizer(a.optimizer, ddp.parameters()), X, Y,
                slice(comm.rank * per, (comm.rank + 1) * per))
    diff = np.array([np.max(np.abs(got - reference))])
    world.Allreduce(MPI.IN_PLACE, diff, op=MPI.MAX)
    first = got.copy()
    world.Bcast(first, root=0)
    same = np.array([int(np.array_equal(first, got))], dtype=np.int64)
    world.Allreduce(MPI.IN_PLACE, same, op=MPI.MIN)
    return model.num_parameters(), float(diff[0]), bool(same[0])


def main(argv=None) -> int:
    """Run every check; print on rank 0; the exit status (0 pass, 1 fail, 2 bad arguments)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    from npddp.util import env
    if env.world_size() == 1:
        a = parse(argv, 1, verbose=True)
        if a.world_size > 1:
            return relaunch(argv, a.world_size)
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    a = parse(argv, n, verbose=rank == 0)
    if a.world_size and a.world_size != n:
        if rank == 0:
            print(f"verify.py: error: --world-size {a.world_size} but running on {n} MPI ranks; drop one or "
                  f"the other", file=sys.stderr)
        return 2
    comm = npcomm.create(a.backend, world.Dup())
    if rank == 0:
        print(f"# verify: {n} rank(s) vs one process on the same global batches; backend {a.backend}, "
              f"{a.num_steps} steps of {a.optimizer}, global batch {a.num_samples} ({a.num_samples // n} per "
              f"rank), {a.dtype}, tolerance {a.tolerance:g}")
        print(f"{'model':6s} {'sync':9s} {'params':>8s}  {'max |DDP - one process|':>24s}  {'ranks identical':>15s}  result",
              flush=True)
    worst, failures = 0.0, []
    for name in a.models:
        for sync in a.syncs:
            params, diff, same = check(name, sync, a, comm, world)
            ok = diff <= a.tolerance and same
            worst = max(worst, diff)
            if not ok:
                failures.append(f"{name}/{sync}")
            if rank == 0:
                print(f"{name:6s} {sync:9s} {params:>8,d}  {diff:>24.3e}  {'yes' if same else 'NO':>15s}  "
                      f"{'ok' if ok else 'FAIL'}", flush=True)
    if rank == 0:
        checks = len(a.models) * len(a.syncs)
        if failures:
            print(f"FAILED {len(failures)} of {checks} checks: {', '.join(failures)} (tolerance {a.tolerance:g})")
        else:
            print(f"all {checks} checks passed: largest difference {worst:.3e} <= {a.tolerance:g}")
    return 1 if failures else 0


if __name__ == "__main__":
    from npddp.process.job import abort_on_exception
    abort_on_exception()
    sys.exit(main())
