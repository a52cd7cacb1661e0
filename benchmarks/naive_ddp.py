"""The DDP coursework benchmark: a GPT language model trained with per-parameter all-reduce.

    mpirun -n 2 python benchmarks/naive_ddp.py                          # small, per_param, 5 steps
    mpirun -n 2 python benchmarks/naive_ddp.py --model-size small,medium --sync per_param,bucketed,overlap \
        --num-steps 3 --num-warmup 1 --csv naive.csv --out naive.h5

Every rank builds the same GPT preset (``--model-size``; ``--context-length`` 256,
``--vocab-size`` 10000, tied LM head, float32) and trains it with AdamW (lr 1e-4) and
cross-entropy on windows of the synthetic Markov-chain token set: ``--batch-size`` is the
global batch (sequences per step), split evenly over the ranks. Gradients are averaged by
:class:`npddp.parallel.ddp.DistributedDataParallel` with sync ``per_param`` (one blocking all-reduce
per parameter tensor after backward: the naive baseline), or each of ``--sync`` in turn
(``bucketed`` and ``overlap`` with ``--bucket-mb`` buckets) on the backend ``--backend``.
BLAS runs one thread per rank unless OMP/OPENBLAS/MKL_NUM_THREADS are set.

Memory: a preset whose estimated footprint (parameters, gradients, AdamW's two moments and
the activations of one step, per rank, times the ranks on this node) exceeds 85% of the
available memory is replaced by the largest smaller preset that fits, and a line says so
(``# medium needs ~... : running small instead``); the ``model_size`` column shows what ran,
``requested_size`` what was asked.

Per step (after ``--num-warmup`` untimed ones, ``--num-steps`` timed ones, each started by a
barrier): ``total_time_ms`` zero_grad + forward + loss + backward + optimizer (max over ranks),
``comm_time_ms`` time in all-reduce calls (issued during backward, plus waited for after it),
``compute_time_ms`` the rest of the step (both averaged over ranks, so they add up to the mean
step, at most ``total_time_ms``), ``comm_fraction`` = comm / total, ``num_comm_ops`` all-reduce
calls per step; ``cpu_time_ms`` the CPU time of a rank's process during the step (mean over
ranks; far below ``total_time_ms`` when other processes share the cores). Reported: medians
over the timed steps.

``--csv PATH`` writes exactly the columns ``model_size, d_model, num_layers, total_time_ms,
compute_time_ms, comm_time_ms, comm_fraction, num_comm_ops`` (one row per model size); with
several ``--sync`` values, one file per sync named ``PATH`` with ``.<sync>`` before the
suffix. ``--out PATH.h5`` writes every column (sync, backend, parameters, tokens/s, ...) as a
``naive_ddp`` benchmark dump (rank 0, atomically; the columns are declared in
:mod:`benchmarks.columns`, read it back with ``benchmarks.results.read_table``); root attributes argv,
config, memory_notes (the auto-fit messages) and the run environment.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder, so `benchmarks` imports as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one BLAS thread per rank unless the caller chose otherwise

import argparse  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from npddp import comm as npcomm  # noqa: E402
from benchmarks import results  # noqa: E402
from npddp.data import synthetic_tokens  # noqa: E402
from npddp.parallel.ddp import BUCKET_CAP_MB, SYNCS, DistributedDataParallel  # noqa: E402
from npddp.process.job import abort_on_exception  # noqa: E402
from npddp.nn import PRESETS, CrossEntropyLoss, gpt_num_parameters, gpt_preset  # noqa: E402
from npddp.optim import SGD, AdamW  # noqa: E402

from benchmarks import _common as bc

CSV_COLUMNS = ("model_size", "d_model", "num_layers", "total_time_ms", "compute_time_ms", "comm_time_ms",
               "comm_fraction", "num_comm_ops")
SIZES = tuple(name for name in PRESETS if name != "tiny")        # smallest first
FIELDS = ("total_s", "comm_s", "comm_calls", "cpu_s")
MEMORY_SHARE = 0.85
LR = 1e-4


@dataclass(frozen=True)
class Config:
    """Resolved command-line options."""

    model_sizes: tuple
    syncs: tuple
    backend: str
    bucket_mb: float
    context_length: int
    vocab_size: int
    batch_size: int
    num_steps: int
    num_warmup: int
    dtype: str
    optimizer: str
    csv: str
    out: str


def build_parser(verbose: bool = True) -> argparse.ArgumentParser:
    """The command-line parser; only a ``verbose`` one prints."""
    p = bc.RankParser(prog="naive_ddp.py", verbose=verbose, description=__doc__.split("\n\n")[0],
                      epilog="Sizes: " + ", ".join(f"{k} (d_model {v[0]}, d_ff {v[1]}, {v[2]} layers, "
                                                    f"{v[3]} heads)" for k, v in PRESETS.items()))
    sizes = tuple(PRESETS)
    p.add_argument("--model-size", type=bc.names(sizes), default=("small",),
                   help=f"comma-separated GPT sizes (default small; valid: {', '.join(sizes)})")
    p.add_argument("--sync", type=bc.names(SYNCS), default=("per_param",),
                   help=f"comma-separated sync strategies (default per_param; valid: {', '.join(SYNCS)})")
    p.add_argument("--backend", choices=npcomm.BACKENDS, default="mpi", help="all-reduce backend (default mpi)")
    p.add_argument("--bucket-mb", type=float, default=BUCKET_CAP_MB,
                   help=f"bucket cap for bucketed/overlap (default {BUCKET_CAP_MB:g})")
    p.add_argument("--context-length", type=bc.int_at_least(1), default=256, help="tokens per sequence (default 256)")
    p.add_argument("--vocab-size", type=bc.int_at_least(2), default=10000, help="vocabulary (default 10000)")
    p.add_argument("--batch-size", type=bc.int_at_least(1), default=4,
                   help="GLOBAL sequences per step, split over the ranks (default 4)")
    p.add_argument("--num-steps", type=bc.int_at_least(1), default=5, help="timed steps (default 5)")
    p.add_argument("--num-warmup", type=bc.int_at_least(0), default=2, help="untimed steps first (default 2)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw",
                   help="adamw (default) or plain sgd, which holds no optimizer state")
    p.add_argument("--csv", default="", help="write the coursework table here (rank 0)")
    p.add_argument("--out", default="", help="write every column as HDF5 here (rank 0)")
    return p


def parse_config(argv, world_size: int, verbose: bool = True) -> Config:
    """Parse and check ``argv`` for ``world_size`` ranks; SystemExit(2) with a message on bad input."""
    parser = build_parser(verbose)
    a = parser.parse_args(argv)
    if a.batch_size % world_size:
        parser.error(f"--batch-size {a.batch_size} does not split over {world_size} ranks: use a multiple "
                     f"of {world_size}")
    if not (np.isfinite(a.bucket_mb) and a.bucket_mb > 0):
        parser.error(f"--bucket-mb must be a number > 0, got {a.bucket_mb}")
    return Config(a.model_size, a.sync, a.backend, a.bucket_mb, a.context_length, a.vocab_size, a.batch_size,
                  a.num_steps, a.num_warmup, a.dtype, a.optimizer, a.csv, a.out)


# ----------------------------------------------------------------------------- memory

def footprint(size: str, cfg: Config, world_size: int) -> int:
    """Estimated bytes one rank needs to train preset ``size``: state plus one step's activations."""
    d, d_ff, layers, heads = PRESETS[size]
    params = gpt_num_parameters(cfg.vocab_size, cfg.context_length, d, layers, heads, d_ff)
    item = np.dtype(cfg.dtype).itemsize
    copies = 2 + (2 if cfg.optimizer == "adamw" else 0)            # values, gradients, AdamW moments
    tokens = cfg.batch_size // world_size * cfg.context_length
    per_token = layers * (8 * d + 3 * d_ff + heads * cfg.context_length) + 3 * cfg.vocab_size
    return params * copies * item + tokens * per_token * item


def available_memory() -> int:
    """Bytes of memory available to new allocations on this node (MemAvailable on Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def fit_size(requested: str, cfg: Config, world_size: int, ranks_here: int, available: int):
    """(size to run, message or None): ``requested`` if it fits, else the largest smaller preset that does."""
    budget = MEMORY_SHARE * available / ranks_here
    need = footprint(requested, cfg, world_size)
    if need <= budget:
        return requested, None
    order = list(PRESETS)
    smaller = [s for s in order[:order.index(requested)] if footprint(s, cfg, world_size) <= budget]
    gib = 2.0 ** 30
    head = (f"{requested} needs ~{need / gib:.1f} GiB per rank x {ranks_here} rank(s) on this node, "
            f"{available / gib:.1f} GiB available (using {MEMORY_SHARE:.0%})")
    if not smaller:
        return None, head + ": no preset fits; lower --batch-size or --context-length, or add memory"
    return smaller[-1], head + f": running {smaller[-1]} instead"


def choose_sizes(cfg: Config, world) -> tuple[list, list]:
    """(sizes to run, one per request, None where none fits; messages), decided on rank 0 and broadcast."""
    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    ranks_here = local.Get_size()
    local.Free()
    order = list(PRESETS)
    choice = np.full(len(cfg.model_sizes), -1, dtype=np.int64)
    notes = []
    if world.Get_rank() == 0:
        free = available_memory()
        for i, size in enumerate(cfg.model_sizes):
            chosen, note = fit_size(size, cfg, world.Get_size(), ranks_here, free)
            choice[i] = -1 if chosen is None else order.index(chosen)
            notes.append(note)
    world.Bcast(choice, root=0)
    return [None if c < 0 else order[c] for c in choice], notes


# ----------------------------------------------------------------------------- measuring

def measure(size: str, cfg: Config, comm, harness) -> dict:
    """Train preset ``size`` once per sync; {sync: this rank's record (steps, len(FIELDS))}."""
    rank, n = comm.rank, comm.size
    dtype = np.dtype(cfg.dtype)
    model = gpt_preset(size, cfg.vocab_size, cfg.context_length, dtype=dtype, seed=0)
    steps = cfg.num_warmup + cfg.num_steps
    data = synthetic_tokens(n_train=cfg.batch_size * steps, n_val=0, context_length=cfg.context_length,
                            vocab_size=cfg.vocab_size, seed=1)
    per = cfg.batch_size // n
    lossfn = CrossEntropyLoss()
    records = {}
    for sync in cfg.syncs:
        model.clear_grad_hooks()
        ddp = DistributedDataParallel(model, comm, sync=sync, bucket_cap_mb=cfg.bucket_mb)
        opt = AdamW(ddp.parameters(), lr=LR) if cfg.optimizer == "adamw" else SGD(ddp.parameters(), lr=LR)
        record = np.zeros((cfg.num_steps, len(FIELDS)))
        for i in range(steps):
            rows = slice(i * cfg.batch_size + rank * per, i * cfg.batch_size + (rank + 1) * per)
            x, y = data.X_train[rows], data.y_train[rows]                    # (B/N, T) tokens
            harness.Barrier()
            c0, t0 = time.process_time(), time.perf_counter()
            ddp.zero_grad()
            lossfn.forward(ddp(x), y)
            ddp.backward(lossfn.backward())
            ddp.step(opt)
            total, cpu = time.perf_counter() - t0, time.process_time() - c0
            if i >= cfg.num_warmup:
                s = ddp.stats
                record[i - cfg.num_warmup] = (total, s.comm_issue_s + s.comm_exposed_s, s.comm_calls, cpu)
        records[sync] = record
        del ddp, opt
        if rank == 0:
            print(f"#   {size} {sync}: median step {np.median(record[:, 0]) * 1e3:.0f} ms on rank 0", flush=True)
    return records


def summarise(size: str, requested: str, sync: str, cfg: Config, worst: np.ndarray, mean: np.ndarray,
              n: int) -> dict:
    """One row from the max-over-ranks and mean-over-ranks records (steps, fields)."""
    f = {name: i for i, name in enumerate(FIELDS)}
    d, d_ff, layers, heads = PRESETS[size]
    total = worst[:, f["total_s"]] * 1e3                                   # (steps,) ms
    comm = mean[:, f["comm_s"]] * 1e3                                      # (steps,)
    compute = (mean[:, f["total_s"]] - mean[:, f["comm_s"]]) * 1e3        # (steps,) everything else
    total_ms = float(np.median(total))
    p10, p90 = np.percentile(total, [10, 90])
    return {
        "model_size": size, "d_model": d, "num_layers": layers,
        "total_time_ms": total_ms, "compute_time_ms": float(np.median(compute)),
        "comm_time_ms": float(np.median(comm)), "comm_fraction": float(np.median(comm)) / total_ms,
        "num_comm_ops": int(worst[:, f["comm_calls"]].max()),
        "requested_size": requested, "num_heads": heads, "d_ff": d_ff,
        "params": gpt_num_parameters(cfg.vocab_size, cfg.context_length, d, layers, heads, d_ff),
        "sync": sync, "backend": cfg.backend, "transport": "mpi",
        "bucket_mb": cfg.bucket_mb if sync in ("bucketed", "overlap") else 0.0,
        "world_size": n, "batch_size": cfg.batch_size, "context_length": cfg.context_length,
        "vocab_size": cfg.vocab_size, "steps": cfg.num_steps,
        "total_time_ms_p10": float(p10), "total_time_ms_p90": float(p90),
        "tokens_per_s": cfg.batch_size * cfg.context_length / (total_ms / 1e3),
        "cpu_time_ms": float(np.median(mean[:, f["cpu_s"]])) * 1e3,
    }


# ----------------------------------------------------------------------------- output

TABLE = (("model_size", "model", 7, ""), ("sync", "sync", 9, ""), ("d_model", "d_model", 7, "d"),
         ("num_layers", "layers", 6, "d"), ("params", "params", 11, ","), ("total_time_ms", "total_ms", 9, ".0f"),
         ("compute_time_ms", "compute_ms", 10, ".0f"), ("comm_time_ms", "comm_ms", 8, ".0f"),
         ("comm_fraction", "comm%", 6, ".1%"), ("num_comm_ops", "ops", 4, "d"),
         ("tokens_per_s", "tokens/s", 8, ".0f"), ("cpu_time_ms", "cpu_ms", 8, ".0f"))


def format_table(rows: list[dict]) -> str:
    """Fixed-width text table of the main columns."""
    lines = [" ".join(head.rjust(w) for _, head, w, _ in TABLE)]
    lines += [" ".join(format(r[c], f">{w}{fmt}") for c, _, w, fmt in TABLE) for r in rows]
    return "\n".join(lines)


def csv_paths(path: str, syncs) -> dict:
    """sync -> CSV path: ``path`` itself for one sync, ``stem.<sync>.suffix`` for several."""
    if len(syncs) == 1:
        return {syncs[0]: path}
    stem, suffix = os.path.splitext(path)
    return {s: f"{stem}.{s}{suffix or '.csv'}" for s in syncs}


def write_csv(path: str, rows: list[dict]) -> None:
    """The coursework columns, exactly, one row per model size."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CSV_COLUMNS)
        for r in rows:
            w.writerow([f"{r[c]:.3f}" if isinstance(r[c], float) else r[c] for c in CSV_COLUMNS])


def main(argv=None, mpi_comm=None) -> int:
    """Run the benchmark on ``mpi_comm`` (default COMM_WORLD); rank 0 prints and writes."""
    world = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    argv = sys.argv[1:] if argv is None else list(argv)
    rank, n = world.Get_rank(), world.Get_size()
    cfg = parse_config(argv, n, verbose=rank == 0)
    bc.check_out({"--csv": cfg.csv, "--out": cfg.out}, world, build_parser(rank == 0))
    sizes, notes = choose_sizes(cfg, world)
    if rank == 0:
        print(f"# naive DDP benchmark: {n} ranks, backend {cfg.backend}, global batch {cfg.batch_size} x "
              f"{cfg.context_length} tokens, vocab {cfg.vocab_size}, {cfg.dtype}, {cfg.optimizer}; "
              f"{cfg.num_warmup} warm-up + {cfg.num_steps} timed steps per sync", flush=True)
        for note in notes:
            if note:
                print(f"# {note}", flush=True)
    if any(s is None for s in sizes):
        return 2
    comm = npcomm.create(cfg.backend, world.Dup())
    harness = world.Dup()
    rows = []
    for requested, size in zip(cfg.model_sizes, sizes):
        if rank == 0:
            d, d_ff, layers, heads = PRESETS[size]
            params = gpt_num_parameters(cfg.vocab_size, cfg.context_length, d, layers, heads, d_ff)
            print(f"# {size}: {params:,} parameters", flush=True)
        records = measure(size, cfg, comm, harness)
        for sync in cfg.syncs:
            worst, mean = records[sync].copy(), records[sync].copy()
            harness.Allreduce(MPI.IN_PLACE, worst, op=MPI.MAX)
            harness.Allreduce(MPI.IN_PLACE, mean, op=MPI.SUM)
            rows.append(summarise(size, requested, sync, cfg, worst, mean / n, n))
    harness.Free()
    if rank == 0:
        print("# medians over timed steps; total: max over ranks; comm: all-reduce calls during + after backward")
        print(format_table(rows), flush=True)
        if cfg.csv:
            for sync, path in csv_paths(cfg.csv, cfg.syncs).items():
                write_csv(path, [r for r in rows if r["sync"] == sync])
                print(f"# wrote {path} ({sync})")
        if cfg.out:
            results.write_dump(cfg.out, "naive_ddp", rows, world_size=n, backends=cfg.backend,
                               attrs={"argv": json.dumps(argv), "config": asdict(cfg),
                                      "memory_notes": json.dumps([x for x in notes if x])})
            print(f"# wrote {cfg.out}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    abort_on_exception()
    sys.exit(main())
