"""Where a DDP training step spends its time, and how throughput scales with the rank count.

Run it with MPI::

    mpirun -n 2 python benchmarks/ddp.py                          # defaults: about a minute on 2 cores
    mpirun -n 2 python benchmarks/ddp.py --models small --syncs flat,overlap --backends ring --out ddp.h5
    mpirun -n 4 python benchmarks/ddp.py --weak-scaling --out scaling.h5
    python benchmarks/report.py ddp.h5 scaling.h5                 # tables and plots from the dumps

Full sweep (one core per rank; minutes): ``--steps 30 --warmup 5 --bucket-mb 1,5,25,100``, and
``--weak-scaling --models tiny,small,medium --syncs flat,bucketed,overlap --steps 30 --warmup 5``.

Models: MLPs on 784 inputs with 10 outputs, ReLU between layers, float32 by default:
``tiny`` 784-1024-256-10 (1,068,810 parameters, 6 tensors), ``small`` 784-1024x5-10
(5,012,490, 12 tensors), ``medium`` 784-2048x5-10 (18,413,578, 12 tensors). They train with
SGD (lr 0.01, momentum 0.9) and cross-entropy on one random batch per rank (``--batch`` rows
per rank, random labels), reused every step. BLAS threads per rank: npddp.threads' auto rule
(the CPUs a rank may use / the ranks on its node; 1 for 2 ranks on 2 cores).

Breakdown (default). Every model x sync x backend is timed, and for ``bucketed`` and
``overlap`` every ``--bucket-mb`` (``per_param`` and ``flat`` do not depend on it and run
once, with ``bucket_mb`` 0). Each combination gets a model with the same initial weights,
``--warmup`` untimed steps, then ``--steps`` timed ones. A step is: barrier (not timed),
``zero_grad``, forward, loss and its gradient, ``ddp.backward``, ``ddp.step``. Per step
and rank the DDP statistics are kept; after the whole sweep one all-reduce gives, per step,
the maximum over ranks of the step time (the step is as slow as its slowest rank) and the
mean over ranks of each part. A row reports medians over the timed steps:

* ``total_time_ms`` the step time (max over ranks), with ``_min``, ``_p10``, ``_p90``, ``_max``;
* ``forward_time_ms`` zero_grad + forward + loss; ``backward_time_ms`` backward without the
  time spent in communication calls issued from its hooks; ``optimizer_time_ms`` the SGD step;
* ``comm_issue_ms`` communication calls made during backward (``overlap``: starting and
  polling all-reduces); ``exposed_comm_ms`` waiting for communication after backward;
  ``comm_time_ms`` their sum: the time the step spends in communication instead of compute;
* ``compute_time_ms`` forward + backward + optimizer (as above); ``comm_fraction`` =
  comm_time_ms / total_time_ms; ``num_comm_ops`` all-reduce calls per step (``per_param``:
  one per tensor, ``flat``: 1); ``comm_bytes`` bytes all-reduced per rank per step;
  ``samples_per_s`` = world_size x batch / total step time.

Weak scaling (``--weak-scaling``). The same local batch on n = 1, 2, 4, ... ranks and on
the whole world: the first n ranks form a sub-communicator (``MPI.Comm.Split``) with their
own backends, the others wait in a barrier that sleeps between polls. Defaults here:
``--models small --syncs overlap --bucket-mb 25`` (the other options as above). Rows:
``step_ms`` (median of the max over ranks; ``_p10``, ``_p90``), ``samples_per_s`` (global)
and ``efficiency`` = samples_per_s at n / (n x samples_per_s at 1), which is 1.0 at n = 1.

HDF5 layout (``--out``; rank 0 writes it atomically), as benchmarks/report.py reads it::

    /        attributes: kind ("ddp_breakdown" or "weak_scaling"), argv (JSON list), config
             (JSON) and config.<option>, models (JSON: name -> widths), the run environment
             of npddp.runinfo.environment (schema_version, world_size, backend, MPI library,
             versions, host, threads_per_rank, time_utc, ...)
    /rows    one 1-D dataset per column above, one entry per row; strings as fixed-length
             bytes; ints int64, floats float64; times in ms per step. Both kinds also have
             model_size, params, sync, backend, bucket_mb, world_size, batch.
"""

from __future__ import annotations

import os

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _common as bc  # noqa: E402
from npddp import comm as npcomm  # noqa: E402
from npddp import runinfo  # noqa: E402
from npddp.ddp import SYNCS, DistributedDataParallel  # noqa: E402
from npddp.launch import abort_on_exception  # noqa: E402
from npddp.threads import set_threads  # noqa: E402
from npddp.nn import CrossEntropyLoss, mlp  # noqa: E402
from npddp.optim import SGD  # noqa: E402

IN_FEATURES, OUT_FEATURES = 784, 10
MODELS = {"tiny": (1024, 256), "small": (1024,) * 5, "medium": (2048,) * 5}  # hidden widths
LR, MOMENTUM = 0.01, 0.9
DTYPES = ("float32", "float64")
BUCKETED = ("bucketed", "overlap")
# one record per timed step and rank
FIELDS = ("total_s", "forward_s", "backward_s", "comm_issue_s", "comm_exposed_s", "optimizer_s",
          "comm_calls", "comm_bytes")
DEFAULTS = {  # (breakdown, weak scaling)
    "models": ("tiny,small,medium", "small"),
    "syncs": (",".join(SYNCS), "overlap"),
    "backends": ("mpi,ring", "mpi,ring"),
    "bucket_mb": ("1,25", "25"),
}


@dataclass(frozen=True)
class Config:
    """Resolved command-line options."""

    models: tuple
    syncs: tuple
    backends: tuple
    bucket_mb: tuple
    batch: int
    steps: int
    warmup: int
    dtype: str
    weak_scaling: bool
    out: str


@dataclass(frozen=True)
class Combo:
    """One measured configuration (``bucket_mb`` is 0 for syncs that do not bucket)."""

    model: str
    sync: str
    backend: str
    bucket_mb: float


# ----------------------------------------------------------------------------- arguments

def names(valid) -> callable:
    """argparse type: a comma-separated list of distinct names from ``valid``."""
    def convert(text: str) -> tuple:
        items = tuple(t.strip() for t in text.split(","))
        bad = [t for t in items if t not in valid]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown name {bad[0]!r}; valid: {', '.join(valid)}")
        if len(set(items)) != len(items):
            raise argparse.ArgumentTypeError(f"{text!r} names something twice")
        return items
    return convert


def positive_floats(text: str) -> tuple:
    """argparse type: a comma-separated list of distinct numbers > 0."""
    try:
        values = tuple(float(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not all(np.isfinite(v) and v > 0 for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected distinct finite numbers > 0, got {text!r}")
    return values


def int_at_least(low: int) -> callable:
    """argparse type: an int >= ``low``."""
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    return convert


def build_parser(verbose: bool = True) -> argparse.ArgumentParser:
    """The command-line parser; only a ``verbose`` one prints."""
    p = bc.RankParser(prog="ddp.py", verbose=verbose,
                   description="Time the parts of a DDP training step (or weak scaling) for MLPs.")
    p.add_argument("--models", type=names(tuple(MODELS)), default=None,
                   help="comma-separated model sizes (default: tiny,small,medium; weak scaling: small)")
    p.add_argument("--syncs", type=names(SYNCS), default=None,
                   help=f"comma-separated sync strategies (default: all; weak scaling: overlap; "
                        f"valid: {', '.join(SYNCS)})")
    p.add_argument("--backends", type=names(npcomm.BACKENDS), default=None,
                   help=f"comma-separated backends (default: mpi,ring; valid: {', '.join(npcomm.BACKENDS)})")
    p.add_argument("--bucket-mb", type=positive_floats, default=None,
                   help="bucket caps in MiB for bucketed/overlap (default: 1,25; weak scaling: 25)")
    p.add_argument("--batch", type=int_at_least(1), default=64, help="samples per rank per step (default 64)")
    p.add_argument("--steps", type=int_at_least(1), default=5, help="timed steps per combination (default 5)")
    p.add_argument("--warmup", type=int_at_least(0), default=2, help="untimed steps first (default 2)")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--weak-scaling", action="store_true",
                   help="measure throughput on 1, 2, 4, ... ranks and the whole world instead")
    p.add_argument("--out", default="", help="write an HDF5 dump here (rank 0)")
    return p


def parse_config(argv, verbose: bool = True) -> Config:
    """Parse ``argv``; on bad input print (if verbose) and raise SystemExit(2)."""
    a = build_parser(verbose).parse_args(argv)
    mode = 1 if a.weak_scaling else 0
    fill = {key: values[mode] for key, values in DEFAULTS.items()}
    models = a.models or names(tuple(MODELS))(fill["models"])
    syncs = a.syncs or names(SYNCS)(fill["syncs"])
    backends = a.backends or names(npcomm.BACKENDS)(fill["backends"])
    bucket_mb = a.bucket_mb or positive_floats(fill["bucket_mb"])
    return Config(models, syncs, backends, bucket_mb, a.batch, a.steps, a.warmup, a.dtype,
                  bool(a.weak_scaling), a.out)


def combos(cfg: Config) -> list[Combo]:
    """Every model x sync x bucket cap (bucketing syncs only) x backend, in that nesting."""
    out = []
    for model in cfg.models:
        for sync in cfg.syncs:
            for mb in (cfg.bucket_mb if sync in BUCKETED else (0.0,)):
                out += [Combo(model, sync, backend, float(mb)) for backend in cfg.backends]
    return out


def out_dir_ok(path: str) -> bool:
    """True if ``path``'s directory exists and is writable and ``path`` is not a directory."""
    directory = os.path.dirname(os.path.abspath(path))
    return os.path.isdir(directory) and os.access(directory, os.W_OK) and not os.path.isdir(path)


def check_out(path: str, world, verbose: bool) -> None:
    """Exit 2 on every rank if rank 0 cannot write ``path`` (one broadcast, no pickling)."""
    ok = np.array([out_dir_ok(path) if world.Get_rank() == 0 else True], dtype=np.int8)
    world.Bcast(ok, root=0)
    if not ok[0]:
        build_parser(verbose).error(f"--out {path!r}: its directory does not exist or is not writable")


# ----------------------------------------------------------------------------- measuring

class Workload:
    """One model size: the model (built once), its initial weights and this rank's batch."""

    def __init__(self, name: str, batch: int, dtype: str, rank: int):
        self.name = name
        self.model = mlp(IN_FEATURES, MODELS[name], OUT_FEATURES, dtype=np.dtype(dtype).type, seed=0)
        self.initial = [p.data.copy() for p in self.model.parameters()]
        self.params = self.model.num_parameters()
        self.tensors = len(self.initial)
        rng = np.random.default_rng(1000 + rank)
        self.x = rng.standard_normal((batch, IN_FEATURES)).astype(dtype)  # (B, 784)
        self.y = rng.integers(0, OUT_FEATURES, size=batch)                 # (B,)

    def wrap(self, comm, sync: str, bucket_mb: float):
        """A fresh DDP and SGD over the model reset to its initial weights."""
        self.model.clear_grad_hooks()
        for p, w in zip(self.model.parameters(), self.initial):
            np.copyto(p.data, w)
        ddp = DistributedDataParallel(self.model, comm, sync=sync, bucket_cap_mb=bucket_mb or 25.0)
        ddp.zero_grad()
        return ddp, SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)


def train_steps(ddp, opt, x, y, harness, steps: int, warmup: int) -> np.ndarray:
    """``warmup`` untimed steps, then ``steps`` timed ones: this rank's record, (steps, len(FIELDS))."""
    lossfn = CrossEntropyLoss()
    record = np.zeros((steps, len(FIELDS)))  # (steps, fields)
    for i in range(warmup + steps):
        harness.Barrier()
        t0 = time.perf_counter()
        ddp.zero_grad()
        lossfn.forward(ddp(x), y)
        dout = lossfn.backward()
        t1 = time.perf_counter()
        ddp.backward(dout)
        ddp.step(opt)
        t2 = time.perf_counter()
        if i >= warmup:
            s = ddp.stats
            record[i - warmup] = (t2 - t0, t1 - t0, s.backward_s, s.comm_issue_s, s.comm_exposed_s,
                                  s.optimizer_s, s.comm_calls, s.comm_bytes)
    return record


def run_combos(cfg: Config, todo: list[Combo], mpi_comm, announce: bool = False) -> np.ndarray:
    """Measure ``todo`` on ``mpi_comm``: this rank's records, (len(todo), steps, len(FIELDS))."""
    subs = {b: mpi_comm.Dup() for b in dict.fromkeys(c.backend for c in todo)}
    harness = mpi_comm.Dup()
    records = np.zeros((len(todo), cfg.steps, len(FIELDS)))  # (combos, steps, fields)
    try:
        comms = {b: npcomm.create(b, sub) for b, sub in subs.items()}
        work = None
        for i, c in enumerate(todo):
            if work is None or work.name != c.model:
                work = None  # free the previous model before building the next
                work = Workload(c.model, cfg.batch, cfg.dtype, mpi_comm.Get_rank())
                if announce:
                    print(f"# {c.model}: {work.params:,} parameters in {work.tensors} tensors", flush=True)
            ddp, opt = work.wrap(comms[c.backend], c.sync, c.bucket_mb)
            records[i] = train_steps(ddp, opt, work.x, work.y, harness, cfg.steps, cfg.warmup)
            del ddp, opt
    finally:
        harness.Free()
        for sub in subs.values():
            sub.Free()
    return records


def _ms(values) -> float:
    """Median of seconds, in milliseconds."""
    return float(np.median(values)) * 1e3


def breakdown_rows(todo: list[Combo], worst: np.ndarray, mean: np.ndarray, n: int, batch: int) -> list[dict]:
    """One row per combination from the max-over-ranks and mean-over-ranks records (combos, steps, fields)."""
    f = {name: i for i, name in enumerate(FIELDS)}
    rows = []
    for c, mx, mu in zip(todo, worst, mean):
        total = mx[:, f["total_s"]]                                          # (steps,)
        comm = mu[:, f["comm_issue_s"]] + mu[:, f["comm_exposed_s"]]         # (steps,)
        backward = mu[:, f["backward_s"]] - mu[:, f["comm_issue_s"]]         # (steps,)
        compute = mu[:, f["forward_s"]] + backward + mu[:, f["optimizer_s"]]  # (steps,)
        total_ms = _ms(total)
        p10, p90 = np.percentile(total, [10, 90]) * 1e3
        rows.append({
            "model_size": c.model, "params": param_count(c.model), "sync": c.sync, "backend": c.backend,
            "bucket_mb": c.bucket_mb, "world_size": n, "batch": batch,
            "total_time_ms": total_ms, "total_time_ms_min": float(total.min()) * 1e3,
            "total_time_ms_p10": float(p10), "total_time_ms_p90": float(p90),
            "total_time_ms_max": float(total.max()) * 1e3,
            "forward_time_ms": _ms(mu[:, f["forward_s"]]), "backward_time_ms": _ms(backward),
            "optimizer_time_ms": _ms(mu[:, f["optimizer_s"]]),
            "compute_time_ms": _ms(compute), "comm_time_ms": _ms(comm),
            "comm_issue_ms": _ms(mu[:, f["comm_issue_s"]]), "exposed_comm_ms": _ms(mu[:, f["comm_exposed_s"]]),
            "comm_fraction": _ms(comm) / total_ms if total_ms > 0 else 0.0,
            "num_comm_ops": int(mx[:, f["comm_calls"]].max()), "comm_bytes": int(mx[:, f["comm_bytes"]].max()),
            "samples_per_s": n * batch / (total_ms / 1e3),
        })
    return rows


def param_count(model: str) -> int:
    """Trainable parameters of a named model."""
    widths = (IN_FEATURES, *MODELS[model], OUT_FEATURES)
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:]))


def reduce_records(records: np.ndarray, mpi_comm) -> tuple[np.ndarray, np.ndarray]:
    """(max over ranks, mean over ranks) of every rank's records: two all-reduces."""
    worst = records.copy()
    mpi_comm.Allreduce(MPI.IN_PLACE, worst, op=MPI.MAX)
    mean = records.copy()
    mpi_comm.Allreduce(MPI.IN_PLACE, mean, op=MPI.SUM)
    return worst, mean / mpi_comm.Get_size()


def run_breakdown(cfg: Config, world) -> list[dict]:
    """The breakdown sweep on ``world``; every rank returns the rows."""
    todo = combos(cfg)
    records = run_combos(cfg, todo, world, announce=world.Get_rank() == 0)
    worst, mean = reduce_records(records, world)
    return breakdown_rows(todo, worst, mean, world.Get_size(), cfg.batch)


def scaling_sizes(k: int) -> list[int]:
    """1, 2, 4, ... below ``k``, then ``k``."""
    sizes, n = [], 1
    while n < k:
        sizes.append(n)
        n *= 2
    return sizes + [k]


def idle_barrier(mpi_comm, poll_s: float = 1e-3) -> None:
    """A barrier that sleeps between polls, so waiting ranks leave the cores to working ones."""
    request = mpi_comm.Ibarrier()
    while not request.Test():
        time.sleep(poll_s)


def run_weak_scaling(cfg: Config, world) -> list[dict]:
    """Throughput at each n of :func:`scaling_sizes` on the first n ranks; rows on rank 0, [] elsewhere."""
    todo = combos(cfg)
    rank, rows, base = world.Get_rank(), [], {}
    for n in scaling_sizes(world.Get_size()):
        sub = world.Split(0 if rank < n else MPI.UNDEFINED, rank)
        if sub != MPI.COMM_NULL:
            try:
                if rank == 0:
                    print(f"# weak scaling: {n} rank(s)", flush=True)
                worst, _ = reduce_records(run_combos(cfg, todo, sub), sub)
            finally:
                sub.Free()
            for c, mx in zip(todo, worst):
                step = mx[:, FIELDS.index("total_s")]                          # (steps,)
                sps = n * cfg.batch / float(np.median(step))
                base.setdefault(c, sps)  # n = 1 comes first
                p10, p90 = np.percentile(step, [10, 90]) * 1e3
                rows.append({"model_size": c.model, "params": param_count(c.model), "sync": c.sync,
                             "backend": c.backend, "bucket_mb": c.bucket_mb, "world_size": n,
                             "batch": cfg.batch, "step_ms": _ms(step), "step_ms_p10": float(p10),
                             "step_ms_p90": float(p90), "samples_per_s": sps,
                             "efficiency": sps / (n * base[c])})
        idle_barrier(world)
    return rows if rank == 0 else []


# ----------------------------------------------------------------------------- output

BREAKDOWN_TABLE = (  # (column, header, width, format spec)
    ("model_size", "model", 6, ""), ("sync", "sync", 9, ""), ("backend", "backend", 7, ""),
    ("bucket_mb", "MiB", 6, "g"), ("total_time_ms", "step_ms", 8, ".1f"),
    ("total_time_ms_p10", "p10", 7, ".1f"), ("total_time_ms_p90", "p90", 7, ".1f"),
    ("forward_time_ms", "fwd", 6, ".1f"), ("backward_time_ms", "bwd", 6, ".1f"),
    ("comm_time_ms", "comm", 6, ".1f"), ("exposed_comm_ms", "exposed", 7, ".1f"),
    ("optimizer_time_ms", "opt", 5, ".1f"), ("compute_time_ms", "compute", 7, ".1f"),
    ("comm_fraction", "comm%", 6, ".1%"), ("num_comm_ops", "ops", 4, "d"),
    ("comm_bytes", "MB/rank", 7, ".1f"), ("samples_per_s", "samples/s", 9, ".0f"),
)
SCALING_TABLE = (
    ("model_size", "model", 6, ""), ("sync", "sync", 9, ""), ("backend", "backend", 7, ""),
    ("bucket_mb", "MiB", 6, "g"), ("world_size", "N", 3, "d"), ("step_ms", "step_ms", 8, ".1f"),
    ("step_ms_p10", "p10", 7, ".1f"), ("step_ms_p90", "p90", 7, ".1f"),
    ("samples_per_s", "samples/s", 9, ".0f"), ("efficiency", "efficiency", 10, ".2f"),
)


def format_table(rows: list[dict], spec) -> str:
    """Fixed-width table of ``rows`` with the columns of ``spec`` (comm_bytes shown in MB)."""
    lines = [" ".join(head.rjust(width) for _, head, width, _ in spec)]
    for r in rows:
        lines.append(" ".join(format(r[col] / 1e6 if col == "comm_bytes" else r[col], f">{width}{fmt}")
                              for col, _, width, fmt in spec))
    return "\n".join(lines)


def write_rows(group, rows: list[dict]) -> None:
    """One 1-D dataset per column of ``rows``: str as fixed-length UTF-8 bytes, int64, float64."""
    for col in rows[0]:
        values = [r[col] for r in rows]
        if isinstance(values[0], str):
            data = np.array([v.encode("utf-8") for v in values])
        elif isinstance(values[0], (int, np.integer)):
            data = np.array(values, dtype=np.int64)
        else:
            data = np.array(values, dtype=np.float64)
        group.create_dataset(col, data=data)


def write_dump(path: str, kind: str, rows: list[dict], attrs: dict, world_size: int, backends) -> None:
    """Rows and attributes as an HDF5 dump (layout in the module docstring), written atomically."""
    with runinfo.atomic_h5(path) as f:
        runinfo.write_attrs(f, runinfo.environment(world_size=world_size, backend=backends))
        runinfo.write_attrs(f, {"kind": kind, **attrs})
        write_rows(f.create_group("rows"), rows)


def main(argv=None, mpi_comm=None) -> int:
    """Run the breakdown (or weak scaling) on ``mpi_comm`` (default COMM_WORLD); print on rank 0."""
    world = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    argv = sys.argv[1:] if argv is None else list(argv)
    rank, n = world.Get_rank(), world.Get_size()
    cfg = parse_config(argv, verbose=rank == 0)
    set_threads("auto")
    if cfg.out:
        check_out(cfg.out, world, verbose=rank == 0)
    kind = "weak_scaling" if cfg.weak_scaling else "ddp_breakdown"
    if rank == 0:
        print(f"# npddp {kind}: {n} ranks, batch {cfg.batch} per rank, {cfg.dtype}, {cfg.warmup} warm-up + "
              f"{cfg.steps} timed steps per combination, SGD lr {LR} momentum {MOMENTUM}", flush=True)
    if cfg.weak_scaling:
        rows = run_weak_scaling(cfg, world)
    else:
        rows = run_breakdown(cfg, world)
    if rank == 0:
        note = ("step_ms: median over steps of the max over ranks; efficiency: samples/s at N / (N x at 1)"
                if cfg.weak_scaling else
                "step_ms: median over steps of the max over ranks (p10, p90 over steps); parts: medians of "
                "the mean over ranks; comm = issued during backward + exposed after it")
        print(f"# {note}")
        print(format_table(rows, SCALING_TABLE if cfg.weak_scaling else BREAKDOWN_TABLE))
        if cfg.out:
            attrs = {"argv": json.dumps(argv), "config": asdict(cfg),
                     "models": json.dumps({m: list(MODELS[m]) for m in cfg.models}),
                     "in_features": IN_FEATURES, "out_features": OUT_FEATURES, "lr": LR, "momentum": MOMENTUM}
            write_dump(cfg.out, kind, rows, attrs, n, cfg.backends)
            print(f"# wrote {cfg.out}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    abort_on_exception()
    sys.exit(main())
