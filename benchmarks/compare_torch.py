"""npddp against PyTorch's DistributedDataParallel on the same MLP, side by side in one MPI run.

    mpirun -n 2 python benchmarks/compare_torch.py
    mpirun -n 4 python benchmarks/compare_torch.py --model medium --reps 7 --steps 5 --out cmp.h5

Both sides train the same model of benchmarks/ddp.py (``--model``, default ``small``:
784-1024x5-10, 5.0M parameters) from the same initial weights on the same random batch
(``--batch`` rows per rank), float32, SGD (lr 0.01, momentum 0.9), cross-entropy, one thread
per rank (``torch.set_num_threads(1)``; NumPy's BLAS through ``npddp.util.threads.set_threads(1)``).
PyTorch: ``torch.nn.parallel.DistributedDataParallel`` on the gloo
backend (``bucket_cap_mb`` = ``--bucket-mb``, ``gradient_as_bucket_view=True``, the
optimizer's default ``zero_grad``); its process group takes rank and size from mpi4py and
rendezvouses at ``tcp://--master-addr:PORT``, PORT a free port chosen by rank 0 and
broadcast as an int64 array. npddp: :class:`npddp.parallel.ddp.DistributedDataParallel` with sync
``--sync`` (default overlap) on each of ``--backends`` (default mpi,ring,ring/tcp: the ring over MPI's
point-to-point layer and over TCP, like gloo).

Method: every side takes ``--warmup`` untimed steps; then the parameters of each npddp side
are compared with PyTorch's (same steps on the same data, so they differ by rounding only:
``max_param_diff`` is the largest absolute difference). Then ``--reps`` repetitions, each
timing a block of ``--steps`` steps of every side in turn (the order reversed every other
repetition), each block started by a barrier; a block's time is the maximum over ranks (one
all-reduce at the end). samples/s = world size x batch x steps / block time; the table shows
the median over repetitions with the minimum and maximum, and the ratio of each side's
median to PyTorch's (> 1: faster than PyTorch).

Exit status: 0 done; 2 bad arguments (before PyTorch is looked for); 3 PyTorch is not
installed (``pip install torch``; npddp itself never imports it).

HDF5 (``--out``; rank 0, atomically): a dump of kind ``torch_compare`` (one row per side,
PyTorch first; columns in npddp/columns.py, read with ``benchmarks.results.read_table``), root
attributes torch_version and sides, and ``/raw/samples_per_s`` (reps, sides).
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder, so `benchmarks` imports as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from npddp import comm as npcomm  # noqa: E402
from benchmarks import results  # noqa: E402
from npddp.parallel.ddp import BUCKET_CAP_MB, SYNCS, DistributedDataParallel  # noqa: E402
from npddp.process.job import abort_on_exception  # noqa: E402
from npddp.util.threads import set_threads  # noqa: E402
from npddp.nn import CrossEntropyLoss, mlp  # noqa: E402
from npddp.optim import SGD  # noqa: E402

from benchmarks import _common as bc
from benchmarks._gloo import EXIT_NO_TORCH, import_torch, init_gloo

KIND = "torch_compare"
#: npddp sides: a backend name, or NAME/tcp for a hand-written backend over the TCP transport.
SIDES = (*npcomm.BACKENDS, *(f"{b}/tcp" for b in npcomm.BACKENDS if b != "mpi"))
NO_TORCH = ("compare_torch.py: PyTorch is not installed (or lacks torch.distributed), so there is nothing "
            "to compare against; install it with `pip install torch` and run again")


@dataclass(frozen=True)
class Config:
    """Resolved command-line options."""

    model: str
    backends: tuple
    sync: str
    bucket_mb: float
    batch: int
    steps: int
    reps: int
    warmup: int
    master_addr: str
    timeout_s: int
    out: str


def build_parser(verbose: bool = True) -> argparse.ArgumentParser:
    """The command-line parser; only a ``verbose`` one prints."""
    p = bc.RankParser(prog="compare_torch.py", verbose=verbose,
                         description="Throughput of npddp and torch DistributedDataParallel on the same MLP.")
    p.add_argument("--model", choices=tuple(bc.MODELS), default="small", help="model size (default small)")
    p.add_argument("--backends", type=bc.names(SIDES), default=("mpi", "ring", "ring/tcp"),
                   help=f"npddp backends, NAME/tcp over the TCP transport (default mpi,ring,ring/tcp; valid: "
                        f"{', '.join(npcomm.BACKENDS)}, and NAME/tcp for all but mpi)")
    p.add_argument("--sync", choices=SYNCS, default="overlap", help="npddp sync strategy (default overlap)")
    p.add_argument("--bucket-mb", type=float, default=BUCKET_CAP_MB,
                   help=f"bucket cap in MiB, both sides (default {BUCKET_CAP_MB:g})")
    p.add_argument("--batch", type=bc.int_at_least(1), default=64, help="samples per rank per step (default 64)")
    p.add_argument("--steps", type=bc.int_at_least(1), default=10, help="steps per timed block (default 10)")
    p.add_argument("--reps", type=bc.int_at_least(1), default=5, help="timed blocks per side (default 5)")
    p.add_argument("--warmup", type=bc.int_at_least(0), default=3, help="untimed steps per side (default 3)")
    p.add_argument("--master-addr", default="127.0.0.1",
                   help="address of rank 0 for the gloo rendezvous (default 127.0.0.1: one host)")
    p.add_argument("--timeout", type=bc.int_at_least(1), default=120,
                   help="seconds the gloo rendezvous and collectives may take (default 120)")
    p.add_argument("--out", default="", help="write an HDF5 dump here (rank 0)")
    return p


def parse_config(argv, verbose: bool = True) -> Config:
    """Parse ``argv``; on bad input print (if verbose) and raise SystemExit(2)."""
    parser = build_parser(verbose)
    a = parser.parse_args(argv)
    if not (np.isfinite(a.bucket_mb) and a.bucket_mb > 0):
        parser.error(f"--bucket-mb must be a number > 0, got {a.bucket_mb}")
    return Config(a.model, a.backends, a.sync, float(a.bucket_mb), a.batch, a.steps, a.reps, a.warmup,
                  a.master_addr, a.timeout, a.out)


# ----------------------------------------------------------------------------- the two sides

class NpddpSide:
    """npddp DDP on one backend (over its own duplicate of ``mpi_comm``)."""

    def __init__(self, cfg: Config, backend: str, mpi_comm, x, y, tcp_world=None):
        self.label, self.framework, self.backend, self.sync = f"npddp {backend}", "npddp", backend, cfg.sync
        self._sub = mpi_comm.Dup()
        name, _, transport = backend.partition("/")
        model = mlp(bc.IN_FEATURES, bc.MODELS[cfg.model], bc.OUT_FEATURES, dtype=np.float32, seed=0)
        comm = bc.create_comm(name, self._sub, transport or bc.DEFAULT_TRANSPORT, tcp_world)
        self.ddp = DistributedDataParallel(model, comm, sync=cfg.sync, bucket_cap_mb=cfg.bucket_mb)
        self.opt = SGD(self.ddp.parameters(), lr=bc.LR, momentum=bc.MOMENTUM)
        self.lossfn = CrossEntropyLoss()
        self.x, self.y = x, y

    def step(self) -> None:
        """One training step."""
        self.ddp.zero_grad()
        self.lossfn.forward(self.ddp(self.x), self.y)
        self.ddp.backward(self.lossfn.backward())
        self.ddp.step(self.opt)

    def weights(self) -> list:
        """Parameter values, in layer order (weight, bias per layer)."""
        return [p.data for p in self.ddp.parameters()]

    def close(self) -> None:
        """Free the duplicated communicator."""
        self._sub.Free()


class TorchSide:
    """torch.nn.parallel.DistributedDataParallel on the default (gloo) process group."""

    def __init__(self, torch, cfg: Config, initial: list, x, y):
        self.label, self.framework, self.backend, self.sync = "torch gloo", "torch", "gloo", "ddp"
        nn = torch.nn
        w = bc.widths(cfg.model)
        layers = []
        for i in range(len(w) - 1):
            layers += [nn.Linear(w[i], w[i + 1])] + ([nn.ReLU()] if i < len(w) - 2 else [])
        model = nn.Sequential(*layers)
        with torch.no_grad():
            for p, value in zip(model.parameters(), initial):
                p.copy_(torch.from_numpy(value))
        self.ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cfg.bucket_mb,
                                                       gradient_as_bucket_view=True)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=bc.LR, momentum=bc.MOMENTUM)
        self.lossfn = nn.CrossEntropyLoss()
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)  # (B, 784) float32, (B,) int64

    def step(self) -> None:
        """One training step."""
        self.opt.zero_grad()
        self.lossfn(self.ddp(self.x), self.y).backward()
        self.opt.step()

    def weights(self) -> list:
        """Parameter values as NumPy arrays, in layer order."""
        return [p.detach().numpy() for p in self.ddp.module.parameters()]

    def close(self) -> None:
        """Nothing to free (the process group is destroyed by :func:`main`)."""


def max_diff(a: list, b: list) -> float:
    """Largest absolute difference between two lists of same-shaped arrays."""
    return max(float(np.abs(u - v).max()) for u, v in zip(a, b))


def block_time(side, steps: int, harness) -> float:
    """Barrier, then this rank's seconds for ``steps`` training steps."""
    harness.Barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        side.step()
    return time.perf_counter() - t0


def measure(sides: list, cfg: Config, harness) -> tuple[np.ndarray, list]:
    """(samples/s per repetition and side, (reps, sides); max |param diff| of each side vs the first)."""
    for side in sides:
        for _ in range(cfg.warmup):
            side.step()
    diffs = [max_diff(side.weights(), sides[0].weights()) for side in sides]
    times = np.zeros((cfg.reps, len(sides)))  # (reps, sides)
    for r in range(cfg.reps):
        order = range(len(sides)) if r % 2 == 0 else reversed(range(len(sides)))
        for k in order:
            times[r, k] = block_time(sides[k], cfg.steps, harness)
    harness.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return harness.Get_size() * cfg.batch * cfg.steps / times, diffs


def result_rows(sides: list, sps: np.ndarray, diffs: list, cfg: Config, n: int) -> list[dict]:
    """One row per side (the first is PyTorch) from the (reps, sides) samples/s."""
    median = np.median(sps, axis=0)  # (sides,)
    return [{"framework": s.framework, "backend": s.backend, "sync": s.sync, "model": cfg.model,
             "params": bc.param_count(cfg.model), "world_size": n, "batch": cfg.batch, "steps": cfg.steps,
             "reps": cfg.reps, "samples_per_s": float(median[k]), "samples_per_s_min": float(sps[:, k].min()),
             "samples_per_s_max": float(sps[:, k].max()), "step_ms": n * cfg.batch / float(median[k]) * 1e3,
             "ratio_to_torch": float(median[k] / median[0]), "max_param_diff": diffs[k]}
            for k, s in enumerate(sides)]


TABLE = (("framework", "framework", 9, ""), ("backend", "backend", 7, ""), ("sync", "sync", 8, ""),
         ("samples_per_s", "samples/s", 9, ".0f"), ("samples_per_s_min", "min", 7, ".0f"),
         ("samples_per_s_max", "max", 7, ".0f"), ("step_ms", "step_ms", 8, ".1f"),
         ("ratio_to_torch", "vs torch", 8, ".3f"), ("max_param_diff", "max|dparam|", 11, ".1e"))


def main(argv=None, mpi_comm=None) -> int:
    """Compare on ``mpi_comm`` (default COMM_WORLD); 0 done, 2 bad arguments, 3 without PyTorch."""
    world = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    argv = sys.argv[1:] if argv is None else list(argv)
    rank, n = world.Get_rank(), world.Get_size()
    cfg = parse_config(argv, verbose=rank == 0)
    set_threads(1)
    torch = import_torch()
    if torch is None:
        if rank == 0:
            print(NO_TORCH, file=sys.stderr, flush=True)
        return EXIT_NO_TORCH
    bc.check_out({"--out": cfg.out}, world, build_parser(rank == 0))
    import torch.distributed as dist
    torch.set_num_threads(1)
    rng = np.random.default_rng(1000 + rank)
    x = rng.standard_normal((cfg.batch, bc.IN_FEATURES)).astype(np.float32)  # (B, 784)
    y = rng.integers(0, bc.OUT_FEATURES, size=cfg.batch).astype(np.int64)     # (B,)
    if rank == 0:
        print(f"# npddp vs torch {torch.__version__} DDP: {n} ranks, model {cfg.model} "
              f"({bc.param_count(cfg.model):,} parameters), batch {cfg.batch} per rank, float32, "
              f"{cfg.warmup} warm-up steps, {cfg.reps} x {cfg.steps} timed steps per side", flush=True)
    harness = world.Dup()
    init_gloo(dist, world, cfg.master_addr, cfg.timeout_s)
    sides = []
    try:
        tcp = bc.tcp_world(world) if any(b.endswith("/tcp") for b in cfg.backends) else None
        sides.append(NpddpSide(cfg, cfg.backends[0], world, x, y, tcp))
        initial = [w.copy() for w in sides[0].weights()]
        sides.insert(0, TorchSide(torch, cfg, initial, x, y))
        sides += [NpddpSide(cfg, b, world, x, y, tcp) for b in cfg.backends[1:]]
        sps, diffs = measure(sides, cfg, harness)
    finally:
        for side in sides:
            side.close()
        harness.Free()
        dist.destroy_process_group()
    rows = result_rows(sides, sps, diffs, cfg, n)
    if rank == 0:
        print("# samples/s: median over repetitions (min, max) of global samples/s; block time = max over ranks; "
              "vs torch: median / torch median; max|dparam|: after the warm-up, vs torch")
        print(bc.format_table(rows, TABLE))
        if cfg.out:
            attrs = {"argv": json.dumps(argv), "config": asdict(cfg), "sides": [s.label for s in sides],
                     "torch_version": str(torch.__version__), "lr": bc.LR, "momentum": bc.MOMENTUM}
            results.write_dump(cfg.out, KIND, rows, world_size=n, backends=cfg.backends, raw={"samples_per_s": sps},
                               attrs=attrs)
            print(f"# wrote {cfg.out}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    abort_on_exception()
    sys.exit(main())
