"""Measure every all-reduce algorithm on this job and write the table ``auto`` picks from.

    mpirun -n 4 python -m npddp.tune --out tuning.json            # over MPI's point-to-point layer
    python -m npddp.run --nproc 4 -m npddp.tune --out tuning.json  # over TCP
    NPDDP_TUNING=tuning.json mpirun -n 4 python -m npddp.train --backend auto

For each size (``-b`` to ``-e``, times ``-f``) every candidate algorithm runs ``--iters`` timed
all-reduces (after warm-up), the candidates interleaved, each iteration's time the slowest
rank's; that is one round, summed up by each candidate's median. Rounds repeat until the
fastest candidate's and the default's medians each vary by at most ``--tolerance`` from round to
round, or ``--max-rounds`` have run (at least ``MIN_ROUNDS``). The noise of a candidate is that
variation (max - min of its round medians, over their median).

A size goes to the fastest candidate only when it beat the default (what ``auto`` picks without
a table) in every round: its slowest round faster than the default's fastest. Otherwise the
default keeps the size, and the tuner says so (``kept: within noise``), so a table is never
slower than the default by more than the noise it measured. Neighbouring sizes won by the same
algorithm merge into one step, and a step ends halfway (geometrically) between the last size it
won and the next size. The file is valid for this transport and world size only (``auto``
checks both); rank 0 writes it. See :mod:`npddp.comm.compose.tuning` for the format. Buffers are
ordinary NumPy arrays (the shared-memory candidate stages or single-copies them). Over MPI, MPI's own
all-reduce competes as ``mpi``, timed as ``auto`` runs it (its argument check included).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from npddp.comm import DTYPES, create
from npddp.comm.compose.auto import hier_possible
from npddp.comm.compose.costmodel import candidates, model_table, node_table
from npddp.comm.compose.tuning import FORMAT, VERSION, check_table
from npddp.comm.node.memory import node_ids
from npddp.comm.node.shm import node_group
from npddp.comm.algorithms.registry import LIBRARY
from npddp.comm.transports.base import resolve_transport
from npddp.process.job import abort_on_exception
from npddp.tools.arguments import load_plugins_and_check_transport
from npddp.util import variables
from npddp.util.atomicfile import target_problem, write_bytes_atomic

PROG = "python -m npddp.tune"
#: Rounds every size runs at least, so that a round-to-round spread exists.
MIN_ROUNDS = 3


def parse_size(text: str) -> int:
    """Bytes from ``8``, ``1K``, ``64M`` (binary multiples)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    raw = text.strip().upper()
    head, unit = (raw[:-1], raw[-1]) if raw and raw[-1] in units else (raw, "")
    if not head.isdigit() or int(head) < 1:
        raise argparse.ArgumentTypeError(f"size {text!r} is not a positive number of bytes (e.g. 8, 1K, 64M)")
    return int(head) * units[unit]


def parse_args(argv=None) -> argparse.Namespace:
    """The tuner's options."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="npddp-tuning.json", metavar="PATH",
                   help="where rank 0 writes the table (default: npddp-tuning.json)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import MODULE (a dotted name or a .py path) first; it registers algorithms or "
                        "transports (repeatable)")
    p.add_argument("--transport", default="auto", metavar="NAME",
                   help="transport to tune: auto, mpi, tcp or one a plugin registers (default auto: tcp under "
                        "npddp.run, else mpi)")
    p.add_argument("-b", "--min-bytes", type=parse_size, default=parse_size("1K"), metavar="SIZE",
                   help="smallest size (default: 1K)")
    p.add_argument("-e", "--max-bytes", type=parse_size, default=parse_size("64M"), metavar="SIZE",
                   help="largest size (default: 64M)")
    p.add_argument("-f", "--factor", type=int, default=4, metavar="F", help="size step factor (default: 4)")
    p.add_argument("--dtype", default="float32", choices=DTYPES, help="element type (default: float32)")
    p.add_argument("--iters", type=int, default=20, metavar="N", help="timed iterations per size (default: 20)")
    p.add_argument("--budget", type=float, default=0.3, metavar="SECONDS",
                   help="time per size and algorithm; fewer iterations when it runs out (default: 0.3)")
    p.add_argument("--max-rounds", type=int, default=6, metavar="R",
                   help=f"most rounds per size while the measurements are not stable (default: 6, >= {MIN_ROUNDS})")
    p.add_argument("--tolerance", type=float, default=0.05, metavar="FRACTION",
                   help="stable: the best's and the default's round medians vary by at most this (default: 0.05)")
    args = p.parse_args(argv)
    load_plugins_and_check_transport(p, args)
    if args.max_bytes < args.min_bytes:
        p.error(f"-e {args.max_bytes} is smaller than -b {args.min_bytes}")
    if args.factor < 2:
        p.error(f"-f {args.factor} is out of range; valid: 2 or more")
    if args.iters < 1 or not args.budget > 0:
        p.error("--iters must be >= 1 and --budget > 0")
    if args.max_rounds < MIN_ROUNDS:
        p.error(f"--max-rounds {args.max_rounds} is out of range; valid: {MIN_ROUNDS} or more")
    if not 0 < args.tolerance < 1:
        p.error(f"--tolerance {args.tolerance} is out of range; valid: 0 < fraction < 1")
    problem = target_problem(f"--out {args.out!r}", args.out)
    if problem:
        p.error(problem)
    if os.path.lexists(args.out) and not _is_table(args.out):
        p.error(f"--out {args.out!r} exists and is not an npddp tuning table; refusing to replace it (move it "
                "away or choose another path)")
    return args


def _is_table(path: str) -> bool:
    """True when ``path`` holds an npddp tuning table (JSON with its ``format``)."""
    try:
        with open(path, "rb") as f:
            return json.load(f).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def steps_from(sizes: list[int], winners: list[str]) -> list:
    """``[[max_bytes, algorithm], ...]`` from the winner at each measured size."""
    steps: list = []
    for i, (size, name) in enumerate(zip(sizes, winners)):
        if steps and steps[-1][1] == name:
            continue
        if steps:
            steps[-1][0] = int(math.sqrt(sizes[i - 1] * size))
        steps.append([None, name])
    return steps


def measure(comms: dict, timer, nbytes: int, dtype, iters: int, budget: float) -> dict:
    """Median slowest-rank seconds of an all-reduce of ``nbytes`` for every communicator, interleaved."""
    count = max(1, nbytes // np.dtype(dtype).itemsize)
    bufs = {name: np.ones(count, dtype=dtype) for name in comms}
    times = {name: [] for name in comms}
    for comm in comms.values():  # warm-up: plans, scratch, connections
        comm.allreduce(np.ones(count, dtype=dtype))
    started = time.perf_counter()
    spent = np.zeros(1)
    for i in range(iters):
        for name, comm in comms.items():
            comm.barrier()
            t0 = time.perf_counter()
            comm.allreduce(bufs[name])
            times[name].append(time.perf_counter() - t0)
            bufs[name][:] = 1
        spent[0] = time.perf_counter() - started
        timer.allreduce(spent, "max")
        if i >= 2 and spent[0] > budget * len(comms):
            break
    result = {}
    for name, ts in times.items():
        worst = timer.allreduce(np.array(ts), "max")  # each iteration: the slowest rank
        result[name] = float(np.median(worst))
    return result


def noise(times: list[float]) -> float:
    """Round-to-round variation of one candidate: (max - min) / median of its round medians."""
    return (max(times) - min(times)) / float(np.median(times))


def decide(rounds: dict, default: str) -> tuple[str, str]:
    """``(algorithm, why)`` for one size from each candidate's round medians (seconds).

    The fastest (by the median over rounds) wins only if it beat ``default`` in every round;
    otherwise ``default`` keeps the size.
    """
    medians = {name: float(np.median(ts)) for name, ts in rounds.items()}
    best = min(medians, key=medians.get)
    if best == default:
        return default, "default fastest"
    gain = 1 - medians[best] / medians[default]
    spread = max(noise(rounds[best]), noise(rounds[default]))
    if max(rounds[best]) < min(rounds[default]):
        return best, f"{gain:.0%} faster than default {default} in every round (noise {spread:.0%})"
    return default, f"kept: within noise ({best} {gain:.0%} faster by median, noise {spread:.0%})"


def stable(rounds: dict, default: str, tolerance: float) -> bool:
    """Whether the fastest candidate's and the default's round medians each vary by at most ``tolerance``."""
    medians = {name: float(np.median(ts)) for name, ts in rounds.items()}
    best = min(medians, key=medians.get)
    return len(rounds[default]) >= MIN_ROUNDS and max(noise(rounds[best]), noise(rounds[default])) <= tolerance


def library_path(transport: str):
    """``auto`` pinned to MPI's own all-reduce (collective), or None where ``auto`` does not offer it (not over MPI)."""
    comm = create("auto", transport=transport)
    if LIBRARY not in comm.algorithms:
        return None
    comm.pin(LIBRARY)
    return comm


def defaults(comms: dict, transport: str, size: int, nodes: list):
    """``default(nbytes)``: what ``auto`` picks with no tuning table (the cost model; on one node, shm, and over MPI
    MPI's own below a size).

    ``nodes``: each rank's node id; across nodes the network model prices the candidates, as in ``auto``."""
    across = len(set(nodes)) > 1
    per_node = len(nodes) // len(set(nodes)) if "hier" in comms else 1
    library = LIBRARY in comms
    steps = node_table(size, comms[LIBRARY].algorithms[LIBRARY].library if library else None) if "shm" in comms else model_table(transport, size, across_nodes=across,
                                                                         per_node=per_node, library=library)
    return lambda nbytes: next(a for limit, a in steps if limit is None or nbytes <= limit)


def main(argv=None) -> int:
    """Tune, print the table, write the file; the exit code."""
    abort_on_exception()
    args = parse_args(argv)
    transport = resolve_transport(args.transport)
    timer = create("rd", transport=transport)
    comms = {name: create(name, transport=transport) for name in candidates()}
    nodes = node_ids(timer)
    if node_group(timer, timer._begin("setup")) is not None:  # one node: shared memory competes too
        comms["shm"] = create("shm", transport=transport)
    elif hier_possible(nodes):  # as many ranks (> 1) on every node: hier's composition competes too
        comms["hier"] = create("hier", transport=transport)
    library = library_path(transport)
    if library is not None:  # over MPI: MPI's own all-reduce, as auto runs it
        comms[LIBRARY] = library
    rank, size = timer.rank, timer.size
    default_for = defaults(comms, transport, size, nodes)
    sizes, winners, notes = [], [], []
    nbytes = args.min_bytes
    if rank == 0:
        print(f"# {PROG}: {size} ranks over {transport}, {args.dtype}, median over rounds of each round's median "
              "of the slowest rank (us) +- noise")
        print(f"{'bytes':>12} " + " ".join(f"{n:>15}" for n in comms) + "  rounds  choice (the best unless within noise of the default)")
    while nbytes <= args.max_bytes:
        default = default_for(nbytes)
        rounds: dict = {name: [] for name in comms}
        while True:
            for name, t in measure(comms, timer, nbytes, args.dtype, args.iters, args.budget).items():
                rounds[name].append(t)
            count = len(rounds[default])
            if count >= args.max_rounds or (count >= MIN_ROUNDS and stable(rounds, default, args.tolerance)):
                break
        choice, why = decide(rounds, default)
        sizes.append(nbytes)
        winners.append(choice)
        notes.append(why)
        if rank == 0:
            cells = " ".join(f"{np.median(rounds[n]) * 1e6:>9.1f} {noise(rounds[n]):>4.0%}" for n in comms)
            print(f"{nbytes:>12} {cells}  {len(rounds[default]):>6}  {choice}: {why}", flush=True)
        nbytes *= args.factor
    table = {"*": steps_from(sizes, winners)}
    data = {"format": FORMAT, "version": VERSION, "transport": transport, "world_size": size,
            "dtype_measured": args.dtype, "sizes": sizes, "winners": winners, "notes": notes, "table": table}
    check_table(data, transport, size, "shm" in comms, "hier" in comms, LIBRARY in comms)
    if rank == 0:
        try:
            write_bytes_atomic(args.out, json.dumps(data, indent=1).encode())
        except OSError as exc:
            print(f"error: cannot write {args.out}: {exc.strerror or exc}; the previous file is kept",
                  file=sys.stderr, flush=True)
            return 4
        print(f"# wrote {args.out}: " + ", ".join(f"<= {m} B: {a}" if m else f"above: {a}" for m, a in table["*"]))
        print(f"# use it: {variables.TUNING.name}={args.out} (or create('auto', tuning='{args.out}'))")
    timer.barrier()
    return 0
