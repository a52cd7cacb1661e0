"""Size sweep of a collective over npddp backends, in the manner of nccl-tests and OSU.

Run it with MPI (the defaults sweep all-reduce from 8 B to 256 MiB on every backend)::

    mpirun -n 2 python benchmarks/allreduce.py
    mpirun -n 4 python benchmarks/allreduce.py --backends mpi,ring -b 1K -e 64M -f 4 --out ar.h5
    mpirun -n 4 python benchmarks/allreduce.py --collective allgather --dtype float64

Method. For each size, then each backend, then each place (in place, out of place):
warm-up iterations, then timed iterations, each started by a barrier and timed on every
rank; an iteration's time is the maximum over ranks (one all-reduce of all the timings at
the end). The first warm-up iteration sizes the run: timed iterations are ``--iters`` cut
to fit ``--budget`` seconds (but at least 3, or ``--iters`` if fewer), extra warm-ups are
cut to a quarter of it. Timed iterations reuse their buffers back to back (values may
grow; that does not change the timing). Then one checked iteration on fresh data whose
exact result is known: rank r holds ``f((i + r) % m)`` for small integers f, m chosen so
every partial result is exact in the dtype (float16 sums: up to 1024 ranks), and
``#wrong`` counts the elements, summed over ranks, that differ from it (an out-of-place
call that alters its input counts too). The exit status is 1 when any ``#wrong`` is
non-zero; bad arguments print one error (rank 0) and exit 2 on every rank.

Sizes and bandwidth. ``bytes`` is the size of the whole vector (nccl-tests' convention):
the all-reduce/broadcast buffer, the reduce-scatter input, the all-gather output (each rank
sends ``bytes / N``). Sizes are rounded down to whole elements (all-gather: to a multiple of
N elements). ``algbw = bytes / median time``, ``busbw = algbw * factor`` with factor
2(N-1)/N for allreduce, (N-1)/N for allgather and reduce_scatter, 1 for broadcast; GB = 1e9 B.
Places: allreduce is timed in place and with ``out=``; broadcast in place only; allgather
and reduce_scatter in their natural form, which returns a new array ("outofplace").

HDF5 layout (``--out``; rank 0 writes it atomically)::

    /                       attributes: kind = "allreduce_sweep", collective, dtype, op
                            ("none" for broadcast/allgather), world_size, backends (str
                            array), places (str array), argv (JSON list), config (JSON) and
                            config.<option> per option, plus the run environment of
                            npddp.runinfo.environment (schema_version, MPI library, versions,
                            host, cpu_model, threads_per_rank, time_utc, git_commit, ...)
    /<backend>/<place>      place "inplace" or "outofplace"; attributes backend, place,
                            busbw_factor; datasets, n = number of sizes:
        bytes          (n,)           int64    message size in bytes
        count          (n,)           int64    elements in the whole vector
        iters          (n,)           int64    timed iterations at each size
        time_s         (n, --iters)   float64  per-iteration time, max over ranks; NaN past iters
        time_min_s, time_median_s, time_max_s   (n,) float64   over the timed iterations
        algbw_GBps, busbw_GBps                  (n,) float64   from the median time
        wrong          (n,)           int64    wrong elements in the checked iteration
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from mpi4py import MPI

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _common as bc  # noqa: E402
from npddp import comm as npcomm  # noqa: E402
from npddp import runinfo  # noqa: E402
from npddp.launch import abort_on_exception  # noqa: E402

KIND = "allreduce_sweep"
MIN_ITERS = 3
PLACES = {"allreduce": ("inplace", "outofplace"), "broadcast": ("inplace",),
          "allgather": ("outofplace",), "reduce_scatter": ("outofplace",)}
REDUCING = ("allreduce", "reduce_scatter")
_EXACT_LIMIT = {"float16": 2**11, "float32": 2**24, "float64": 2**53, "int32": 2**31 - 1, "int64": 2**63 - 1}
_PERIOD = 1021  # a prime, so block-size shifts of the data are almost never invisible


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
    p = bc.RankParser(prog="allreduce.py", verbose=verbose,
                    description="Time a collective over npddp backends across message sizes.")
    p.add_argument("--backends", default=",".join(npcomm.BACKENDS),
                   help=f"comma-separated backends (default: %(default)s; valid: {', '.join(npcomm.BACKENDS)})")
    p.add_argument("--collective", default="allreduce", choices=bc.COLLECTIVES)
    p.add_argument("-b", "--minbytes", type=_size, default=8, help="smallest size, e.g. 8, 1K (default 8)")
    p.add_argument("-e", "--maxbytes", type=_size, default=256 << 20, help="largest size (default 256M)")
    p.add_argument("-f", "--factor", type=int, default=2, help="size multiplication factor >= 2 (default 2)")
    p.add_argument("--iters", "-n", type=_positive_int, default=20,
                   help="timed iterations per size, cut to fit --budget (default 20)")
    p.add_argument("--warmup", "-w", type=_positive_int, default=5, help="warm-up iterations (default 5, >= 1)")
    p.add_argument("--budget", type=float, default=1.0,
                   help="seconds of timed iterations per size, backend and place (default 1.0)")
    p.add_argument("--dtype", default="float32", choices=npcomm.DTYPES)
    p.add_argument("--op", default=None, choices=tuple(npcomm.OPS),
                   help="reduction for allreduce and reduce_scatter (default sum)")
    p.add_argument("--out", default="", help="write an HDF5 dump here (rank 0)")
    return p


def parse_config(argv, verbose: bool = True) -> SweepConfig:
    """Parse and check ``argv``; on bad input print (if verbose) and raise SystemExit(2)."""
    parser = build_parser(verbose)
    a = parser.parse_args(argv)
    backends = tuple(b.strip() for b in a.backends.split(","))
    bad = [b for b in backends if b not in npcomm.BACKENDS]
    if bad or not backends:
        parser.error(f"--backends: unknown backend {bad[0] if bad else ''!r}; valid: {', '.join(npcomm.BACKENDS)}")
    if len(set(backends)) != len(backends):
        parser.error(f"--backends: {a.backends!r} names a backend twice")
    if a.factor < 2:
        parser.error(f"-f/--factor must be an int >= 2, got {a.factor}")
    itemsize = np.dtype(a.dtype).itemsize
    if a.minbytes < itemsize:
        parser.error(f"-b/--minbytes {a.minbytes} is smaller than one {a.dtype} element ({itemsize} bytes)")
    if a.minbytes > a.maxbytes:
        parser.error(f"-b/--minbytes {a.minbytes} is larger than -e/--maxbytes {a.maxbytes}")
    if not a.budget > 0:
        parser.error(f"--budget must be > 0 seconds, got {a.budget}")
    if a.op is not None and a.collective not in REDUCING:
        parser.error(f"--op applies to {' and '.join(REDUCING)} only, not {a.collective}")
    op = (a.op or "sum") if a.collective in REDUCING else "none"
    return SweepConfig(backends, a.collective, a.dtype, op, a.minbytes, a.maxbytes, a.factor,
                       a.iters, a.warmup, float(a.budget), a.out)


def sizes(cfg: SweepConfig, n: int) -> np.ndarray:
    """Element counts of the whole vector, one per distinct size; shape (n_sizes,)."""
    itemsize = np.dtype(cfg.dtype).itemsize
    counts, nbytes = [], cfg.minbytes
    while nbytes <= cfg.maxbytes:
        count = nbytes // itemsize
        if cfg.collective == "allgather":
            count -= count % n
        if count and count not in counts:
            counts.append(count)
        nbytes *= cfg.factor
    return np.array(counts, dtype=np.int64)


# ----------------------------------------------------------------------------- exact data

def data_table(op: str, dtype: str, n: int) -> np.ndarray:
    """Values f(0..m-1) held by the ranks; shape (m,), int64, every reduction exact in ``dtype``."""
    if op == "prod":  # m >= n: each residue meets an index at most once, so products are in {±1, ±2}
        f = np.ones(max(_PERIOD, n), dtype=np.int64)
        f[0], f[1] = -1, 2
        return f
    m = _PERIOD if op in ("max", "min", "none") else max(1, min(_PERIOD, _EXACT_LIMIT[dtype] // n))
    return np.arange(m, dtype=np.int64)


def periodic(table: np.ndarray, start: int, length: int, dtype) -> np.ndarray:
    """``table[(start + i) % m]`` for i < length, as ``dtype``; shape (length,)."""
    m = table.size
    return np.resize(table[(start + np.arange(m)) % m].astype(dtype), length)


def reduced_table(f: np.ndarray, op: str, n: int) -> np.ndarray:
    """R[h] = op over ranks r < n of f[(h + r) % m]; shape (m,), int64."""
    m = f.size
    held = f[(np.arange(m)[:, None] + np.arange(n)[None, :]) % m]  # (m, n)
    return npcomm.OPS[op].reduce(held, axis=1)


def block(count: int, n: int, rank: int) -> tuple[int, int]:
    """[lo, hi) of ``rank``'s block of ``np.array_split(range(count), n)``."""
    q, r = divmod(count, n)
    lo = rank * q + min(rank, r)
    return lo, lo + q + (rank < r)


def _sentinel(dtype) -> float | int:
    """A value no exact result can take: NaN for floats, the minimum for ints."""
    dt = np.dtype(dtype)
    return np.nan if dt.kind == "f" else np.iinfo(dt).min


def _mismatches(got: np.ndarray, expected: np.ndarray) -> int:
    """Elements of ``got`` that differ from ``expected`` (all of them if the shapes differ)."""
    if got.shape != expected.shape:
        return max(got.size, expected.size)
    return int(np.count_nonzero(got != expected))


def kernel(comm, collective: str, place: str, count: int, dtype: str, op: str):
    """(run, check): ``run()`` does one call on reused buffers; ``check()`` one on fresh data -> #wrong."""
    n, rank = comm.size, comm.rank
    f = data_table(op, dtype, n)

    def own(length):
        """This rank's fresh check data."""
        return periodic(f, rank, length, dtype)

    if collective == "allgather":
        blk = count // n
        src = own(blk)
        return (lambda: comm.allgather(src),
                lambda: _mismatches(comm.allgather(own(blk)),
                                    np.stack([periodic(f, r, blk, dtype) for r in range(n)])))
    if collective == "broadcast":
        buf = own(count)

        def check():
            buf[...] = periodic(f, 0, count, dtype) if rank == 0 else _sentinel(dtype)
            comm.broadcast(buf, 0)
            return _mismatches(buf, periodic(f, 0, count, dtype))
        return (lambda: comm.broadcast(buf, 0)), check
    total = reduced_table(f, op, n)
    if collective == "reduce_scatter":
        src = own(count)
        lo, hi = block(count, n, rank)
        return (lambda: comm.reduce_scatter(src, op),
                lambda: _mismatches(comm.reduce_scatter(own(count), op), periodic(total, lo, hi - lo, dtype)))
    buf = own(count)
    if place == "inplace":
        def check():
            buf[...] = own(count)
            comm.allreduce(buf, op)
            return _mismatches(buf, periodic(total, 0, count, dtype))
        return (lambda: comm.allreduce(buf, op)), check
    out = np.empty_like(buf)

    def check():
        buf[...] = own(count)
        out.fill(_sentinel(dtype))
        comm.allreduce(buf, op, out=out)
        return _mismatches(out, periodic(total, 0, count, dtype)) + _mismatches(buf, own(count))
    return (lambda: comm.allreduce(buf, op, out=out)), check


# ----------------------------------------------------------------------------- timing

def _timed(run, harness) -> float:
    """Barrier, then the seconds one ``run()`` takes on this rank."""
    harness.Barrier()
    t0 = time.perf_counter()
    run()
    return time.perf_counter() - t0


def measure(run, check, harness, iters: int, warmup: int, budget: float) -> tuple[np.ndarray, int]:
    """Warm up, time, check: (this rank's per-iteration seconds, shape (k,), k <= iters; #wrong here)."""
    first = np.array([_timed(run, harness)])
    harness.Allreduce(MPI.IN_PLACE, first, op=MPI.MAX)  # every rank must agree on the counts below
    est = max(float(first[0]), 1e-9)
    for _ in range(min(warmup - 1, int(0.25 * budget / est))):
        _timed(run, harness)
    k = min(iters, max(MIN_ITERS, int(budget / est)))
    times = np.array([_timed(run, harness) for _ in range(k)])
    return times, check()


@dataclass
class GroupResult:
    """One backend and place over all sizes; ``time_s`` is (n_sizes, iters), NaN past ``iters``."""

    backend: str
    place: str
    busbw_factor: float
    bytes: np.ndarray
    count: np.ndarray
    iters: np.ndarray
    time_s: np.ndarray
    wrong: np.ndarray

    def stats(self) -> dict:
        """Per-size min/median/max time and bandwidths, as (n_sizes,) arrays."""
        median = np.nanmedian(self.time_s, axis=1)
        algbw = self.bytes / median / bc.GB
        return {"time_min_s": np.nanmin(self.time_s, axis=1), "time_median_s": median,
                "time_max_s": np.nanmax(self.time_s, axis=1), "algbw_GBps": algbw,
                "busbw_GBps": algbw * self.busbw_factor}


def run_sweep(cfg: SweepConfig, harness) -> list[GroupResult]:
    """Measure every size x backend x place on the MPI communicator ``harness``."""
    n = harness.Get_size()
    counts = sizes(cfg, n)
    places = PLACES[cfg.collective]
    subcomms = [harness.Dup() for _ in cfg.backends]
    try:
        comms = [npcomm.create(name, sub) for name, sub in zip(cfg.backends, subcomms)]
        groups = [(b, p) for b in range(len(comms)) for p in places]
        times = np.zeros((len(groups), counts.size, cfg.iters))  # (groups, sizes, iters)
        iters = np.zeros((len(groups), counts.size), dtype=np.int64)
        wrong = np.zeros((len(groups), counts.size), dtype=np.int64)
        for s, count in enumerate(counts):
            for g, (b, place) in enumerate(groups):
                run, check = kernel(comms[b], cfg.collective, place, int(count), cfg.dtype, cfg.op)
                t, wrong[g, s] = measure(run, check, harness, cfg.iters, cfg.warmup, cfg.budget_s)
                times[g, s, :t.size] = t
                iters[g, s] = t.size
                del run, check
    finally:
        for sub in subcomms:
            sub.Free()
    harness.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    harness.Allreduce(MPI.IN_PLACE, wrong, op=MPI.SUM)
    times[np.arange(cfg.iters)[None, None, :] >= iters[:, :, None]] = np.nan
    nbytes = counts * np.dtype(cfg.dtype).itemsize
    factor = bc.busbw_factor(cfg.collective, n)
    return [GroupResult(cfg.backends[b], place, factor, nbytes, counts.copy(), iters[g], times[g], wrong[g])
            for g, (b, place) in enumerate(groups)]


# ----------------------------------------------------------------------------- output

def format_table(cfg: SweepConfig, results: list[GroupResult], n: int) -> str:
    """nccl-tests-like table: size, count, type, op, then time/algbw/busbw/#wrong per group."""
    label = {"inplace": "in-place", "outofplace": "out-of-place"}
    head1 = f"#{'':>9} {'':>11} {'':>8} {'':>5}"
    head2 = f"#{'size':>9} {'count':>11} {'type':>8} {'redop':>5}"
    for r in results:
        head1 += f"   {r.backend + ' ' + label[r.place]:^37}"
        head2 += f"   {'time(us)':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>9}"
    lines = [f"# {cfg.collective} on {n} ranks: {cfg.dtype}, op {cfg.op}; "
             "time = median over iterations of the max over ranks; bandwidth in GB/s", head1, head2]
    stats = [r.stats() for r in results]
    for s in range(results[0].bytes.size):
        nbytes, count = int(results[0].bytes[s]), int(results[0].count[s])
        line = f" {bc.format_size(nbytes):>9} {count:>11} {cfg.dtype:>8} {cfg.op:>5}"
        for r, st in zip(results, stats):
            line += (f"   {st['time_median_s'][s] * 1e6:>10.1f} {st['algbw_GBps'][s]:>7.3f}"
                     f" {st['busbw_GBps'][s]:>7.3f} {int(r.wrong[s]):>9d}")
        lines.append(line)
    total_wrong = int(sum(int(r.wrong.sum()) for r in results))
    lines.append(f"# #wrong in all checked iterations: {total_wrong} ({'OK' if total_wrong == 0 else 'FAILED'})")
    return "\n".join(lines)


def format_ratios(results: list[GroupResult], baseline: str = "mpi") -> str:
    """Median time of each backend over ``baseline``'s, per size and place ("" if not both present)."""
    base = {r.place: r for r in results if r.backend == baseline}
    others = [r for r in results if r.backend != baseline and r.place in base]
    if not others:
        return ""
    lines = [f"# time ratio to {baseline} (median time; > 1 is slower than {baseline})",
             f"#{'size':>9}" + "".join(f" {r.backend + '/' + baseline + ' ' + r.place:>22}" for r in others)]
    medians = {id(r): r.stats()["time_median_s"] for r in results}
    for s in range(results[0].bytes.size):
        lines.append(f" {bc.format_size(int(results[0].bytes[s])):>9}" + "".join(
            f" {medians[id(r)][s] / medians[id(base[r.place])][s]:>22.2f}" for r in others))
    return "\n".join(lines)


def write_dump(path: str, cfg: SweepConfig, results: list[GroupResult], n: int, argv) -> None:
    """Write the sweep as HDF5 (layout in the module docstring), atomically."""
    with runinfo.atomic_h5(path) as f:
        runinfo.write_attrs(f, runinfo.environment(world_size=n, backend=cfg.backends))
        runinfo.write_attrs(f, {"kind": KIND, "collective": cfg.collective, "dtype": cfg.dtype, "op": cfg.op,
                                "backends": list(cfg.backends), "places": list(PLACES[cfg.collective]),
                                "argv": json.dumps(list(argv)), "config": asdict(cfg)})
        for r in results:
            g = f.require_group(r.backend).create_group(r.place)
            runinfo.write_attrs(g, {"backend": r.backend, "place": r.place, "busbw_factor": r.busbw_factor})
            for name, value in {"bytes": r.bytes, "count": r.count, "iters": r.iters, "time_s": r.time_s,
                                **r.stats(), "wrong": r.wrong}.items():
                g.create_dataset(name, data=value)


def _out_dir_ok(path: str) -> bool:
    """True if ``path``'s directory exists and is writable."""
    directory = os.path.dirname(os.path.abspath(path))
    return os.path.isdir(directory) and os.access(directory, os.W_OK) and not os.path.isdir(path)


def main(argv=None, mpi_comm=None) -> int:
    """Run the sweep on ``mpi_comm`` (default COMM_WORLD); 0 if every result was exact, else 1."""
    world = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
    argv = sys.argv[1:] if argv is None else list(argv)
    rank, n = world.Get_rank(), world.Get_size()
    cfg = parse_config(argv, verbose=rank == 0)
    counts = sizes(cfg, n)
    if cfg.out:
        ok = np.array([_out_dir_ok(cfg.out) if rank == 0 else True], dtype=np.int8)
        world.Bcast(ok, root=0)
        if not ok[0]:
            build_parser(rank == 0).error(f"--out {cfg.out!r}: its directory does not exist or is not writable")
    if counts.size == 0:
        build_parser(rank == 0).error(f"no size from -b {cfg.minbytes} to -e {cfg.maxbytes} holds one "
                                      f"{cfg.dtype} element per rank on {n} ranks")
    if rank == 0:
        print(f"# npddp {cfg.collective} sweep: {n} ranks, backends {','.join(cfg.backends)}, "
              f"{counts.size} sizes {bc.format_size(cfg.minbytes)}..{bc.format_size(cfg.maxbytes)} x{cfg.factor}, "
              f"iters <= {cfg.iters} (budget {cfg.budget_s:g} s), warm-up <= {cfg.warmup}", flush=True)
    harness = world.Dup()
    try:
        results = run_sweep(cfg, harness)
    finally:
        harness.Free()
    if rank == 0:
        print(format_table(cfg, results, n))
        ratios = format_ratios(results)
        if ratios:
            print(ratios)
        if cfg.out:
            write_dump(cfg.out, cfg, results, n, argv)
            print(f"# wrote {cfg.out}")
        sys.stdout.flush()
    return 1 if any(int(r.wrong.sum()) for r in results) else 0


if __name__ == "__main__":
    abort_on_exception()
    sys.exit(main())
