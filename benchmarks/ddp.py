"""Where a DDP training step spends its time, and how throughput scales with the rank count.

    mpirun -n 2 python benchmarks/ddp.py --no-comm                 # defaults: about a minute on 2 cores
    mpirun -n 2 python -m benchmarks.ddp --models small --syncs flat,overlap --backends ring --out ddp.h5
    mpirun -n 2 python -m benchmarks.ddp --models small --syncs overlap --backends mpi,ring --transports mpi,tcp
    mpirun -n 4 python benchmarks/ddp.py --weak-scaling --no-comm --out scaling.h5
    python benchmarks/report.py ddp.h5 scaling.h5                 # tables and plots from the dumps

Models (benchmarks/_common.py): MLPs on 784 inputs, 10 outputs, ReLU between layers, float32
by default: ``tiny`` 784-1024-256-10 (1,068,810 parameters, 6 tensors), ``small``
784-1024x5-10 (5,012,490, 12 tensors), ``medium`` 784-2048x5-10 (18,413,578, 12 tensors),
trained with SGD (lr 0.01, momentum 0.9) and cross-entropy on one random batch per rank
(``--batch`` rows, random labels) reused every step. BLAS threads per rank: npddp.util.threads'
auto rule (the CPUs a rank may use / the ranks on its node; 1 for 2 ranks on 2 cores).

Breakdown (default): every model x sync x backend, and for ``bucketed`` and ``overlap`` every
``--bucket-mb`` (``per_param`` and ``flat`` run once, ``bucket_mb`` 0). ``--no-comm`` adds
backend ``none`` to each: the same DDP step (buckets, hooks, averaging) with every all-reduce
skipped, the no-comm ceiling; every row's ``ddp_efficiency`` is then step(none) / step(its
backend). ``--bare`` adds backend ``bare``: the same MLP step written in bare NumPy
(benchmarks/_bare.py: no modules, hooks, buckets, averaging or communication), the true
ceiling; every row's ``bare_efficiency`` is then step(bare) / step(its backend). Each combination trains its own copy of the model from the same weights: ``--warmup``
untimed steps, then ``--steps`` timed ones, each a barrier (not timed), ``zero_grad``, forward,
loss, ``ddp.backward``, ``ddp.step``. The backends of one model, sync and cap take turns: the
timed steps come in ``--rounds`` rounds (default 5), each running a share of every backend's
steps in turn, so a change in the machine's speed during the sweep hits them alike. After the
sweep one all-reduce gives per step the max over ranks of the step time (a step is as slow as
its slowest rank) and the mean over ranks of each part; rows report medians over the timed steps.

Weak scaling (``--weak-scaling``; defaults ``--models small --syncs overlap --bucket-mb 25``):
the same local batch on n = 1, 2, 4, ... ranks and the whole world (the first n ranks form a
sub-communicator; the others wait in a barrier that sleeps between polls), the whole sweep
``--repeats`` times. Efficiency at n = samples/s / (n x the one-rank samples/s), the latter
the median over all backends' one-rank runs of the same combination and repeat (on one rank
they do the same work, so one shared reference keeps noise out of the comparison).

Trace (``--trace FILE.json``, ``--trace-steps FIRST:LAST``, docs/guide/traces.md): the timeline of
the first combination's steps (warm-up included, counted from 1) on every rank.

Output: a table (rank 0); ``--out`` the dump (kinds ``ddp_breakdown``, ``weak_scaling``;
columns in npddp/columns.py; read with ``benchmarks.results.read_table``); ``--csv`` the same rows.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder, so `benchmarks` imports as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import json  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from npddp import comm as npcomm  # noqa: E402
from benchmarks import results  # noqa: E402
from benchmarks.columns import BARE, NO_COMM  # noqa: E402
from benchmarks._bare import BareMLP  # noqa: E402
from npddp.parallel.ddp import BUCKET_CAP_MB, SYNCS, DistributedDataParallel  # noqa: E402
from npddp.process.job import abort_on_exception  # noqa: E402
from npddp.util.threads import set_threads  # noqa: E402
from npddp.nn import CrossEntropyLoss, mlp  # noqa: E402
from npddp.optim import SGD  # noqa: E402
from npddp.util import tracing  # noqa: E402

from benchmarks import _common as bc

DTYPES = ("float32", "float64")
BUCKETED = ("bucketed", "overlap")
# one record per timed step and rank
FIELDS = ("total_s", "forward_s", "backward_s", "comm_issue_s", "comm_exposed_s", "optimizer_s",
          "comm_calls", "comm_bytes")
DEFAULT_ROUNDS = 5
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
    no_comm: bool = False
    repeats: int = 1
    csv: str = ""
    transports: tuple = (bc.DEFAULT_TRANSPORT,)
    progress: str = "caller"
    rounds: int = 1
    trace: str = ""
    trace_steps: str = tracing.DEFAULT_STEPS
    bare: bool = False


@dataclass(frozen=True)
class Combo:
    """One measured configuration (``bucket_mb`` is 0 for syncs that do not bucket)."""

    model: str
    sync: str
    backend: str
    bucket_mb: float
    transport: str = bc.DEFAULT_TRANSPORT


# ----------------------------------------------------------------------------- arguments

def build_parser(verbose: bool = True):
    """The command-line parser; only a ``verbose`` one prints."""
    p = bc.RankParser(prog="ddp.py", verbose=verbose,
                      description="Time the parts of a DDP training step (or weak scaling) for MLPs.")
    p.add_argument("--models", type=bc.names(tuple(bc.MODELS)), default=None,
                   help="comma-separated model sizes (default: tiny,small,medium; weak scaling: small)")
    p.add_argument("--syncs", type=bc.names(SYNCS), default=None,
                   help=f"comma-separated sync strategies (default: all; weak scaling: overlap; "
                        f"valid: {', '.join(SYNCS)})")
    p.add_argument("--plugin", type=bc.plugin, action="append", default=[], metavar="MODULE", help=bc.PLUGIN_HELP)
    p.add_argument("--backends", type=bc.names(npcomm.backend_names()), default=None,
                   help=f"comma-separated backends (default: mpi,ring; valid: {', '.join(npcomm.backend_names())})")
    p.add_argument("--transports", type=bc.names(npcomm.TRANSPORTS), default=(bc.DEFAULT_TRANSPORT,),
                   help="comma-separated transports of the hand-written backends: mpi, tcp (default: mpi; "
                        "tcp builds a socket mesh among the job's ranks; backend mpi runs over mpi only)")
    p.add_argument("--progress", choices=npcomm.PROGRESS, default="caller",
                   help="who drives outstanding all-reduces of the hand-written backends: the caller "
                        "(default) or a background thread per communicator (create(..., progress='thread'))")
    p.add_argument("--no-comm", action="store_true",
                   help="also run every combination with all-reduces skipped (backend 'none': the ceiling)")
    p.add_argument("--bare", action="store_true",
                   help="also run the same MLP step written in bare NumPy (backend 'bare': the ceiling with no "
                        "DDP at all); bare_efficiency = step(bare) / step")
    p.add_argument("--bucket-mb", type=bc.positive_floats, default=None,
                   help="bucket caps in MiB for bucketed/overlap (default: 1,25; weak scaling: 25)")
    p.add_argument("--batch", type=bc.int_at_least(1), default=64, help="samples per rank per step (default 64)")
    p.add_argument("--steps", type=bc.int_at_least(1), default=5, help="timed steps per combination (default 5)")
    p.add_argument("--warmup", type=bc.int_at_least(0), default=2, help="untimed steps first (default 2)")
    p.add_argument("--rounds", type=bc.int_at_least(1), default=None,
                   help="take each combination's timed steps in this many rounds, the backends of one model, "
                        "sync and cap taking turns, so drift in the machine's speed hits them alike "
                        f"(default: {DEFAULT_ROUNDS}, or --steps if fewer)")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--weak-scaling", action="store_true",
                   help="measure throughput on 1, 2, 4, ... ranks and the whole world instead")
    p.add_argument("--repeats", type=bc.int_at_least(1), default=None,
                   help="weak scaling: repetitions of the whole sweep, for error bars (default 3)")
    p.add_argument("--out", default="", help="write the HDF5 dump here (rank 0)")
    p.add_argument("--csv", default="", help="write the dump's rows as CSV here (rank 0)")
    p.add_argument("--trace", default="", metavar="FILE.json",
                   help="timeline of the first combination's --trace-steps steps (docs/guide/traces.md)")
    p.add_argument("--trace-steps", type=tracing.steps_text, default=tracing.DEFAULT_STEPS, metavar="FIRST:LAST",
                   help=f"steps --trace records, from 1, warm-up included (default {tracing.DEFAULT_STEPS})")
    return p


def parse_config(argv, verbose: bool = True) -> Config:
    """Parse ``argv``; on bad input print (if verbose) and raise SystemExit(2)."""
    bc.load_plugins(argv)
    parser = build_parser(verbose)
    a = parser.parse_args(argv)
    if a.repeats is not None and not a.weak_scaling:
        parser.error("--repeats applies to --weak-scaling only")
    mode = 1 if a.weak_scaling else 0
    fill = {key: values[mode] for key, values in DEFAULTS.items()}
    models = a.models or bc.names(tuple(bc.MODELS))(fill["models"])
    syncs = a.syncs or bc.names(SYNCS)(fill["syncs"])
    backends = a.backends or bc.names(npcomm.BACKENDS)(fill["backends"])
    bucket_mb = a.bucket_mb or bc.positive_floats(fill["bucket_mb"])
    repeats = a.repeats or (3 if a.weak_scaling else 1)
    if a.rounds is not None and a.rounds > a.steps:
        parser.error(f"--rounds {a.rounds} exceeds --steps {a.steps}; valid: 1 to {a.steps}")
    rounds = a.rounds or min(DEFAULT_ROUNDS, a.steps)
    if a.bare and a.weak_scaling:
        parser.error("--bare applies to the breakdown only, not --weak-scaling")
    return Config(models, syncs, backends, bucket_mb, a.batch, a.steps, a.warmup, a.dtype,
                  bool(a.weak_scaling), a.out, bool(a.no_comm), repeats, a.csv, a.transports, a.progress, rounds,
                  a.trace, a.trace_steps, bool(a.bare))


def combos(cfg: Config) -> list[Combo]:
    """Every model x sync x bucket cap (bucketing syncs only) x backend x transport (then 'none'), in that nesting.

    Backend ``mpi`` (MPI's own collectives) runs over transport mpi only.
    """
    pairs = [(b, t) for b in cfg.backends for t in cfg.transports if b != "mpi" or t == "mpi"]
    pairs += [("mpi", "mpi")] if "mpi" in cfg.backends and "mpi" not in cfg.transports else []
    pairs += [(NO_COMM, NO_COMM)] if cfg.no_comm else []
    pairs += [(BARE, NO_COMM)] if cfg.bare else []
    out = []
    for model in cfg.models:
        for sync in cfg.syncs:
            for mb in (cfg.bucket_mb if sync in BUCKETED else (0.0,)):
                out += [Combo(model, sync, backend, float(mb), transport) for backend, transport in pairs]
    return out


# ----------------------------------------------------------------------------- measuring

class Workload:
    """One model size: its builder and this rank's batch."""

    def __init__(self, name: str, batch: int, dtype: str, rank: int):
        self.name, self.dtype = name, np.dtype(dtype).type
        self.params = bc.param_count(name)
        self.tensors = 2 * (len(bc.widths(name)) - 1)  # a weight and a bias per layer
        rng = np.random.default_rng(1000 + rank)
        self.x = rng.standard_normal((batch, bc.IN_FEATURES)).astype(dtype)  # (B, 784)
        self.y = rng.integers(0, bc.OUT_FEATURES, size=batch)                 # (B,)

    def build(self):
        """The model with its initial weights (the same on every call and every rank)."""
        return mlp(bc.IN_FEATURES, bc.MODELS[self.name], bc.OUT_FEATURES, dtype=self.dtype, seed=0)

    def wrap(self, comm, sync: str, bucket_mb: float, tracer=tracing.NULL):
        """A fresh model in a fresh DDP, and SGD over it."""
        ddp = DistributedDataParallel(self.build(), comm, sync=sync, bucket_cap_mb=bucket_mb or BUCKET_CAP_MB,
                                      tracer=tracer)
        ddp.zero_grad()
        return ddp, SGD(ddp.parameters(), lr=bc.LR, momentum=bc.MOMENTUM)


def round_steps(steps: int, rounds: int) -> list[tuple[int, int]]:
    """``(first step, count)`` of each round: ``steps`` split as evenly as ``rounds`` allows."""
    counts = [steps // rounds + (r < steps % rounds) for r in range(rounds)]
    return [(sum(counts[:r]), counts[r]) for r in range(rounds)]


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


def bare_steps(bare: BareMLP, x, y, harness, steps: int, warmup: int) -> np.ndarray:
    """:func:`train_steps` for the bare-NumPy step: the same record, communication fields 0."""
    record = np.zeros((steps, len(FIELDS)))  # (steps, fields)
    for i in range(warmup + steps):
        harness.Barrier()
        t0 = time.perf_counter()
        forward, backward, optimizer = bare.step(x, y)
        total = time.perf_counter() - t0
        if i >= warmup:
            record[i - warmup, :len(FIELDS) - 2] = (total, forward, backward, 0.0, 0.0, optimizer)
    return record


def communicators(subs: dict, world=None, progress: str = "caller") -> dict:
    """(backend, transport) -> communicator over its own duplicate ``subs[pair]``; 'none' skips all-reduces.

    Over tcp each gets its own message context in ``world`` (a TCP mesh among the same ranks).
    """
    return {(b, t): bc.NoComm(npcomm.create("mpi", sub)) if b == NO_COMM else
            bc.create_comm(b, sub, t, world, progress=progress if b != "mpi" else "caller")
            for (b, t), sub in subs.items()}


def run_combos(cfg: Config, todo: list[Combo], mpi_comm, announce: bool = False) -> np.ndarray:
    """Measure ``todo`` on ``mpi_comm``: this rank's records, (len(todo), steps, len(FIELDS))."""
    subs = {pair: mpi_comm.Dup() for pair in dict.fromkeys((c.backend, c.transport) for c in todo if c.backend != BARE)}
    harness = mpi_comm.Dup()
    records = np.zeros((len(todo), cfg.steps, len(FIELDS)))  # (combos, steps, fields)
    world = None
    tracer = tracing.NULL
    started = time.perf_counter()
    try:
        world = bc.tcp_world(harness) if any(c.transport == "tcp" for c in todo) else None
        comms = communicators(subs, world, cfg.progress)
        if cfg.trace:  # the first combination's DDP records its steps
            tracer = tracing.Tracer(cfg.trace, comms[todo[0].backend, todo[0].transport], cfg.trace_steps,
                                    meta={"combination": asdict(todo[0]), "argv": sys.argv[1:]})
        work = None
        groups = dict.fromkeys((c.model, c.sync, c.bucket_mb) for c in todo)  # backends take turns within each
        for model, sync, mb in groups:
            if work is None or work.name != model:
                work = None  # free the previous model before building the next
                work = Workload(model, cfg.batch, cfg.dtype, mpi_comm.Get_rank())
                if announce:
                    print(f"# {model}: {work.params:,} parameters in {work.tensors} tensors", flush=True)
            turns = [i for i, c in enumerate(todo) if (c.model, c.sync, c.bucket_mb) == (model, sync, mb)]
            runs = {i: BareMLP(work.build(), cfg.batch, bc.LR, bc.MOMENTUM) if todo[i].backend == BARE else
                    work.wrap(comms[todo[i].backend, todo[i].transport], sync, mb, tracer if i == 0 else tracing.NULL)
                    for i in turns}
            for r, (first, count) in enumerate(round_steps(cfg.steps, cfg.rounds)):
                for i in turns:
                    warm = cfg.warmup if r == 0 else 0
                    if todo[i].backend == BARE:
                        records[i, first:first + count] = bare_steps(runs[i], work.x, work.y, harness, count, warm)
                        continue
                    ddp, opt = runs[i]
                    records[i, first:first + count] = train_steps(ddp, opt, work.x, work.y, harness, count, warm)
            del runs
            if announce:   # a sweep takes minutes: say where it is after every setting
                done = list(groups).index((model, sync, mb)) + 1
                print(f"# measured {model} {sync}" + (f" {mb:g} MiB" if sync in BUCKETED else "")
                      + f" ({len(turns)} backend{'s' * (len(turns) != 1)}): {done}/{len(groups)} settings, "
                      f"{time.perf_counter() - started:.0f} s", flush=True)
        tracer.close()
    finally:
        if world is not None:
            world.close()
        harness.Free()
        for sub in subs.values():
            sub.Free()
    return records


def _ms(values) -> float:
    """Median of seconds, in milliseconds."""
    return float(np.median(values)) * 1e3


def _labels(c: Combo, n: int, batch: int, steps: int) -> dict:
    """The columns that name a combination."""
    return {"model": c.model, "params": bc.param_count(c.model), "sync": c.sync, "backend": c.backend,
            "transport": NO_COMM if c.backend == NO_COMM else c.transport, "bucket_mb": c.bucket_mb,
            "world_size": n, "batch": batch, "steps": steps}


def breakdown_rows(todo: list[Combo], worst: np.ndarray, mean: np.ndarray, n: int, batch: int) -> list[dict]:
    """One row per combination from the max-over-ranks and mean-over-ranks records (combos, steps, fields)."""
    f = {name: i for i, name in enumerate(FIELDS)}
    rows = []
    for c, mx, mu in zip(todo, worst, mean):
        total = mx[:, f["total_s"]]                                          # (steps,)
        comm = mu[:, f["comm_issue_s"]] + mu[:, f["comm_exposed_s"]]         # (steps,)
        backward = mu[:, f["backward_s"]] - mu[:, f["comm_issue_s"]]         # (steps,)
        compute = mu[:, f["forward_s"]] + backward + mu[:, f["optimizer_s"]]  # (steps,)
        step_min, p10, step, p90, step_max = np.percentile(total, [0, 10, 50, 90, 100]) * 1e3
        silent = c.backend in (NO_COMM, BARE)  # its calls were skipped (or there are none): it moves nothing
        rows.append({
            **_labels(c, n, batch, total.size),
            "step_ms": float(step), "step_ms_min": float(step_min), "step_ms_p10": float(p10),
            "step_ms_p90": float(p90), "step_ms_max": float(step_max),
            "forward_ms": _ms(mu[:, f["forward_s"]]), "backward_ms": _ms(backward),
            "comm_issued_ms": _ms(mu[:, f["comm_issue_s"]]), "comm_exposed_ms": _ms(mu[:, f["comm_exposed_s"]]),
            "optimizer_ms": _ms(mu[:, f["optimizer_s"]]), "compute_ms": _ms(compute), "comm_ms": _ms(comm),
            "comm_fraction": _ms(comm) / float(step),
            "num_comm_ops": 0 if silent else int(mx[:, f["comm_calls"]].max()),
            "comm_bytes": 0 if silent else int(mx[:, f["comm_bytes"]].max()),
            "samples_per_s": n * batch / (float(step) / 1e3), "ddp_efficiency": float("nan"),
            "bare_efficiency": float("nan"),
        })
    add_ddp_efficiency(rows, ceiling_backend=BARE, column="bare_efficiency")
    return add_ddp_efficiency(rows)


def add_ddp_efficiency(rows: list[dict], keys=("model", "sync", "bucket_mb", "world_size"),
                       ceiling_backend: str = NO_COMM, column: str = "ddp_efficiency") -> list[dict]:
    """Set each row's ``column`` = step_ms of the ``ceiling_backend`` row with the same ``keys`` (+ repeat) / step_ms."""
    keys = keys + (("repeat",) if rows and "repeat" in rows[0] else ())
    ceiling = {tuple(r[k] for k in keys): r["step_ms"] for r in rows if r["backend"] == ceiling_backend}
    for r in rows:
        base = ceiling.get(tuple(r[k] for k in keys))
        r[column] = base / r["step_ms"] if base is not None else float("nan")
    return rows


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


def scaling_rows(todo: list[Combo], n: int, repeat: int, worst: np.ndarray, cfg: Config) -> list[dict]:
    """Rows of one world size and repeat (efficiency filled in by :func:`add_efficiency`)."""
    rows = []
    for c, mx in zip(todo, worst):
        step = mx[:, FIELDS.index("total_s")]                                  # (steps,)
        p10, median, p90 = np.percentile(step, [10, 50, 90]) * 1e3
        rows.append({**_labels(c, n, cfg.batch, step.size), "repeat": repeat, "step_ms": float(median),
                     "step_ms_p10": float(p10), "step_ms_p90": float(p90),
                     "samples_per_s": n * cfg.batch / (float(median) / 1e3), "efficiency": float("nan"),
                     "ddp_efficiency": float("nan")})
    return rows


def add_efficiency(rows: list[dict]) -> list[dict]:
    """efficiency = samples/s / (n x median one-rank samples/s over backends of the same combination and repeat)."""
    key = ("model", "sync", "bucket_mb", "repeat")
    ones: dict = {}
    for r in rows:
        if r["world_size"] == 1:
            ones.setdefault(tuple(r[k] for k in key), []).append(r["samples_per_s"])
    for r in rows:
        r["efficiency"] = r["samples_per_s"] / (r["world_size"] * float(np.median(ones[tuple(r[k] for k in key)])))
    return add_ddp_efficiency(rows)


def run_weak_scaling(cfg: Config, world) -> list[dict]:
    """Throughput at each n of :func:`scaling_sizes` on the first n ranks, ``cfg.repeats`` times; rows on rank 0."""
    todo = combos(cfg)
    rank, rows = world.Get_rank(), []
    for repeat in range(cfg.repeats):
        for n in scaling_sizes(world.Get_size()):
            sub = world.Split(0 if rank < n else MPI.UNDEFINED, rank)
            if sub != MPI.COMM_NULL:
                try:
                    if rank == 0:
                        print(f"# weak scaling: repeat {repeat + 1} of {cfg.repeats}, {n} rank(s)", flush=True)
                    worst, _ = reduce_records(run_combos(cfg, todo, sub), sub)
                finally:
                    sub.Free()
                rows += scaling_rows(todo, n, repeat, worst, cfg)
            idle_barrier(world)
    return add_efficiency(rows) if rank == 0 else []


# ----------------------------------------------------------------------------- output

BREAKDOWN_TABLE = (  # (column, header, width, format spec)
    ("model", "model", 6, ""), ("sync", "sync", 9, ""), ("backend", "backend", 8, ""),
    ("bucket_mb", "MiB", 4, "g"), ("step_ms", "step_ms", 8, ".1f"),
    ("step_ms_p10", "p10", 7, ".1f"), ("step_ms_p90", "p90", 7, ".1f"),
    ("forward_ms", "fwd", 6, ".1f"), ("backward_ms", "bwd", 6, ".1f"), ("comm_issued_ms", "issued", 6, ".1f"),
    ("comm_exposed_ms", "exposed", 7, ".1f"), ("optimizer_ms", "opt", 5, ".1f"),
    ("comm_fraction", "comm%", 6, ".1%"), ("num_comm_ops", "ops", 4, "d"),
    ("samples_per_s", "samples/s", 9, ".0f"), ("ddp_efficiency", "ddp_eff", 7, ".3f"),
    ("bare_efficiency", "bare_eff", 8, ".3f"),
)
SCALING_TABLE = (
    ("model", "model", 6, ""), ("sync", "sync", 9, ""), ("backend", "backend", 8, ""),
    ("bucket_mb", "MiB", 4, "g"), ("world_size", "N", 3, "d"), ("repeat", "rep", 3, "d"),
    ("step_ms", "step_ms", 8, ".1f"), ("step_ms_p10", "p10", 7, ".1f"), ("step_ms_p90", "p90", 7, ".1f"),
    ("samples_per_s", "samples/s", 9, ".0f"), ("efficiency", "efficiency", 10, ".3f"),
    ("ddp_efficiency", "ddp_eff", 7, ".3f"),
)


def main(argv=None, mpi_comm=None) -> int:
    """Run the breakdown (or weak scaling) on ``mpi_comm`` (default COMM_WORLD); print on rank 0."""
    world = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    argv = sys.argv[1:] if argv is None else list(argv)
    rank, n = world.Get_rank(), world.Get_size()
    cfg = parse_config(argv, verbose=rank == 0)
    set_threads("auto")
    bc.check_out({"--out": cfg.out, "--csv": cfg.csv}, world, build_parser(rank == 0))
    kind = "weak_scaling" if cfg.weak_scaling else "ddp_breakdown"
    if rank == 0:
        print(f"# npddp {kind}: {n} ranks, batch {cfg.batch} per rank, {cfg.dtype}, {cfg.warmup} warm-up + "
              f"{cfg.steps} timed steps per combination, SGD lr {bc.LR} momentum {bc.MOMENTUM}"
              + (", hand-written backends progressed by a thread" if cfg.progress == "thread" else ""), flush=True)
    rows = run_weak_scaling(cfg, world) if cfg.weak_scaling else run_breakdown(cfg, world)
    if rank == 0:
        note = ("step_ms: median over steps of the max over ranks; efficiency: samples/s at N / (N x one-rank "
                "samples/s); ddp_eff: step(none) / step" if cfg.weak_scaling else
                "step_ms: median over steps of the max over ranks (p10, p90 over steps); parts: medians of the "
                "mean over ranks; issued: comm calls inside backward; exposed: waiting after it; "
                "ddp_eff: step(none) / step; bare_eff: step(bare NumPy) / step")
        print(f"# {note}")
        shown = [{**r, "backend": f"{r['backend']}/tcp"} if r["transport"] == "tcp" else r for r in rows]
        print(bc.format_table(shown, SCALING_TABLE if cfg.weak_scaling else BREAKDOWN_TABLE))
        if cfg.out:
            attrs = {"argv": json.dumps(argv), "config": asdict(cfg),
                     "models": json.dumps({m: list(bc.widths(m)) for m in cfg.models}),
                     "in_features": bc.IN_FEATURES, "out_features": bc.OUT_FEATURES, "lr": bc.LR,
                     "momentum": bc.MOMENTUM}
            results.write_dump(cfg.out, kind, rows, world_size=n, backends=cfg.backends, attrs=attrs)
            print(f"# wrote {cfg.out} (--out)")
        if cfg.csv:
            results.write_csv(cfg.csv, kind, rows)
            print(f"# wrote {cfg.csv} (--csv)")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    abort_on_exception()
    sys.exit(main())
