"""A GPT training step under DDP, ZeRO-3, tensor and pipeline parallelism and their combinations.

    python benchmarks/parallelism.py --sizes tiny,small --ranks 2,4 --out par.h5     # the sweep
    python benchmarks/parallelism.py --sizes small --nodes 2 --ranks-per-node 2 --rate 1gbit \
        --lock /run/lock/cluster.lock --out par_2x2_1gbit.h5                          # across emulated nodes
    python benchmarks/report.py par.h5 par_2x2_1gbit.h5                              # tables, plot
    mpirun -n 2 python benchmarks/parallelism.py --worker --size tiny --layout pp-1f1b   # one job

Each (size, world size, layout) runs in an ``mpirun`` job of its own, because peak resident
memory (``getrusage``'s ``ru_maxrss``) is a high-water mark of a process. A worker builds the
GPT preset (vocabulary 256, ``--context`` tokens, float32, AdamW), splits it as the layout
says, and trains ``--warmup`` untimed and ``--steps`` timed steps on a global batch of
``--batch`` random sequences. Every communicator is wrapped in a counter (:class:`Counted`)
that adds up the bytes handed to each call and the time spent inside it (blocking calls, the
issue and the wait of non-blocking ones): the exposed communication; beside the bytes handed
over, the bytes a bandwidth-optimal algorithm sends for them (:func:`sent_bytes`). The
measured bubble is a stage's idle share of the step (:func:`pipeline_idle`: blocked in the
pipeline's sends and receives, plus the wait for the slowest rank after its last backward),
beside ``(K-1)/(M+K-1)``. Peak memory is the resident high-water mark over the steps
(``VmHWM``, reset after the model is built, split and its freed pages trimmed). A step is as slow as its slowest rank;
rows give the median over steps, and with ``--repeats`` the median over jobs of each column.

With ``--nodes K`` every job runs across K emulated nodes (``python -m npddp.cluster
--launcher mpi``, R = ``--ranks-per-node`` ranks each, links shaped to ``--rate``), one cluster
per job, each under an exclusive ``flock`` on ``--lock`` when given; the workers also read the
bytes their node's ``eth0`` sent during the timed steps (``link_bytes``).

Layouts (``--layouts``; one that does not fit a world size is skipped): ``ddp``, ``zero3``
(every rank holds 1/N of parameters, gradients and AdamW state), ``tp`` (tp = N), ``tp-sp`` (tp = N with
sequence parallelism: an all-gather and a reduce-scatter where ``tp`` all-reduces), ``pp-gpipe``
and ``pp-1f1b`` (pp = N, ``--micro-batches``), and for N = 4 ``tp2-pp2``, ``dp2-pp2``, ``dp2-tp2``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse  # noqa: E402
import contextlib  # noqa: E402
import ctypes  # noqa: E402
import fcntl  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

#: layout -> (dp, tp, pp, schedule, zero stage); 0 stands for "the rest of the world"
LAYOUTS = {"ddp": (0, 1, 1, "none", 0), "zero3": (0, 1, 1, "none", 3), "tp": (1, 0, 1, "none", 0), "tp-sp": (1, 0, 1, "none", 0),
           "pp-gpipe": (1, 1, 0, "gpipe", 0), "pp-1f1b": (1, 1, 0, "1f1b", 0), "tp2-pp2": (1, 2, 2, "1f1b", 0),
           "dp2-pp2": (2, 1, 0, "1f1b", 0), "dp2-tp2": (2, 0, 1, "none", 0)}
MARK = "PARALLELISM-BENCH "
VOCAB = 256


def shape_of(layout: str, n: int) -> tuple[int, int, int] | None:
    """(dp, tp, pp) of ``layout`` on ``n`` ranks, or None when it does not fit."""
    dims = list(LAYOUTS[layout][:3])
    fixed = int(np.prod([d for d in dims if d]))
    if n % fixed:
        return None
    fill = n // fixed
    if 0 not in dims:
        return tuple(dims) if fixed == n else None
    if fill < 2 and dims.index(0) > 0:            # a tensor or pipeline axis of one rank is not that layout
        return None
    dims = [d if d else fill for d in dims]
    return tuple(dims)


class Tally:
    """Bytes handed to and sent by communication calls, seconds inside them and blocked in pipeline sends/receives."""

    def __init__(self):
        self.bytes, self.sent, self.seconds, self.p2p_seconds = 0, 0.0, 0.0, 0.0


def sent_bytes(name: str, nbytes: int, size: int) -> float:
    """Bytes one rank sends for a call handed ``nbytes`` in a group of ``size`` by a bandwidth-optimal algorithm.

    All-reduce (ring, or reduce-scatter + all-gather): 2(n-1)/n x B; reduce-scatter of the whole
    B: (n-1)/n x B; all-gather of this rank's block b: (n-1) x b; a send: its array; a broadcast
    (outside the timed steps): B; a receive or a barrier: nothing.
    """
    if size < 2 or name in ("recv", "barrier"):
        return float(nbytes) if name == "send" else 0.0
    share = {"allreduce": 2 * (size - 1) / size, "iallreduce": 2 * (size - 1) / size,
             "reduce_scatter": (size - 1) / size, "ireduce_scatter": (size - 1) / size,
             "allgather": size - 1, "iallgather": size - 1, "gather": 1.0, "scatter": (size - 1) / size}
    return share.get(name, 1.0) * nbytes


class _TimedWork:
    """A non-blocking call's handle whose wait counts as communication time."""

    def __init__(self, work, tally: Tally):
        self._work, self._tally = work, tally

    def __getattr__(self, name):
        return getattr(self._work, name)

    def wait(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            self._tally.seconds += time.perf_counter() - t0


class Counted:
    """A Communicator that counts what passes through it (everything else is the wrapped one's)."""

    BLOCKING = ("allreduce", "broadcast", "reduce_scatter", "allgather", "gather", "scatter", "barrier")
    NONBLOCKING = ("iallreduce", "iallgather", "ireduce_scatter")

    def __init__(self, comm, tally: Tally, p2p: bool = False):
        self._comm, self._tally, self._p2p = comm, tally, p2p

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if name in self.BLOCKING or name in self.NONBLOCKING or name in ("send", "recv"):
            return self._counted(name, attr)
        return attr

    def _counted(self, name: str, call):
        def counted(*args, **kwargs):
            buf = args[0] if args else None
            if name != "recv" and isinstance(buf, np.ndarray):
                self._tally.bytes += buf.nbytes
                self._tally.sent += sent_bytes(name, buf.nbytes, self._comm.size)
            t0 = time.perf_counter()
            out = call(*args, **kwargs)
            spent = time.perf_counter() - t0
            self._tally.seconds += spent
            if self._p2p and name in ("send", "recv"):
                self._tally.p2p_seconds += spent
            return _TimedWork(out, self._tally) if name in self.NONBLOCKING else out
        return counted


def build(layout: str, size: str, world, backend: str, context: int, micro: int, tally: Tally):
    """(step function taking (x, y), parameter count, (dp, tp, pp), this rank's data replica)."""
    from npddp.comm import create
    from npddp.nn import CrossEntropyLoss, gpt_preset
    from npddp.optim import AdamW
    from npddp.parallel.ddp import DistributedDataParallel
    from npddp.parallel.model import (MeshGroups, Mesh, Pipeline, PipelineStage, mesh_groups, tensor_parallel)
    from npddp.parallel.zero import ShardedOptimizer, ZeroDataParallel

    n = world.Get_size()
    dp, tp, pp = shape_of(layout, n)
    model = gpt_preset(size, VOCAB, context, dtype=np.float32, seed=0)
    params = model.num_parameters()
    loss = CrossEntropyLoss()
    if tp * pp == 1:
        comm = Counted(create(backend, group=world.Dup()), tally)
        if LAYOUTS[layout][4] == 3:
            engine = ZeroDataParallel(model, comm, stage=3)
            opt = ShardedOptimizer(engine, AdamW, lr=1e-4)
        else:
            engine = DistributedDataParallel(model, comm)
            opt = AdamW(engine.parameters(), lr=1e-4)

        def step(x, y, first_row, global_rows):
            engine.zero_grad()
            loss.forward(engine(x), y)
            engine.backward(loss.backward())
            engine.step(opt)
        return step, params, (dp, tp, pp), world.Get_rank()
    mesh = Mesh(n, tp=tp, pp=pp)
    raw = mesh_groups(mesh, world.Dup(), backend)
    groups = MeshGroups(mesh, raw.rank, Counted(raw.data, tally), Counted(raw.pipeline, tally, p2p=True),
                        Counted(raw.tensor, tally))
    here = mesh.coords(groups.rank)
    if tp > 1:
        model = tensor_parallel(model, groups.tensor, sequence=layout.endswith("-sp"))
    stage = PipelineStage(model, pp, here.pp)
    schedule = LAYOUTS[layout][3]
    engine = Pipeline(stage, groups.pipeline, loss, micro if pp > 1 else 1, "1f1b" if schedule == "none" else schedule,
                      data=groups.data if dp > 1 else None)
    opt = AdamW(engine.parameters(), lr=1e-4)

    def step(x, y, first_row, global_rows):
        engine.zero_grad()
        engine.train_step(x, y, first_row=first_row, global_rows=global_rows)
        engine.step(opt)
    return step, params, (dp, tp, pp), here.dp


def reset_peak_memory() -> bool:
    """Start the resident high-water mark (VmHWM) afresh; False where Linux does not allow it.

    Memory freed since the start (the full model, once split) goes back to the system first:
    glibc keeps freed heap pages resident until ``malloc_trim``.
    """
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_memory_mib(since_reset: bool) -> float:
    """This process's peak RSS in MiB: VmHWM since the reset, else getrusage's ru_maxrss over its life."""
    if since_reset:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0       # KiB -> MiB


def pipeline_idle(blocked_s, own_s, slowest_s):
    """A stage's idle time per step: blocked in the pipeline's sends and receives, plus the wait for the slowest rank.

    The second part is the trailing bubble of a middle stage: after its last backward it has
    nothing to receive, so it waits outside any call until the step's last rank is done.
    """
    return blocked_s + (slowest_s - own_s)


def link_sent(link: str | None) -> int:
    """Bytes the network interface ``link`` of this node has sent so far (0 without one)."""
    return int(Path(f"/sys/class/net/{link}/statistics/tx_bytes").read_text()) if link else 0


def measure(world, backend: str, size: str, layout: str, *, steps: int, warmup: int, batch: int, context: int,
            micro: int, link: str | None = None, rate: str = "local") -> dict | None:
    """One layout's row on rank 0 of ``world`` (an mpi4py communicator), None elsewhere.

    ``link``: the interface that joins this node to the others (its sent bytes become
    ``link_bytes``); ``rate``: the links' rate, recorded as given.
    """
    from mpi4py import MPI

    tally = Tally()
    step, params, (dp, tp, pp), replica = build(layout, size, world, backend, context, micro, tally)
    rows = batch // dp
    rng = np.random.default_rng(replica)
    tokens = rng.integers(0, VOCAB, size=(rows, context + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    record = np.zeros((steps, 5))                     # step s, comm s, comm bytes, p2p s, sent bytes
    harness = world.Dup()
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    layout_of_nodes = np.array([1.0 if node.Get_rank() == 0 else 0.0, 0.0])
    harness.Allreduce(MPI.IN_PLACE, layout_of_nodes, op=MPI.SUM)
    nodes, ranks_here = int(layout_of_nodes[0]), node.Get_size()
    node.Free()
    fresh = reset_peak_memory()
    for s in range(warmup + steps):
        harness.Barrier()
        if s == warmup:
            link_before = link_sent(link)
        before = (tally.seconds, tally.bytes, tally.p2p_seconds, tally.sent)
        t0 = time.perf_counter()
        step(x, y, replica * rows, batch)
        spent = time.perf_counter() - t0
        if s >= warmup:
            record[s - warmup] = (spent, tally.seconds - before[0], tally.bytes - before[1],
                                  tally.p2p_seconds - before[2], tally.sent - before[3])
    harness.Barrier()
    wire = np.array([(link_sent(link) - link_before) / steps / ranks_here])   # this node's bytes, its ranks' share
    harness.Allreduce(MPI.IN_PLACE, wire, op=MPI.SUM)
    worst = record.copy()
    harness.Allreduce(MPI.IN_PLACE, worst, op=MPI.MAX)
    if pp > 1:
        record[:, 3] = pipeline_idle(record[:, 3], record[:, 0], worst[:, 0])
    mean = record.copy()
    harness.Allreduce(MPI.IN_PLACE, mean, op=MPI.SUM)
    mean /= world.Get_size()
    peak = np.array([peak_memory_mib(fresh)])
    low = peak.copy()
    harness.Allreduce(MPI.IN_PLACE, peak, op=MPI.MAX)
    harness.Allreduce(MPI.IN_PLACE, low, op=MPI.MIN)
    harness.Free()
    if world.Get_rank() != 0:
        return None
    step_s = worst[:, 0]
    step_ms = float(np.median(step_s)) * 1e3
    comm_ms = float(np.median(mean[:, 1])) * 1e3
    m = micro if pp > 1 else 1
    return {"model_size": size, "layout": layout, "world_size": world.Get_size(), "dp": dp, "pp": pp, "tp": tp,
            "schedule": LAYOUTS[layout][3] if pp > 1 else "none", "micro_batches": m, "params": params,
            "batch": batch, "context_length": context, "steps": steps, "step_ms": step_ms,
            "step_ms_p10": float(np.percentile(step_s, 10)) * 1e3, "step_ms_p90": float(np.percentile(step_s, 90)) * 1e3,
            "comm_bytes": int(round(float(np.median(mean[:, 2])))), "sent_bytes": float(np.median(mean[:, 4])),
            "link_bytes": float(wire[0]) / world.Get_size() if link else float("nan"),
            "comm_ms": comm_ms, "comm_fraction": comm_ms / step_ms,
            "bubble": float(np.median(mean[:, 3] / worst[:, 0])),
            "bubble_theory": (pp - 1) / (m + pp - 1), "peak_rss_mib": float(peak[0]),
            "peak_rss_min_mib": float(low[0]), "tokens_per_s": batch * context / (step_ms / 1e3),
            "nodes": nodes, "ranks_per_node": ranks_here, "rate": rate if nodes > 1 else "local", "repeats": 1}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--sizes", default="tiny,small", help="GPT presets, comma-separated (default: tiny,small)")
    p.add_argument("--ranks", default=None, help="world sizes, comma-separated (default: 2,4; across nodes: "
                                                 "nodes x ranks per node, the only one allowed)")
    p.add_argument("--layouts", default=",".join(LAYOUTS), help=f"comma-separated, of {', '.join(LAYOUTS)}")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default: 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (default: 2)")
    p.add_argument("--batch", type=int, default=8, help="global batch in sequences (default: 8)")
    p.add_argument("--context", type=int, default=64, help="tokens per sequence (default: 64)")
    p.add_argument("--micro-batches", type=int, default=4, help="micro-batches per step with a pipeline (default: 4)")
    p.add_argument("--backend", default="mpi", help="npddp backend (default: mpi)")
    p.add_argument("--repeats", type=int, default=1, help="jobs per row; each column is their median (default: 1)")
    p.add_argument("--nodes", type=int, default=1, help="emulated nodes (python -m npddp.cluster) each job runs "
                                                        "across; 1: mpirun on this node (default: 1)")
    p.add_argument("--ranks-per-node", type=int, default=2, help="with --nodes > 1: ranks on each node (default: 2)")
    p.add_argument("--rate", default="1gbit", help="with --nodes > 1: each link's rate, tc syntax (default: 1gbit)")
    p.add_argument("--lock", default="", help="with --nodes > 1: a file to hold an exclusive flock on around each "
                                              "cluster job, so jobs of several users never overlap")
    p.add_argument("--link", default="", help="with --worker: the interface whose sent bytes are link_bytes")
    p.add_argument("--out", default="", help="the dump (HDF5) to write")
    p.add_argument("--worker", action="store_true", help="run one --size and --layout in this MPI job")
    p.add_argument("--size", default="tiny", help="with --worker: the GPT preset")
    p.add_argument("--layout", default="ddp", choices=tuple(LAYOUTS), help="with --worker: the layout")
    return p


def _usage(args, parser) -> None:
    """Exit 2 with one line on a bad list or number."""
    from npddp.nn.gpt import PRESETS
    bad = [s for s in args.sizes.split(",") if s not in PRESETS] + [
        s for s in args.layouts.split(",") if s not in LAYOUTS]
    if bad:
        parser.error(f"unknown size or layout {bad[0]!r}; sizes: {', '.join(PRESETS)}; layouts: {', '.join(LAYOUTS)}")
    for name in ("steps", "batch", "context", "micro_batches", "repeats", "nodes", "ranks_per_node"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be an integer >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be an integer >= 0, got {args.warmup}")
    if args.nodes > 1:
        from npddp.cluster.shaping import parse_rate
        try:
            parse_rate(args.rate)
        except ValueError as exc:
            parser.error(f"--rate: {exc}")
    across = args.nodes * args.ranks_per_node if args.nodes > 1 else None
    if args.ranks is None:
        args.ranks = str(across or "2,4")
    try:
        sizes = [int(v) for v in args.ranks.split(",")]
    except ValueError:
        parser.error(f"--ranks must be integers >= 1, comma-separated, got {args.ranks!r}")
    if min(sizes) < 1 or (across and sizes != [across]):
        parser.error(f"--ranks {args.ranks!r} is not valid; valid: integers >= 1"
                     + (f", and across {args.nodes} nodes of {args.ranks_per_node} only {across}" if across else ""))


@contextlib.contextmanager
def held(lock: str):
    """An exclusive flock on the file ``lock`` (nothing when empty), the same lock flock(1) takes."""
    if not lock:
        yield
        return
    fd = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def launcher(args, n: int) -> list[str]:
    """The command that starts ``n`` ranks: mpirun here, or an emulated cluster of ``--nodes`` (MPI's launcher)."""
    if args.nodes == 1:
        return [shutil.which("mpirun") or str(Path(sys.executable).parent / "mpirun"), "-n", str(n)]
    return [sys.executable, "-m", "npddp.cluster", "--nodes", str(args.nodes), "--ranks-per-node",
            str(args.ranks_per_node), "--rate", args.rate, "--launcher", "mpi", "--"]


def median_row(rows: list[dict]) -> dict:
    """One row of several jobs of the same layout: each number the median over them, ``repeats`` their count."""
    merged = dict(rows[0])
    for key, value in merged.items():
        if isinstance(value, float):
            merged[key] = float(np.median([r[key] for r in rows]))
        elif isinstance(value, int) and key == "comm_bytes":
            merged[key] = int(round(float(np.median([r[key] for r in rows]))))
    merged["repeats"] = len(rows)
    return merged


def sweep(args) -> list[dict]:
    """Every (size, ranks, layout) that fits, each in its own mpirun job; the rows."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    across = ["--link", "eth0", "--rate", args.rate] if args.nodes > 1 else []
    rows = []
    for size in args.sizes.split(","):
        for n in (int(v) for v in args.ranks.split(",")):
            for layout in args.layouts.split(","):
                dims = shape_of(layout, n)
                if dims is None or args.batch % dims[0] or (dims[2] > 1 and args.micro_batches > args.batch // dims[0]):
                    continue
                command = launcher(args, n) + [
                    sys.executable, str(Path(__file__).resolve()), "--worker", "--size", size, "--layout", layout,
                    "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch),
                    "--context", str(args.context), "--micro-batches", str(args.micro_batches),
                    "--backend", args.backend] + across
                repeats = []
                for _ in range(args.repeats):
                    with held(args.lock if args.nodes > 1 else ""):
                        proc = subprocess.run(command, capture_output=True, text=True, env=env)
                    found = [line[len(MARK):] for line in proc.stdout.splitlines() if line.startswith(MARK)]
                    if proc.returncode or not found:
                        raise SystemExit(f"{size} N={n} {layout}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
                    repeats.append(json.loads(found[-1]))
                rows.append(median_row(repeats))
                r = rows[-1]
                link = "" if args.nodes == 1 else f", link {r['link_bytes'] / 2**20:8.2f}"
                print(f"{size:>6} N={n} {layout:>8}: step {r['step_ms']:9.1f} ms, comm {r['comm_ms']:8.1f} ms, "
                      f"{r['comm_bytes'] / 2**20:8.2f} MiB/rank handed, {r['sent_bytes'] / 2**20:8.2f} sent{link}, "
                      f"bubble {r['bubble']:.2f} (theory {r['bubble_theory']:.2f}), peak {r['peak_rss_min_mib']:.0f}-"
                      f"{r['peak_rss_mib']:.0f} MiB", flush=True)
    return rows


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _usage(args, parser)
    if args.worker:
        from mpi4py import MPI
        row = measure(MPI.COMM_WORLD, args.backend, args.size, args.layout, steps=args.steps, warmup=args.warmup,
                      batch=args.batch, context=args.context, micro=args.micro_batches, link=args.link or None,
                      rate=args.rate)
        if row is not None:
            print(MARK + json.dumps(row), flush=True)
        return 0
    rows = sweep(args)
    if args.out and rows:
        from benchmarks import results
        results.write_dump(args.out, "parallelism", rows, world_size=max(r["world_size"] for r in rows),
                           backends=[args.backend], attrs={"argv": " ".join(sys.argv[1:] if argv is None else argv)})
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
