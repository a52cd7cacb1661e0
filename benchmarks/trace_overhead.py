"""What tracing costs a DDP step: the same step with the tracer recording every step against untraced.

    mpirun -n 2 python benchmarks/trace_overhead.py                       # tiny MLP, overlap, mpi
    mpirun -n 2 python benchmarks/trace_overhead.py --model small --backend ring --bucket-mb 1

Two copies of one model from the same weights, each in its own DDP over the same communicator:
``off`` with no tracer (npddp.util.tracing.NULL: layers not wrapped) and ``on`` with a Tracer
whose window covers every step (the worst case: every layer, bucket, wait and optimizer event
recorded). After ``--warmup`` untimed steps of each, ``--rounds`` rounds each run ``--steps``
steps of both, in alternating order, so a change in the machine's speed hits both alike. A
step's time is the max over ranks (one all-reduce at the end). Printed: per contender the
median step over all rounds, and the ratio on / off: the median of the per-round ratios of
medians with their p10 and p90 over rounds. The trace itself is written to a temporary
directory after the timing and removed. Last, the cost of one event is measured without
noise (a traced no-op call against a plain one, 100,000 times) and scaled to a step.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder, so `benchmarks` imports as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from npddp import comm as npcomm  # noqa: E402
from npddp.nn import CrossEntropyLoss, mlp  # noqa: E402
from npddp.optim import SGD  # noqa: E402
from npddp.parallel.ddp import SYNCS, DistributedDataParallel  # noqa: E402
from npddp.process.job import abort_on_exception  # noqa: E402
from npddp.util.threads import set_threads  # noqa: E402
from npddp.util import tracing  # noqa: E402

from benchmarks import _common as bc  # noqa: E402


def build_parser(verbose: bool):
    """The command-line parser; only a ``verbose`` one prints."""
    p = bc.RankParser(prog="trace_overhead.py", verbose=verbose,
                      description="Time a DDP step with tracing on against off, interleaved.")
    p.add_argument("--model", choices=tuple(bc.MODELS), default="tiny", help="MLP size (default tiny)")
    p.add_argument("--backend", choices=npcomm.BACKENDS, default="mpi", help="communication backend (default mpi)")
    p.add_argument("--sync", choices=SYNCS, default="overlap", help="DDP sync (default overlap)")
    p.add_argument("--bucket-mb", type=float, default=0.25, help="bucket cap in MiB (default 0.25: several buckets)")
    p.add_argument("--batch", type=bc.int_at_least(1), default=64, help="rows per rank per step (default 64)")
    p.add_argument("--steps", type=bc.int_at_least(1), default=10, help="steps of each contender per round (default 10)")
    p.add_argument("--rounds", type=bc.int_at_least(2), default=20, help="rounds (default 20)")
    p.add_argument("--warmup", type=bc.int_at_least(0), default=3, help="untimed steps of each first (default 3)")
    return p


def run_steps(ddp, opt, x, y, world, n: int) -> np.ndarray:
    """``n`` steps (barrier, zero_grad, forward, loss, backward, optimizer); this rank's seconds, (n,)."""
    loss = CrossEntropyLoss()
    times = np.zeros(n)
    for i in range(n):
        world.Barrier()
        t0 = time.perf_counter()
        ddp.zero_grad()
        loss.forward(ddp(x), y)
        ddp.backward(loss.backward())
        ddp.step(opt)
        times[i] = time.perf_counter() - t0
    return times


def event_cost_ns(comm, n: int = 100_000) -> float:
    """ns one recorded event adds: a traced call of a no-op against the plain call (a tracer of its own)."""
    with tempfile.TemporaryDirectory() as folder:
        tracer = tracing.Tracer(Path(folder) / "t.json", _Alone(), (1, 1), capacity=n)
        plain = _noop
        traced = tracer.wrap(_noop, tracer.name("noop"), tracing.COMPUTE)
        best = []
        for fn in (plain, traced):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn(None)
            best.append((time.perf_counter_ns() - t0) / n)
    return best[1] - best[0]


def _noop(x):
    return x


class _Alone:
    """A world of one for the per-event measurement (the tracer then never communicates)."""

    rank, size = 0, 1


def main(argv=None) -> int:
    """Measure and print (rank 0)."""
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    a = build_parser(rank == 0).parse_args(sys.argv[1:] if argv is None else argv)
    set_threads("auto")
    comm = npcomm.create(a.backend, world.Dup()) if a.backend == "mpi" else bc.create_comm(a.backend, world.Dup())
    rng = np.random.default_rng(1000 + rank)
    x = rng.standard_normal((a.batch, bc.IN_FEATURES)).astype(np.float32)   # (B, 784)
    y = rng.integers(0, bc.OUT_FEATURES, size=a.batch)                      # (B,)
    folder = tempfile.mkdtemp(prefix="npddp-trace-") if rank == 0 else ""
    folder = world.bcast(folder)
    total = a.warmup + a.rounds * a.steps
    tracers = {"off": tracing.NULL,
               "on": tracing.Tracer(Path(folder) / "t.json", comm, (1, total + 1), capacity=200 * (total + 1))}
    runs = {}
    for name, tracer in tracers.items():
        ddp = DistributedDataParallel(mlp(bc.IN_FEATURES, bc.MODELS[a.model], bc.OUT_FEATURES, seed=0), comm,
                                      sync=a.sync, bucket_cap_mb=a.bucket_mb, tracer=tracer)
        runs[name] = (ddp, SGD(ddp.parameters(), lr=bc.LR, momentum=bc.MOMENTUM))
    for name, (ddp, opt) in runs.items():
        run_steps(ddp, opt, x, y, world, a.warmup)
    times = {name: np.zeros((a.rounds, a.steps)) for name in runs}   # (rounds, steps) per contender
    for r in range(a.rounds):
        for name in (("off", "on") if r % 2 == 0 else ("on", "off")):
            ddp, opt = runs[name]
            times[name][r] = run_steps(ddp, opt, x, y, world, a.steps)
    for name in times:
        world.Allreduce(MPI.IN_PLACE, times[name], op=MPI.MAX)
    events = tracers["on"].recorded
    tracers["on"].close()
    per_event = event_cost_ns(comm)
    if rank == 0:
        ratios = np.median(times["on"], axis=1) / np.median(times["off"], axis=1)   # (rounds,)
        p10, med, p90 = np.percentile(ratios, [10, 50, 90])
        buckets = len(runs["off"][0].buckets)
        print(f"# trace overhead: {world.Get_size()} ranks, MLP {a.model} ({bc.param_count(a.model):,} parameters), "
              f"{a.sync}, {buckets} buckets of <= {a.bucket_mb} MiB, backend {a.backend}, batch {a.batch}/rank; "
              f"{a.rounds} rounds x {a.steps} steps each, alternating order; step = max over ranks")
        print(f"off: median step {np.median(times['off']) * 1e3:.3f} ms")
        print(f"on:  median step {np.median(times['on']) * 1e3:.3f} ms ({events / (total + 1):.0f} events per step "
              f"on rank 0)")
        per_step = per_event * events / (total + 1)
        print(f"cost of one recorded event (a traced no-op call against a plain one): {per_event:.0f} ns, so "
              f"{per_step / 1e3:.1f} us per step = {per_step / 1e6 / np.median(times['off'] * 1e3):.3%} of the "
              "median step")
        print(f"on / off: median {med:.4f} (per-round ratios p10 {p10:.4f}, p90 {p90:.4f}, "
              f"min {ratios.min():.4f}, max {ratios.max():.4f})")
        for f in Path(folder).iterdir():
            f.unlink()
        Path(folder).rmdir()
    return 0


if __name__ == "__main__":
    abort_on_exception()
    sys.exit(main())
