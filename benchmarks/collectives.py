"""Size sweep of any collective over npddp backends and MPI's own, in the manner of nccl-tests and OSU.

Run it with MPI (the defaults sweep all-reduce from 8 B to 256 MiB on every backend)::

    mpirun -n 2 python benchmarks/collectives.py
    mpirun -n 4 python -m benchmarks.collectives --backends mpi,ring -b 1K -e 64M -f 4 --out ar.h5 --csv ar.csv
    mpirun -n 4 python benchmarks/collectives.py --collective allgather --dtype float64
    mpirun -n 2 python benchmarks/collectives.py --collective reduce_scatter --backends raw,mpi,auto -b 1K -e 16M -f 16
    mpirun -n 3 python benchmarks/collectives.py --collective allgather --backends ring:bruck,ring:rd,auto -b 1K -e 1M
    mpirun -n 2 python benchmarks/collectives.py --collective alltoall -b 1K -e 16M -f 16   # MPI_Alltoall (raw)
    mpirun -n 2 python benchmarks/collectives.py --backends mpi,ring --transports mpi,tcp   # ring over both
    mpirun -n 2 python benchmarks/collectives.py --backends gloo,ring --transports tcp      # beside PyTorch's gloo
    mpirun -n 2 python benchmarks/collectives.py --backends raw,mpi,auto -b 1K -e 1M -f 4 --calls 50  # MPI as a program sees it
    mpirun -n 2 python benchmarks/collectives.py --backends mpi,auto --buffers both -b 256K -e 64M -f 4  # NumPy arrays too
    mpirun -n 2 python benchmarks/collectives.py --backends mpi,ring --check-args both -b 1K -e 16M -f 4  # the check's cost

``benchmarks/allreduce.py`` is this script under its older name (same flags, same default collective).
``--collective`` picks the call (allreduce, allgather, reduce_scatter, alltoall, broadcast: what nccl-tests'
``*_perf`` programs and OSU's ``osu_*`` time); ``--op`` is the reduction, as nccl-tests' ``-o``.

Rows. Every backend named (default: all of npddp's, where its communicator protocol has the
collective: :func:`benchmarks._common.offered`; for all-gather and reduce-scatter, ``mpi``, one row per
registered algorithm of the collective, ``ring:NAME`` (a backend ``B:NAME`` runs that collective with algorithm
``NAME``, ``create(B, algorithms={collective: NAME})``), and ``auto``, whose algorithm column shows its pick per
size), plus ``raw`` beside ``mpi``: MPI's own call in a bare mpi4py loop
(:mod:`benchmarks._raw`: ``MPI_Allreduce``, ``MPI_Allgather``, ``MPI_Reduce_scatter_block``,
``MPI_Alltoall``, ``MPI_Bcast``). A collective the protocol does not have yet (all-to-all) is
timed on ``raw`` alone; its npddp rows appear once the protocol declares it.

Method. For each size, then each backend, then each place (out of place, in place):
warm-up iterations, then timed iterations, each started by a barrier and timed on every
rank; an iteration's time is the maximum over ranks (one all-reduce of the timings after
each size). The first warm-up iteration sizes the run: timed iterations are ``--iters`` cut
to fit ``--budget`` seconds (but at least 3, or ``--iters`` if fewer), extra warm-ups are
cut to a quarter of it. Each size starts with one untimed run of its first group, whose
results are dropped: timed first at a size, a group was 5-19% slower out of place at N = 2
(docs/results/2026-12-02-performance.md), whichever backend it was. ``--rounds R`` measures a size's groups R times in
turn, each time with ``--iters``/R iterations and ``--budget``/R seconds, the first group one
later each round, and a row pools its rounds: a slow phase of the machine (another job, a
memory-bound neighbour) then lands on several rows instead of deciding one. ``--calls K`` makes each timed iteration K collectives back to
back, timed together and divided by K: for small messages, whose time a barrier's skew
across ranks can exceed, the sum of many calls says what a loop of them costs. Timed
iterations reuse their buffers back to back (values may grow, even past the dtype's range, silently;
that does not change the timing). Then one checked iteration on fresh data whose
exact result is known: rank r holds ``f((i + r) % m)`` for small integers f, m chosen so
every partial result is exact in the dtype (float16 sums: up to 1024 ranks), and
``#wrong`` counts the elements, summed over ranks, that differ from it (an out-of-place
call that alters its input counts too). The exit status is 1 when any ``#wrong`` is
non-zero; bad arguments print one error (rank 0) and exit 2 on every rank.

Sizes and bandwidth. ``size`` is the bytes of the whole vector (nccl-tests' convention):
the all-reduce/broadcast buffer, the reduce-scatter input (each rank keeps ``size / N``), the
all-gather output (each rank sends ``size / N``), one rank's all-to-all input (``size / N`` to
each peer). OSU and IMB print the all-gather and all-to-all per rank's block instead: divide
by N to compare. Sizes are rounded down to whole elements (all-gather, reduce-scatter and
all-to-all: to a multiple of N elements, as ``MPI_Reduce_scatter_block`` needs). ``algbw = size
/ median time``, ``busbw = algbw * factor`` with factor 2(N-1)/N for allreduce, (N-1)/N for
allgather, reduce_scatter and alltoall, 1 for broadcast; GB = 1e9 B. Places: allreduce is timed
with ``out=`` and in place; broadcast in place only; allgather, reduce_scatter and alltoall in
their natural form, which returns a new array ("outofplace"; the raw row reuses one output array).

Buffers. ``--buffers shared`` (the default) times all-reduce buffers from ``comm.empty``, which
the shared-memory backends place in node shared memory as DDP's buckets are; ``private`` times
ordinary NumPy arrays, as a user's ``comm.allreduce(np.zeros(n))`` passes them; ``both`` times
each, one after the other, and the rows say which in their ``buffers`` column.

MPI's own. Every sweep that times backend ``mpi`` also times ``raw`` beside it (unless
``--backends`` names ``raw`` itself): a bare mpi4py loop of the same collective over the same
buffers, outside npddp (:mod:`benchmarks._raw`), so the dump and the report show MPI as a program
that calls it sees it, and how far the ``mpi`` backend is from that.

Argument check. ``--check-args on`` (the default) times the communicators as ``create`` makes
them, checking every call's arguments across ranks; ``off`` turns the check off; ``both`` times
each backend twice, interleaved, the unchecked series named ``BACKEND/unchecked``.

Output. A text table as nccl-tests prints it, one row per size and backend as each size
completes (time in us, bandwidths in GB/s, ``#wrong``, the algorithm that ran), then the
total of ``#wrong`` and one ``# Avg bus bandwidth : X backend`` line per backend (the mean
busbw over its sizes and places). ``--out FILE`` writes the HDF5 dump (kind
``allreduce_sweep``, one row per size, backend, transport and place; columns in
benchmarks.columns, read with ``benchmarks.results.read_table``); ``--csv FILE`` the same rows as CSV.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder, so `benchmarks` imports as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import math
import os
import time
from dataclasses import asdict, dataclass

import numpy as np

try:
    from mpi4py import MPI
except ImportError:   # the sweep's harness (barriers, the timings' all-reduce) is MPI's: main says so in one line
    MPI = None

from npddp import comm as npcomm
from npddp.comm.algorithms import registry
from npddp.comm.communicators import choice
from benchmarks import results
from npddp.process.job import abort_on_exception
from npddp.util import env

from benchmarks import _common as bc
from benchmarks.columns import BUFFERS
from benchmarks._exact import kernel
from benchmarks._gloo import EXIT_NO_TORCH, GlooComm, import_torch
from benchmarks._raw import RAW, RawMPI

#: The contender beside npddp's backends: PyTorch's gloo all-reduce (over TCP), when torch is installed.
GLOO, GLOO_TRANSPORT = "gloo", "tcp"

KIND = "allreduce_sweep"
MIN_ITERS = 3
PLACES = {"allreduce": ("outofplace", "inplace"), "broadcast": ("inplace",),
          "allgather": ("outofplace",), "reduce_scatter": ("outofplace",), "alltoall": ("outofplace",)}
REDUCING = ("allreduce", "reduce_scatter")
#: Collectives whose whole vector is cut into one equal block per rank: sizes are rounded down to a multiple of N elements.
BLOCKED = ("allgather", "reduce_scatter", "alltoall")

BUFFER_CHOICES = (*BUFFERS, "both")
#: ``BACKEND:ALGORITHM``: a hand-written backend whose all-gather or reduce-scatter runs the named algorithm.
CHOSEN = ":"
#: Backends that run their own schedules for every collective: no ``:ALGORITHM`` and no pick to show.
OWN_SCHEDULES = ("mpi", "naive", "hier", GLOO, RAW)


def default_backends(collective: str) -> tuple:
    """The rows without ``--backends``: MPI's own, then for a collective with an algorithm menu each registered
    algorithm (``ring:NAME``) and ``auto``; else every built-in backend."""
    if collective in choice.DEFAULTS:
        return ("mpi", *(f"ring{CHOSEN}{name}" for name in registry.names(collective)), "auto")
    return npcomm.BACKENDS


def split_backend(spec: str, collective: str) -> tuple[str, dict | None]:
    """``ring:bruck`` as ``("ring", {collective: "bruck"})``; a plain backend as ``(spec, None)``."""
    base, sep, name = spec.partition(CHOSEN)
    return (base, {collective: name}) if sep else (spec, None)


def _check_chosen(spec: str, collective: str) -> str | None:
    """Why ``spec`` (``BACKEND:ALGORITHM``) is not a valid row for ``collective``, or None."""
    base, algorithms = split_backend(spec, collective)
    if collective not in choice.DEFAULTS:
        return f"{spec}: {collective} has no algorithm menu; BACKEND:ALGORITHM applies to {', '.join(choice.DEFAULTS)}"
    if base in OWN_SCHEDULES or base not in npcomm.backend_names():
        valid = [b for b in npcomm.backend_names() if b not in OWN_SCHEDULES]
        return f"{spec}: {base!r} is not a backend that runs the registry's algorithms; valid: {', '.join(valid)}"
    try:
        choice.check_algorithms(algorithms)
    except ValueError as exc:
        return f"{spec}: {exc}"
    return None


@dataclass(frozen=True)
class SweepConfig:
    """Resolved command-line options of one sweep."""

    backends: tuple
    collective: str
    dtype: str
    op: str
    minbytes: int
    maxbytes: int
    factor: int
    iters: int
    warmup: int
    budget_s: float
    out: str
    csv: str = ""
    transports: tuple = (bc.DEFAULT_TRANSPORT,)
    buffers: tuple = ("shared",)
    calls: int = 1
    checks: tuple = (True,)
    rounds: int = 1


# ----------------------------------------------------------------------------- arguments

def _positive_int(text: str) -> int:
    """argparse type: an int >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _size(text: str) -> int:
    """argparse type: a byte size such as 8, 1K, 64M."""
    try:
        return bc.parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def build_parser(verbose: bool = True) -> argparse.ArgumentParser:
    """The command-line parser; only a ``verbose`` one prints."""
    p = bc.RankParser(verbose=verbose, description="Time a collective over npddp backends across message sizes.")
    p.add_argument("--plugin", type=bc.plugin, action="append", default=[], metavar="MODULE", help=bc.PLUGIN_HELP)
    p.add_argument("--backends", default="",
                   help=f"comma-separated backends (default: {','.join(npcomm.BACKENDS)}, those the protocol offers "
                        "the collective on; for allgather and reduce_scatter: mpi, ring:NAME for each registered "
                        f"algorithm NAME, and auto; valid: {', '.join(npcomm.backend_names())}, BACKEND:ALGORITHM (a "
                        "hand-written backend whose allgather or reduce_scatter runs ALGORITHM), raw: MPI's own call "
                        "in a bare mpi4py loop, and gloo: PyTorch's all-reduce over TCP, when torch is installed)")
    p.add_argument("--collective", default="allreduce", choices=bc.COLLECTIVES)
    p.add_argument("-b", "--minbytes", type=_size, default=8, help="smallest size, e.g. 8, 1K (default 8)")
    p.add_argument("-e", "--maxbytes", type=_size, default=256 << 20, help="largest size (default 256M)")
    p.add_argument("-f", "--factor", type=int, default=2, help="size multiplication factor >= 2 (default 2)")
    p.add_argument("--iters", "-n", type=_positive_int, default=20,
                   help="timed iterations per size, cut to fit --budget (default 20)")
    p.add_argument("--warmup", "-w", type=_positive_int, default=5, help="warm-up iterations (default 5, >= 1)")
    p.add_argument("--calls", type=_positive_int, default=1,
                   help="collectives back to back in each timed iteration, its time divided by them: the barrier "
                        "that starts an iteration and the ranks' skew after it weigh 1/K (default 1)")
    p.add_argument("--budget", type=float, default=1.0,
                   help="seconds of timed iterations per size, backend and place (default 1.0)")
    p.add_argument("--rounds", type=_positive_int, default=1,
                   help="measure each size's backends and places R times in turn, starting one later each round, "
                        "with --iters/R iterations and --budget/R seconds each; a row pools its rounds, so a slow "
                        "phase of the machine touches several rows (default 1)")
    p.add_argument("--dtype", default="float32", choices=npcomm.DTYPES)
    p.add_argument("--op", default=None, choices=tuple(npcomm.OPS),
                   help="reduction for allreduce and reduce_scatter (default sum)")
    p.add_argument("--transports", default=bc.DEFAULT_TRANSPORT,
                   help="comma-separated transports of the hand-written backends: mpi, tcp (default: "
                        "%(default)s); backend mpi (MPI's own collectives) runs over mpi only")
    p.add_argument("--buffers", default="shared", choices=BUFFER_CHOICES,
                   help="all-reduce buffers from comm.empty (shared), ordinary NumPy arrays (private), or each "
                        "(both); default %(default)s")
    p.add_argument("--check-args", default="on", choices=("on", "off", "both"),
                   help="the default argument check: on, off, or both side by side (default on)")
    p.add_argument("--out", default="", help="write the HDF5 dump here (rank 0)")
    p.add_argument("--csv", default="", help="write the dump's rows as CSV here (rank 0)")
    return p


#: Buffers of the largest size a rank holds at once (the vector, its result, the checked input), at least.
BUFFER_COPIES = 3


def _memory_bytes() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def parse_config(argv, verbose: bool = True) -> SweepConfig:
    """Parse and check ``argv``; on bad input print (if verbose) and raise SystemExit(2)."""
    bc.load_plugins(argv)
    parser = build_parser(verbose)
    a = parser.parse_args(argv)
    backends = tuple(b.strip() for b in a.backends.split(",")) if a.backends else default_backends(a.collective)
    if not a.backends and not bc.offered(a.collective):   # the default: npddp's rows where the protocol has the call
        backends = (RAW,)
    for spec in (b for b in backends if CHOSEN in b):
        if _check_chosen(spec, a.collective):
            parser.error(f"--backends {_check_chosen(spec, a.collective)}")
    bad = [b for b in backends if CHOSEN not in b and b not in (*npcomm.backend_names(), GLOO, RAW)]
    if bad or not backends:
        parser.error(f"--backends: unknown backend {bad[0] if bad else ''!r}; valid: {', '.join(npcomm.backend_names())}, "
                     f"{GLOO}, {RAW}")
    if GLOO in backends and a.collective != "allreduce":
        parser.error(f"--backends {GLOO} times all-reduce only, not {a.collective}")
    npddp_rows = [b for b in backends if b not in (GLOO, RAW)]
    if npddp_rows and not bc.offered(a.collective):
        parser.error(f"--backends {npddp_rows[0]}: npddp's communicators have no {a.collective} yet; "
                     f"--backends {RAW} times MPI's own")
    if len(set(backends)) != len(backends):
        parser.error(f"--backends: {a.backends!r} names a backend twice")
    if "mpi" in backends and RAW not in backends:   # MPI as a program sees it
        backends = tuple(b for x in backends for b in ((RAW, x) if x == "mpi" else (x,)))
    if a.factor < 2:
        parser.error(f"-f/--factor must be an int >= 2, got {a.factor}")
    itemsize = np.dtype(a.dtype).itemsize
    if a.minbytes < itemsize:
        parser.error(f"-b/--minbytes {a.minbytes} is smaller than one {a.dtype} element ({itemsize} bytes)")
    if a.minbytes > a.maxbytes:
        parser.error(f"-b/--minbytes {a.minbytes} is larger than -e/--maxbytes {a.maxbytes}")
    largest = a.minbytes * a.factor ** int(math.log(a.maxbytes / a.minbytes, a.factor) + 1e-9)
    if BUFFER_COPIES * largest > _memory_bytes():
        parser.error(f"-e/--maxbytes {bc.format_size(a.maxbytes)}: a sweep to {bc.format_size(largest)} needs about "
                     f"{BUFFER_COPIES} buffers of that size on each rank, more than this machine's "
                     f"{_memory_bytes() / (1 << 30):.1f} GiB of memory; use a smaller -e")
    if not a.budget > 0:
        parser.error(f"--budget must be > 0 seconds, got {a.budget}")
    if a.rounds > a.iters:
        parser.error(f"--rounds {a.rounds} is more than --iters {a.iters}; valid: 1 to {a.iters}")
    if a.op is not None and a.collective not in REDUCING:
        parser.error(f"--op applies to {' and '.join(REDUCING)} only, not {a.collective}")
    op = (a.op or "sum") if a.collective in REDUCING else "none"
    transports = tuple(t.strip() for t in a.transports.split(","))
    bad = [t for t in transports if t not in npcomm.transport_names()]
    if bad or len(set(transports)) != len(transports):
        parser.error(f"--transports {a.transports!r}: valid transports are {', '.join(npcomm.transport_names())}, each once")
    buffers = BUFFERS if a.buffers == "both" else (a.buffers,)
    if a.buffers != "shared" and a.collective != "allreduce":
        parser.error(f"--buffers {a.buffers} applies to allreduce only, not {a.collective}")
    return SweepConfig(backends, a.collective, a.dtype, op, a.minbytes, a.maxbytes, a.factor,
                       a.iters, a.warmup, float(a.budget), a.out, a.csv, transports, buffers, a.calls,
                       {"on": (True,), "off": (False,), "both": (True, False)}[a.check_args], a.rounds)


def sizes(cfg: SweepConfig, n: int) -> np.ndarray:
    """Element counts of the whole vector, one per distinct size; shape (n_sizes,)."""
    itemsize = np.dtype(cfg.dtype).itemsize
    counts, nbytes = [], cfg.minbytes
    while nbytes <= cfg.maxbytes:
        count = nbytes // itemsize
        if cfg.collective in BLOCKED:
            count -= count % n
        if count and count not in counts:
            counts.append(count)
        nbytes *= cfg.factor
    return np.array(counts, dtype=np.int64)


# ----------------------------------------------------------------------------- timing

def _timed(run, harness, calls: int = 1) -> float:
    """Barrier, then the seconds one ``run()`` takes on this rank (the mean of ``calls`` back to back)."""
    harness.Barrier()
    t0 = time.perf_counter()
    for _ in range(calls):
        run()
    return (time.perf_counter() - t0) / calls


def measure(run, check, harness, iters: int, warmup: int, budget: float,
            calls: int = 1) -> tuple[np.ndarray, int]:
    """Warm up, time, check: (this rank's per-iteration seconds per call, shape (k,), k <= iters; #wrong here)."""
    with np.errstate(over="ignore"):  # timed calls reuse their buffers: sums may grow past the dtype's range
        first = np.array([_timed(run, harness, calls)])
        harness.Allreduce(MPI.IN_PLACE, first, op=MPI.MAX)  # every rank must agree on the counts below
        est = max(float(first[0]) * calls, 1e-9)  # seconds of one iteration
        for _ in range(min(warmup - 1, int(0.25 * budget / est))):
            _timed(run, harness, calls)
        k = min(iters, max(MIN_ITERS, int(budget / est)))
        times = np.array([_timed(run, harness, calls) for _ in range(k)])
    return times, check()


# ----------------------------------------------------------------------------- the sweep

@dataclass(frozen=True)
class Group:
    """One measured series: a backend over a transport, in one place, on shared or private buffers."""

    backend: str
    transport: str
    place: str
    buffers: str = "shared"
    check: bool = True


def groups(cfg: SweepConfig) -> list[Group]:
    """Every backend x transport x place (x argument check on and off), in measuring order."""
    return [Group(b, t, p, k, on) for k in cfg.buffers for b in cfg.backends
            for t in ((GLOO_TRANSPORT,) if b == GLOO else ("mpi",) if b == RAW else cfg.transports)
            for p in PLACES[cfg.collective] if not (b == "mpi" and t != "mpi")  # MPI's collectives: over MPI
            for on in (cfg.checks if b not in (GLOO, RAW) else (True,))]


def row(cfg: SweepConfig, g: Group, algorithm: str, n: int, count: int, times: np.ndarray, wrong: int) -> dict:
    """The table row of one group at one size from its timed iterations ``times`` (k,) in seconds."""
    nbytes = count * np.dtype(cfg.dtype).itemsize
    t_min, p10, median, p90, t_max = np.percentile(times, [0, 10, 50, 90, 100])
    algbw = nbytes / median / bc.GB
    backend = g.backend if g.check or cfg.checks == (False,) else f"{g.backend}/unchecked"
    return {"collective": cfg.collective, "backend": backend, "transport": g.transport, "algorithm": algorithm,
            "place": g.place, "buffers": g.buffers, "world_size": n, "dtype": cfg.dtype, "op": cfg.op, "bytes": int(nbytes),
            "count": int(count), "iters": int(times.size), "time_min_s": float(t_min), "time_p10_s": float(p10),
            "time_median_s": float(median), "time_p90_s": float(p90), "time_max_s": float(t_max),
            "algbw_GBps": float(algbw), "busbw_GBps": float(algbw * bc.busbw_factor(cfg.collective, n)),
            "wrong": int(wrong)}


def _measure_group(cfg: SweepConfig, comms: dict, g: Group, count: int, harness,
                   rounds: int = 1) -> tuple[np.ndarray, int]:
    """:func:`measure` group ``g`` at ``count`` elements on fresh buffers for one of ``rounds`` rounds:
    (per-iteration seconds, #wrong here)."""
    run, check = kernel(comms[g.backend, g.transport, g.check], cfg.collective, g.place, count,
                        cfg.dtype, cfg.op, g.buffers == "shared")
    return measure(run, check, harness, cfg.iters // rounds, cfg.warmup, cfg.budget_s / rounds, cfg.calls)


def measure_size(cfg: SweepConfig, comms: dict, todo: list, count: int, harness) -> tuple[np.ndarray, np.ndarray]:
    """Every group of ``todo`` at ``count`` elements, ``cfg.rounds`` times in turn.

    Returns (times, wrong): seconds per timed iteration, shape (groups, iters); #wrong, shape (groups,).

    Round k starts at group k (mod the groups); a group's timed iterations are its rounds' in
    order, NaN past them; its #wrong is the largest of its rounds'.
    """
    times = np.full((len(todo), cfg.iters), np.nan)  # (groups, iters)
    wrong = np.zeros(len(todo), dtype=np.int64)       # (groups,)
    filled = np.zeros(len(todo), dtype=np.int64)
    _measure_group(cfg, comms, todo[0], count, harness, cfg.rounds)  # untimed: no group pays for being first
    for k in range(cfg.rounds):
        for j in range(len(todo)):
            i = (k + j) % len(todo)
            t, w = _measure_group(cfg, comms, todo[i], count, harness, cfg.rounds)
            times[i, filled[i]:filled[i] + t.size] = t
            filled[i] += t.size
            wrong[i] = max(wrong[i], w)
    return times, wrong


def row_algorithm(cfg: SweepConfig, comm, backend: str, nbytes: int) -> str:
    """The algorithm a row's call ran: the all-reduce's pick, the chosen all-gather/reduce-scatter algorithm (auto's
    pick at this size), else the backend's name."""
    if cfg.collective == "allreduce":
        return bc.algorithm_of(comm, backend, nbytes, cfg.dtype)
    if cfg.collective in choice.DEFAULTS and split_backend(backend, cfg.collective)[0] not in OWN_SCHEDULES:
        return comm.choice.name_for(cfg.collective, nbytes)
    return backend


def _npddp_comm(cfg: SweepConfig, pair: tuple, sub, world):
    """The communicator of row ``pair`` = (backend, transport, check): ``BACKEND:ALGORITHM`` with that algorithm."""
    backend, algorithms = split_backend(pair[0], cfg.collective)
    return bc.create_comm(backend, sub, pair[1], world, check_args=pair[2], algorithms=algorithms)


def run_sweep(cfg: SweepConfig, harness, on_size=None) -> tuple[list[dict], np.ndarray]:
    """Measure every size x group on the MPI communicator ``harness``.

    Returns (rows, raw): the table rows (size-major, then the order of :func:`groups`) and every
    timed iteration, shape (rows, --iters), NaN past each row's ``iters``. ``on_size(rows)`` is
    called with each size's rows as soon as they are known (on every rank).
    """
    n = harness.Get_size()
    todo = groups(cfg)
    pairs = list(dict.fromkeys((g.backend, g.transport, g.check) for g in todo))
    subcomms = {pair: harness.Dup() for pair in pairs}
    rows, raw = [], []
    try:
        world = bc.tcp_world(harness) if "tcp" in cfg.transports else None
        comms = {pair: GlooComm(harness) if pair[0] == GLOO else RawMPI(sub) if pair[0] == RAW else
                 _npddp_comm(cfg, pair, sub, world) for pair, sub in subcomms.items()}
        for count in sizes(cfg, n):
            times, wrong = measure_size(cfg, comms, todo, int(count), harness)
            harness.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)  # NaN padding is the same on every rank
            harness.Allreduce(MPI.IN_PLACE, wrong, op=MPI.SUM)
            nbytes = int(count) * np.dtype(cfg.dtype).itemsize
            done = []
            for i, g in enumerate(todo):
                comm = comms[g.backend, g.transport, g.check]
                algorithm = row_algorithm(cfg, comm, g.backend, nbytes)
                done.append(row(cfg, g, algorithm, n, int(count), times[i][np.isfinite(times[i])], wrong[i]))
            rows += done
            raw.append(times)
            if on_size is not None:
                on_size(done)
    finally:
        for sub in subcomms.values():
            sub.Free()
    return rows, (np.concatenate(raw) if raw else np.zeros((0, cfg.iters)))


# ----------------------------------------------------------------------------- output

_PLACE_LABEL = {"outofplace": "out-of-place", "inplace": "in-place"}
_LEAD = (("size", "(B)", 11), ("count", "(elements)", 10), ("type", "", 7), ("redop", "", 5),
         ("backend", "", 13), ("algorithm", "", 12))
_PER_PLACE = (("time", "(us)", 9), ("algbw", "(GB/s)", 7), ("busbw", "(GB/s)", 7), ("#wrong", "", 6))


def header(cfg: SweepConfig, n: int) -> str:
    """The nccl-tests-style header: what was run, then three column-title lines."""
    places = PLACES[cfg.collective]
    lead = sum(w + 1 for _, _, w in _LEAD)
    width = sum(w + 1 for _, _, w in _PER_PLACE)
    titles = "#" + " " * (lead - 1) + "".join(f"{_PLACE_LABEL[p]:>{width}}" for p in places)
    names = "#" + " ".join(f"{name:>{w}}" for name, _, w in _LEAD)[1:]
    units = "#" + " ".join(f"{unit:>{w}}" for _, unit, w in _LEAD)[1:]
    for _ in places:
        names += "".join(f" {name:>{w}}" for name, _, w in _PER_PLACE)
        units += "".join(f" {unit:>{w}}" for _, unit, w in _PER_PLACE)
    return "\n".join([
        f"# npddp {cfg.collective}: {n} ranks, {cfg.dtype}, op {cfg.op}; backends {','.join(cfg.backends)} "
        f"over {','.join(cfg.transports)}",
        "# time: median over iterations of the max over ranks"
        + (f" ({cfg.rounds} rounds, the groups in turn)" if cfg.rounds > 1 else "") + "; algbw = size / time; "
        f"busbw = algbw x {bc.busbw_factor(cfg.collective, n):g}",
        titles, names.rstrip(), units.rstrip()])


def format_rows(rows: list[dict], places) -> list[str]:
    """One line per size, backend and transport, its places side by side (rows of one size in)."""
    lines = []
    for key in dict.fromkeys((r["bytes"], r["backend"], r["transport"], r["buffers"]) for r in rows):
        mine = {r["place"]: r for r in rows if (r["bytes"], r["backend"], r["transport"], r["buffers"]) == key}
        first = next(iter(mine.values()))
        backend = first["backend"] if first["transport"] == bc.DEFAULT_TRANSPORT else \
            f"{first['backend']}/{first['transport']}"
        backend += "" if first["buffers"] == "shared" else "/priv"
        values = (first["bytes"], first["count"], first["dtype"], first["op"], backend, first["algorithm"])
        cells = [f"{v:>{w}}" for v, (_, _, w) in zip(values, _LEAD)]
        for p in places:
            r = mine[p]
            values = (f"{r['time_median_s'] * 1e6:.2f}", f"{r['algbw_GBps']:.3f}", f"{r['busbw_GBps']:.3f}", r["wrong"])
            cells += [f"{v:>{w}}" for v, (_, _, w) in zip(values, _PER_PLACE)]
        lines.append(" " + " ".join(cells))
    return lines


def footer(rows: list[dict]) -> str:
    """Total #wrong and one '# Avg bus bandwidth : X backend' line per backend (and transport)."""
    wrong = sum(r["wrong"] for r in rows)
    lines = [f"# Wrong values       : {wrong} {'OK' if wrong == 0 else 'FAILED'}"]
    for key in dict.fromkeys((r["backend"], r["transport"], r["buffers"]) for r in rows):
        busbw = [r["busbw_GBps"] for r in rows if (r["backend"], r["transport"], r["buffers"]) == key]
        label = key[0] if key[1] == bc.DEFAULT_TRANSPORT else f"{key[0]}/{key[1]}"
        label += "" if key[2] == "shared" else " (private buffers)"
        lines.append(f"# Avg bus bandwidth  : {np.mean(busbw):.4f} {label}")
    return "\n".join(lines)


def write_outputs(cfg: SweepConfig, rows: list[dict], raw: np.ndarray, n: int, argv) -> None:
    """The HDF5 dump (``--out``) and the CSV (``--csv``), each if asked for."""
    if cfg.out:
        results.write_dump(cfg.out, KIND, rows, world_size=n, backends=cfg.backends, raw={"time_s": raw},
                           attrs={"collective": cfg.collective, "dtype": cfg.dtype, "op": cfg.op,
                                  "backends": list(cfg.backends), "transports": list(cfg.transports),
                                  "places": list(PLACES[cfg.collective]), "argv": json.dumps(list(argv)),
                                  "config": asdict(cfg)})
    if cfg.csv:
        results.write_csv(cfg.csv, KIND, rows)


def main(argv=None, mpi_comm=None) -> int:
    """Run the sweep on ``mpi_comm`` (default COMM_WORLD); 0 if every result was exact, else 1; 2 without mpi4py."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if MPI is None and mpi_comm is None:
        first = env.world_rank() == 0
        parse_config(argv, verbose=first)              # --help and bad arguments as anywhere
        if first:
            print(f"{os.path.basename(sys.argv[0])}: error: the sweep runs under MPI (its barriers and the all-reduce of the timings are "
                  "MPI's), and mpi4py cannot be imported here: pip install \"npddp[mpich]\" and run it under mpirun "
                  "(the hand-written backends then time --transports mpi,tcp)", file=sys.stderr, flush=True)
        return 2
    world = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    rank, n = world.Get_rank(), world.Get_size()
    cfg = parse_config(argv, verbose=rank == 0)
    bc.check_out({"--out": cfg.out, "--csv": cfg.csv}, world, build_parser(rank == 0))
    if sizes(cfg, n).size == 0:
        build_parser(rank == 0).error(f"no size from -b {cfg.minbytes} to -e {cfg.maxbytes} holds one "
                                      f"{cfg.dtype} element per rank on {n} ranks")
    places = PLACES[cfg.collective]
    if GLOO in cfg.backends and import_torch() is None:
        if rank == 0:
            print(f"{os.path.basename(sys.argv[0])}: --backends gloo needs PyTorch (pip install torch); it is not installed",
                  file=sys.stderr, flush=True)
        return EXIT_NO_TORCH

    def show(size_rows):
        """Print one size's lines as soon as they are known (rank 0)."""
        if rank == 0:
            print("\n".join(format_rows(size_rows, places)), flush=True)

    if rank == 0:
        print(header(cfg, n), flush=True)
    harness = world.Dup()
    try:
        rows, raw = run_sweep(cfg, harness, on_size=show)
    finally:
        harness.Free()
    if rank == 0:
        print(footer(rows))
        write_outputs(cfg, rows, raw, n, argv)
        for option, path in (("--out", cfg.out), ("--csv", cfg.csv)):
            if path:
                print(f"# wrote {path} ({option})")
        sys.stdout.flush()
    return 1 if any(r["wrong"] for r in rows) else 0


if __name__ == "__main__":
    abort_on_exception()
    sys.exit(main())
