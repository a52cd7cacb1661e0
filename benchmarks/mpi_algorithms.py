"""Each MPI library's own algorithms of a collective, forced one at a time, beside the library's default choice.

    python benchmarks/mpi_algorithms.py -n 4 -b 1K -e 64M -f 4 --out mpi_algorithms.h5
    python benchmarks/mpi_algorithms.py -n 2 --algorithms ring,tree -b 1K -e 64K -f 8 --iters 5 --out a.h5
    python benchmarks/mpi_algorithms.py -n 2 --collective allgather -b 1K -e 16M -f 16 --out ag.h5   # MPI_Allgather's
    python benchmarks/mpi_algorithms.py -n 4 --backends ring,rabenseifner --out both.h5  # npddp's in the same dump
    python benchmarks/mpi_algorithms.py --list --collective broadcast  # what the active MPI lets a user force
    python benchmarks/mpi_algorithms.py --cluster 2x1@1gbit --lock /tmp/cluster.lock -b 1K -e 32M -f 8 --out c.h5
    python benchmarks/report.py mpi_algorithms.h5 ar.h5                # drawn beside npddp's algorithms

MPI's collectives are not one algorithm each: each library picks one of several by size and
lets a user force one through environment variables (:data:`LIBRARIES`, one entry per library,
one menu per collective: ``MPIR_CVAR_<COLL>_INTRA_ALGORITHM`` for MPICH,
``coll_tuned_<coll>_algorithm`` with ``coll_tuned_use_dynamic_rules`` for Open MPI,
``I_MPI_ADJUST_<COLL>`` for Intel MPI; a reduce-scatter sets the variables of both
``MPI_Reduce_scatter``, which npddp's ``mpi`` backend calls, and ``MPI_Reduce_scatter_block``,
which the bare ``raw`` loop calls, where the library has the algorithm for both). This script
finds the active library (mpi4py's ``MPI.Get_library_version`` in a small subprocess), then runs
benchmarks/collectives.py (``--collective``, default allreduce; backend ``mpi`` and the ``raw``
loop beside it, or ``raw`` alone for a collective npddp has no call for yet) under ``-n`` ranks once with none of
the library's variables set (``mpi:default``) and once per algorithm with its variables set
(``mpi:<algorithm>``), each a fresh job of the mpirun beside this Python (else the one on PATH)
with a time limit (``--timeout``). Every flag this script does not know goes to collectives.py
unchanged (sizes, iterations, dtype, buffers, ...); ``--backends`` adds npddp backends to the
default run, so one dump holds both. ``--cluster KxR@RATE`` runs each job across K emulated
nodes of R ranks with links of RATE instead (``python -m npddp.cluster --launcher mpi``, a fresh
cluster per run; ``-n`` is then K x R), each under ``flock --lock FILE`` when given, so jobs of
other users of the emulated clusters never overlap with one. Each run's record holds the load
average (``/proc/loadavg``) before and after it. ``--rounds R`` runs every job R times, in ABBA
order (round 2 backwards), and pools each algorithm's iterations over its rounds: a load that
drifts while the jobs run, as on a shared machine, then weighs on every algorithm alike.

Every run is checked: collectives.py's ``#wrong`` must be 0; a run that fails, times out or
returns wrong results is reported in the summary (its rows, if any, stay in the dump) and the
other runs still go on. A forced algorithm whose p10-p90 range of times overlaps the default's
at every size and place is marked "suspect: not honoured?" (the library may ignore the variable
for these arguments, or fall back; MPICH says when it falls back, and the summary counts those
notices). On a loaded machine wide spreads make many suspects: read them with the spreads.

Output: one summary line per run, then ``--out`` writes one ``allreduce_sweep`` dump of every
run's rows whose ``backend`` reads ``mpi:<algorithm>`` (``algorithm`` the same), with the
library's name (``mpi_library``), its family (``mpi_family``) and each run's variables and status
(``mpi_algorithms``, JSON) as attributes; ``--csv`` the same rows as CSV. Exit status: 0 when
every run ran and was exact, 1 otherwise, 2 on bad arguments or a library not in the table.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder, so `benchmarks` imports as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from npddp.cluster.shaping import parse_rate
from npddp.process.cleanup import Watch
from npddp.util.atomicfile import target_problem
from npddp.util.runinfo import library_name

from benchmarks import _common as bc
from benchmarks.columns import RAW
from benchmarks import results

PROG = "mpi_algorithms.py"
KIND = "allreduce_sweep"
SWEEP = Path(__file__).resolve().with_name("collectives.py")
DEFAULT = "default"
#: The ``backend`` of MPI's rows: ``mpi:<algorithm>``.
PREFIX = "mpi:"
EXIT_BAD = 2
_GRACE_S = 3.0          # between SIGTERM and SIGKILL of a run past its limit


@dataclass(frozen=True)
class Algorithm:
    """One algorithm a library lets a user force: its name, the variables that force it, what it is."""

    name: str
    env: dict
    about: str
    component: str = ""     # an Open MPI coll component it needs (skipped where the build lacks it)


@dataclass(frozen=True)
class Library:
    """How one MPI library names and forces its algorithms of each collective (``menus``: collective -> algorithms)."""

    family: str
    marker: str                         # text in the first line of its version string
    source: str                         # where the lists come from
    menus: dict
    launcher_args: tuple = ()           # always given to its mpirun
    root_args: tuple = ()               # given when running as root
    fallback_notice: str = ""           # what it prints when a forced algorithm cannot run
    probe: tuple = ()                   # command listing a component (with {component}); empty output: absent

    def menu(self, collective: str) -> tuple:
        """The algorithms this library lets a user force for ``collective`` (empty when none)."""
        return self.menus.get(collective, ())

    def all_variables(self) -> set:
        """Every variable an algorithm of this library sets, of any collective (unset for the default run)."""
        return {k for menu in self.menus.values() for a in menu for k in a.env}


#: The MPI calls whose algorithm variables each collective's forced runs set: the sweep's ``mpi`` row calls the
#: first (npddp's ``mpi`` backend), its ``raw`` row the last (:mod:`benchmarks._raw`); reduce-scatter sets both.
CALLS = {"allreduce": ("ALLREDUCE",), "allgather": ("ALLGATHER",), "reduce_scatter": ("REDUCE_SCATTER",
         "REDUCE_SCATTER_BLOCK"), "alltoall": ("ALLTOALL",), "broadcast": ("BCAST",)}


def _mpich(name: str, about: str, *, collective: str = "allreduce") -> Algorithm:
    """An MPICH algorithm: the MPIR-level choice, with the device's own collectives off so it is used."""
    chosen = {f"MPIR_CVAR_{call}_INTRA_ALGORITHM": name for call in CALLS[collective]}
    return Algorithm(name, {**chosen, "MPIR_CVAR_DEVICE_COLLECTIVES": "none", "MPIR_CVAR_COLLECTIVE_FALLBACK": "print"},
                     about)


def _tuned(value: int | None, name: str, about: str, block: int | None = None, *, collective: str = "allreduce") -> Algorithm:
    """An Open MPI coll/tuned algorithm, forced by dynamic rules, with han (which would take precedence) off.

    Reduce-scatter: ``value`` is MPI_Reduce_scatter's number, ``block`` MPI_Reduce_scatter_block's (either may be
    None where that call has no such algorithm)."""
    calls = {"reduce_scatter": (("reduce_scatter", value), ("reduce_scatter_block", block)),
             "broadcast": (("bcast", value),)}.get(collective, ((collective, value),))
    chosen = {f"OMPI_MCA_coll_tuned_{call}_algorithm": str(v) for call, v in calls if v is not None}
    return Algorithm(name, {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1", **chosen, "OMPI_MCA_coll": "^han"}, about)


def _han(name: str, about: str) -> Algorithm:
    """An Open MPI coll/han algorithm (hierarchical: node, then across nodes), han given the highest priority."""
    return Algorithm(f"han_{name}", {"OMPI_MCA_coll_han_priority": "100",
                                     "OMPI_MCA_coll_han_use_allreduce_algorithm": name}, about, component="han")


def _intel(value: int, name: str, about: str, *, collective: str = "allreduce") -> Algorithm:
    """An Intel MPI preset (reduce-scatter: the same number for MPI_Reduce_scatter and MPI_Reduce_scatter_block)."""
    return Algorithm(name, {f"I_MPI_ADJUST_{call}": str(value) for call in CALLS[collective]}, about)


def _menus(make, lists: dict) -> dict:
    """{collective: algorithms} from ``lists`` {collective: ((args of make), ...)}, each made with its collective."""
    return {coll: tuple(make(*args, collective=coll) for args in entries) for coll, entries in lists.items()}


_MPICH_MENUS = _menus(_mpich, {
    "allgather": (("auto", "MPIR-level selection (with the device's override off)"), ("brucks", "Bruck's"),
                  ("k_brucks", "radix-k Bruck's (MPIR_CVAR_ALLGATHER_BRUCKS_KVAL)"),
                  ("nb", "the non-blocking algorithm, waited for"), ("recursive_doubling", "recursive doubling"),
                  ("ring", "ring"), ("recexch_doubling", "recursive exchange, distance doubling"),
                  ("recexch_halving", "recursive exchange, distance halving")),
    "reduce_scatter": (("auto", "MPIR-level selection (with the device's override off)"),
                       ("nb", "the non-blocking algorithm, waited for"),
                       ("noncommutative", "the algorithm for non-commutative ops"), ("pairwise", "pairwise exchange"),
                       ("recursive_doubling", "recursive doubling"), ("recursive_halving", "recursive halving")),
    "alltoall": (("auto", "MPIR-level selection (with the device's override off)"), ("brucks", "Bruck's"),
                 ("k_brucks", "radix-k Bruck's (MPIR_CVAR_ALLTOALL_BRUCKS_KVAL)"),
                 ("nb", "the non-blocking algorithm, waited for"), ("pairwise", "pairwise exchange"),
                 ("pairwise_sendrecv_replace", "pairwise exchange with MPI_Sendrecv_replace"),
                 ("scattered", "every send and receive posted at once, in batches")),
    "broadcast": (("auto", "MPIR-level selection (with the device's override off)"), ("binomial", "binomial tree"),
                  ("nb", "the non-blocking algorithm, waited for"),
                  ("smp", "node-aware: across nodes, then on each node"),
                  ("scatter_recursive_doubling_allgather", "scatter, then recursive-doubling all-gather"),
                  ("scatter_ring_allgather", "scatter, then ring all-gather"),
                  ("pipelined_tree", "pipelined tree (MPIR_CVAR_BCAST_TREE_TYPE)"),
                  ("tree", "tree (MPIR_CVAR_BCAST_TREE_TYPE)")),
})
_OPEN_MPI_MENUS = _menus(_tuned, {
    "allgather": ((1, "linear", "gather to rank 0, then broadcast"), (2, "bruck", "Bruck's"),
                  (3, "recursive_doubling", "recursive doubling"), (4, "ring", "ring"),
                  (5, "neighbor", "neighbour exchange"), (6, "two_proc", "two ranks only"),
                  (7, "sparbit", "sparbit (data-locality aware)")),
    "reduce_scatter": ((1, "basic_linear", "reduce to rank 0, then scatter", 1),
                       (None, "recursive_doubling", "recursive doubling (MPI_Reduce_scatter_block only)", 2),
                       (2, "recursive_halving", "recursive halving", 3),
                       (3, "ring", "ring (MPI_Reduce_scatter only)", None),
                       (4, "butterfly", "butterfly", 4)),
    "alltoall": ((1, "linear", "every send and receive posted at once"), (2, "pairwise", "pairwise exchange"),
                 (3, "modified_bruck", "modified Bruck's"), (4, "linear_sync", "linear, a bounded number at a time"),
                 (5, "two_proc", "two ranks only")),
    "broadcast": ((1, "basic_linear", "root sends to every rank"), (2, "chain", "pipelined chain"),
                  (3, "pipeline", "pipeline"), (4, "split_binary_tree", "split binary tree"),
                  (5, "binary_tree", "binary tree"), (6, "binomial", "binomial tree"), (7, "knomial", "k-nomial tree"),
                  (8, "scatter_allgather", "scatter, then all-gather"),
                  (9, "scatter_allgather_ring", "scatter, then ring all-gather")),
})
_INTEL_MENUS = _menus(_intel, {
    "allgather": ((1, "recursive_doubling", "recursive doubling"), (2, "brucks", "Bruck's"), (3, "ring", "ring"),
                  (4, "topo_gatherv_bcast", "topology-aware gatherv, then broadcast"), (5, "knomial", "k-nomial")),
    "reduce_scatter": ((1, "recursive_halving", "recursive halving"), (2, "pairwise", "pairwise exchange"),
                       (3, "recursive_doubling", "recursive doubling"), (4, "reduce_scatterv", "reduce, then scatter")),
    "alltoall": ((1, "brucks", "Bruck's"), (2, "isend_irecv_waitall", "every send and receive posted, then waitall"),
                 (3, "pairwise", "pairwise exchange"), (4, "plum", "Plum's")),
    "broadcast": ((1, "binomial", "binomial tree"), (2, "recursive_doubling", "recursive doubling"), (3, "ring", "ring"),
                  (4, "topo_binomial", "topology-aware binomial"),
                  (5, "topo_recursive_doubling", "topology-aware recursive doubling"), (6, "topo_ring", "topology-aware ring"),
                  (7, "shumilin", "Shumilin's"), (8, "knomial", "k-nomial"),
                  (9, "topo_shm_flat", "topology-aware, shared-memory based, flat"),
                  (10, "topo_shm_knomial", "topology-aware, shared-memory based, k-nomial"),
                  (11, "topo_shm_knary", "topology-aware, shared-memory based, k-ary")),
})

#: Per library: the variables that force each algorithm of each collective, and the source of the lists.
LIBRARIES = (
    Library("MPICH", "MPICH", "mpivars (MPICH 5.0.2's own lists of MPIR_CVAR_<COLL>_INTRA_ALGORITHM values)", {
        "allreduce": (
            _mpich("auto", "MPIR-level selection (with the device's override off)"),
            _mpich("nb", "the non-blocking algorithm, waited for"),
            _mpich("smp", "node-aware: reduce on the node, across nodes, broadcast on the node"),
            _mpich("recursive_doubling", "recursive doubling"),
            _mpich("recursive_multiplying", "recursive multiplying (radix MPIR_CVAR_ALLREDUCE_RECURSIVE_MULTIPLYING_KVAL)"),
            _mpich("reduce_scatter_allgather", "Rabenseifner's reduce-scatter then all-gather"),
            _mpich("tree", "pipelined tree (MPIR_CVAR_ALLREDUCE_TREE_TYPE)"),
            _mpich("recexch", "recursive exchange"),
            _mpich("ring", "ring"),
            _mpich("k_reduce_scatter_allgather", "k-port reduce-scatter then all-gather"),
            _mpich("ccl", "a vendor collective library (CCL), where MPICH was built with one"),
        ), **_MPICH_MENUS}, fallback_notice="cannot be applied"),
    Library("Open MPI", "Open MPI", "ompi_info --all (Open MPI 5.0.11: coll_tuned_<coll>_algorithm, "
                                   "coll_han_use_allreduce_algorithm, the coll components)", {
        "allreduce": (
            _tuned(1, "basic_linear", "reduce to rank 0, then broadcast, both linear"),
            _tuned(2, "nonoverlapping", "tuned reduce, then tuned broadcast"),
            _tuned(3, "recursive_doubling", "recursive doubling"),
            _tuned(4, "ring", "ring"),
            _tuned(5, "segmented_ring", "ring in segments (coll_tuned_allreduce_algorithm_segmentsize)"),
            _tuned(6, "rabenseifner", "Rabenseifner's reduce-scatter then all-gather"),
            _han("simple", "han's simple: reduce on the node, all-reduce across nodes, broadcast on the node"),
            _han("reproducible", "han's reproducible order of reduction"),
            Algorithm("xhc", {"OMPI_MCA_coll_xhc_priority": "100"}, "XPMEM-based hierarchical collectives",
                      component="xhc"),
        ), **_OPEN_MPI_MENUS}, launcher_args=("--oversubscribe",), root_args=("--allow-run-as-root",),
        probe=("ompi_info", "--param", "coll", "{component}", "--parsable")),
    Library("Intel MPI", "Intel(R) MPI", "Intel MPI Developer Reference, I_MPI_ADJUST family (the numbered lists of "
                                         "the 2020 Update 2 edition; 2021 editions list the same algorithms)", {
        "allreduce": (
            _intel(1, "recursive_doubling", "recursive doubling"),
            _intel(2, "rabenseifner", "Rabenseifner's"),
            _intel(3, "reduce_bcast", "reduce, then broadcast"),
            _intel(4, "topo_reduce_bcast", "topology-aware reduce, then broadcast"),
            _intel(5, "binomial_gather_scatter", "binomial gather and scatter"),
            _intel(6, "topo_binomial_gather_scatter", "topology-aware binomial gather and scatter"),
            _intel(7, "shumilin_ring", "Shumilin's ring"),
            _intel(8, "ring", "ring"),
            _intel(9, "knomial", "k-nomial"),
            _intel(10, "topo_shm_flat", "topology-aware, shared-memory based, flat"),
            _intel(11, "topo_shm_knomial", "topology-aware, shared-memory based, k-nomial"),
            _intel(12, "topo_shm_knary", "topology-aware, shared-memory based, k-ary"),
        ), **_INTEL_MENUS}),
)


def detect(version: str) -> Library | None:
    """The library whose marker is in the first line of ``version`` (MPI_Get_library_version); None if none."""
    first = library_name(version)
    return next((lib for lib in LIBRARIES if lib.marker in first), None)


def library_version(python: str = sys.executable) -> str:
    """The active MPI's version string, from a subprocess that loads mpi4py without initialising MPI."""
    code = ("import mpi4py, sys; mpi4py.rc.initialize = mpi4py.rc.finalize = False; from mpi4py import MPI; "
            "sys.stdout.write(MPI.Get_library_version())")
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"cannot load mpi4py's MPI: {done.stderr.strip().splitlines()[-1:] or done.returncode}")
    return done.stdout


def find_program(name: str) -> str | None:
    """``name`` beside this Python (the virtual environment's), else on PATH; None when neither has it."""
    return shutil.which(name, path=os.path.dirname(sys.executable)) or shutil.which(name)


def present(lib: Library, algorithm: Algorithm) -> bool:
    """False when the algorithm needs a component the library's probe does not list."""
    if not algorithm.component or not lib.probe:
        return True
    program = find_program(lib.probe[0])
    if program is None:
        return True          # cannot tell: let the run say
    command = [program, *(a.format(component=algorithm.component) for a in lib.probe[1:])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    return bool(done.stdout.strip())


# ----------------------------------------------------------------------------- runs

@dataclass
class Run:
    """One relaunch of collectives.py: which algorithm, its variables, and what came of it."""

    backend: str
    algorithm: Algorithm | None         # None: the default run
    status: str = "not run"
    code: int | None = None
    seconds: float = 0.0
    dumps: list = field(default_factory=list)   # one per round that wrote one
    fallbacks: int = 0
    log: str = ""
    load: tuple = ()                    # the 1-minute load average before and after each round's job

    @property
    def env(self) -> dict:
        """The variables this run sets."""
        return {} if self.algorithm is None else dict(self.algorithm.env)

    @property
    def ok(self) -> bool:
        """True when the run ended normally with exact results."""
        return self.status == "ok"


def plan(lib: Library, names, collective: str = "allreduce") -> list[Run]:
    """The default run, then one run per algorithm of ``collective`` in ``names`` (all when None), in the table's order."""
    wanted = [a for a in lib.menu(collective) if names is None or a.name in names]
    return [Run(PREFIX + DEFAULT, None)] + [Run(PREFIX + a.name, a) for a in wanted]


def run_environment(lib: Library, run: Run, launcher: str) -> dict:
    """This environment without any of the library's algorithm variables, plus the run's; the launcher's folder first on PATH."""
    environ = {k: v for k, v in os.environ.items() if k not in lib.all_variables()}
    environ.update(run.env)
    environ["PATH"] = os.pathsep.join([os.path.dirname(launcher), environ.get("PATH", "")])
    return environ


def relaunch(command: list, env: dict, limit_s: float, workdir: Path, name: str) -> tuple[int | None, str, float]:
    """Run ``command`` in a session of its own, stopped after ``limit_s``; (exit status or None if stopped, output, s).

    Shared-memory segments a failed job leaves are removed (npddp.process.cleanup's Watch).
    """
    log = workdir / f"{name}.log"
    stopped = threading.Event()
    with open(log, "w") as out:
        watch = Watch(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

        def stop():
            """Terminate the run's process group, then kill it if it lingers."""
            stopped.set()
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if watch.proc is None or watch.proc.poll() is not None:
                    return
                try:
                    os.killpg(watch.proc.pid, sig)
                except ProcessLookupError:
                    return
                time.sleep(_GRACE_S)
        timer = threading.Timer(limit_s, stop)
        t0, code = time.perf_counter(), 1
        timer.start()
        try:
            code = watch.run()          # a Ctrl-C reaches the job, then this process
        finally:
            timer.cancel()
            watch.clean(1 if stopped.is_set() else code)
        seconds = time.perf_counter() - t0
    return (None if stopped.is_set() else code), log.read_text(errors="replace"), seconds


def launch_command(lib: Library, launcher: str, nproc: int, args: list, cluster=None, lock: str = "") -> list:
    """The launcher command of one run of collectives.py: ``nproc`` ranks here, or across ``cluster`` (nodes, ranks, rate)."""
    job = [sys.executable, str(SWEEP), *args]
    if cluster is None:
        extra = lib.launcher_args + (lib.root_args if os.geteuid() == 0 else ())
        command = [launcher, *extra, "-n", str(nproc), *job]
    else:
        nodes, ranks, rate = cluster
        command = [sys.executable, "-m", "npddp.cluster", "--nodes", str(nodes), "--ranks-per-node", str(ranks),
                   "--rate", rate, "--launcher", "mpi", "--", *job]
    return ["flock", lock, *command] if lock else command


def parse_cluster(text: str) -> tuple[int, int, str]:
    """``KxR@RATE`` (e.g. ``2x1@1gbit``) as (nodes, ranks per node, rate); ValueError naming what is wrong."""
    shape, sep, rate = text.partition("@")
    nodes, x, ranks = shape.partition("x")
    if not (sep and x and nodes.isdigit() and ranks.isdigit() and int(nodes) >= 1 and int(ranks) >= 1 and rate):
        raise ValueError(f"--cluster {text!r}: expected NODESxRANKS@RATE with NODES, RANKS >= 1, e.g. 2x1@1gbit")
    try:
        parse_rate(rate)
    except ValueError as e:
        raise ValueError(f"--cluster {text!r}: {e}") from None
    return int(nodes), int(ranks), rate


def load_average() -> float:
    """This machine's 1-minute load average (NaN where /proc/loadavg cannot be read)."""
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


def judge(run: Run, code: int | None, log: str, limit_s: float, lib: Library) -> None:
    """Set ``run.status`` from its exit status and output."""
    run.code, run.log = code, log
    run.fallbacks = log.count(lib.fallback_notice) if lib.fallback_notice else 0
    if code is None:
        run.status = f"timed out after {limit_s:g} s"
    elif code == 0:
        run.status = "ok"
    elif code == 1 and "# Wrong values" in log and "FAILED" in log:
        run.status = "wrong results"
    else:
        run.status = f"failed (exit {code})"


# ----------------------------------------------------------------------------- merging and checking

def dump_rows(path) -> tuple[list[dict], np.ndarray, dict]:
    """(rows as dicts of Python values, raw times (rows, iters), attributes) of one allreduce_sweep dump."""
    table, meta = results.read_table(path), results.read_meta(path)
    columns = {name: np.asarray(values) for name, values in table.items()}
    count = len(next(iter(columns.values())))
    rows = [{k: (v[i] if isinstance(v[i], str) else v[i].item()) for k, v in columns.items()} for i in range(count)]
    try:
        raw = results.read_raw(path, "time_s")
    except KeyError:
        raw = np.full((count, 1), np.nan)
    return rows, raw, meta


def merge(runs: list[Run]) -> tuple[list[dict], np.ndarray, dict]:
    """Every run's rows, the ``mpi`` backend's renamed ``mpi:<algorithm>`` (the bare ``raw`` loop's ``raw:<algorithm>``),
    its rounds pooled; raw times; attributes."""
    rows, raws, meta = [], [], {}
    for run in runs:
        mine, mine_raw = [], []
        for dump in run.dumps:
            part, raw, attrs = dump_rows(dump)
            meta = meta or attrs
            for row in part:
                if row["backend"] == "mpi":
                    row["backend"] = row["algorithm"] = run.backend
                elif row["backend"] == RAW:   # the same forced algorithm in a bare mpi4py loop: raw:<algorithm>
                    row["backend"] = row["algorithm"] = RAW + run.backend[len("mpi"):]
            mine += part
            mine_raw += list(raw)
        pooled, pooled_raw = pool(mine, mine_raw)
        rows += pooled
        raws += pooled_raw
    width = max((r.size for r in raws), default=1)
    padded = [np.pad(r, (0, width - r.size), constant_values=np.nan) for r in raws]
    return rows, (np.stack(padded) if padded else np.zeros((0, width))), meta


#: The columns of a row that come from its timed iterations (recomputed when rounds are pooled).
_TIMED = ("iters", "time_min_s", "time_p10_s", "time_median_s", "time_p90_s", "time_max_s", "algbw_GBps",
          "busbw_GBps", "wrong", "algorithm")


def pool(rows: list[dict], raw: list) -> tuple[list[dict], list]:
    """Rows of one series and size from several rounds as one row over all their timed iterations; (rows, raw)."""
    groups: dict = {}
    for row, times in zip(rows, raw):
        key = tuple((k, v) for k, v in row.items() if k not in _TIMED)
        groups.setdefault(key, []).append((row, np.asarray(times, dtype=np.float64)))
    out, out_raw = [], []
    for members in groups.values():
        first = dict(members[0][0])
        times = np.concatenate([t[np.isfinite(t)] for _, t in members])
        if len(members) > 1 and times.size:
            t_min, p10, median, p90, t_max = np.percentile(times, [0, 10, 50, 90, 100])
            factor = first["busbw_GBps"] / first["algbw_GBps"] if first["algbw_GBps"] else 1.0
            algbw = first["bytes"] / median / bc.GB
            first.update(iters=int(times.size), time_min_s=float(t_min), time_p10_s=float(p10),
                         time_median_s=float(median), time_p90_s=float(p90), time_max_s=float(t_max),
                         algbw_GBps=float(algbw), busbw_GBps=float(algbw * factor),
                         wrong=int(sum(r["wrong"] for r, _ in members)),
                         algorithm="+".join(dict.fromkeys(str(r["algorithm"]) for r, _ in members)))
        out.append(first)
        out_raw.append(times if times.size else members[0][1])
    return out, out_raw


def judged(rows: list[dict], backend: str) -> str:
    """The series that says how ``backend`` (``mpi:<algorithm>``) ran: its own rows, or where a collective has only
    the bare loop's (npddp has no such call yet), ``raw:<algorithm>``."""
    if any(r["backend"] == backend for r in rows):
        return backend
    return RAW + backend[len(PREFIX) - 1:]


def _default_of(backend: str) -> str:
    """The default run's series beside ``backend``: ``mpi:default`` (``raw:default`` for a ``raw:`` series)."""
    return f"{backend.split(':')[0]}:{DEFAULT}"


def honoured(rows: list[dict], backend: str) -> bool | None:
    """Whether ``backend``'s times differ from its default run's by more than their spread at some size and place.

    They differ where the two p10-p90 ranges do not overlap; None when there is nothing to compare.
    """
    default = {(r["place"], r["buffers"], r["bytes"]): r for r in rows if r["backend"] == _default_of(backend)}
    seen = False
    for r in rows:
        d = default.get((r["place"], r["buffers"], r["bytes"]))
        if r["backend"] != backend or d is None:
            continue
        seen = True
        if r["time_p10_s"] > d["time_p90_s"] or d["time_p10_s"] > r["time_p90_s"]:
            return True
    return None if not seen else False


def ratios(rows: list[dict], backend: str) -> tuple[float, float] | None:
    """(smallest, largest) median time / its default run's over the sizes and places both measured; None without any."""
    default = {(r["place"], r["buffers"], r["bytes"]): r["time_median_s"] for r in rows
               if r["backend"] == _default_of(backend)}
    found = [r["time_median_s"] / default[k] for r in rows if r["backend"] == backend
             and (k := (r["place"], r["buffers"], r["bytes"])) in default]
    return (min(found), max(found)) if found else None


def summary(runs: list[Run], rows: list[dict]) -> list[str]:
    """One line per run: its backend, status, #wrong, time / default's over sizes, and notes."""
    lines = [f"# {'backend':<34} {'status':<24} {'#wrong':>7} {'time/default':>13}  note"]
    for run in runs:
        name = judged(rows, run.backend)
        mine = [r for r in rows if r["backend"] == name]
        wrong = sum(r["wrong"] for r in mine)
        span = ratios(rows, name)
        cell = "" if span is None else f"{span[0]:.2f}-{span[1]:.2f}"
        notes = [] if name == run.backend else [f"judged by {name}: MPI's call in a bare loop"]
        if run.backend != PREFIX + DEFAULT and mine and honoured(rows, name) is False:
            notes.append("suspect: not honoured? (its p10-p90 overlaps the default's at every size)")
        if run.fallbacks:
            notes.append(f"the library printed {run.fallbacks} fallback notice(s)")
        lines.append(f"  {run.backend:<34} {run.status:<24} {wrong if mine else '-':>7} {cell:>13}  {'; '.join(notes)}")
    return lines


def variables_text(env: dict) -> str:
    """``A=1 B=2``, or ``(none)``."""
    return " ".join(f"{k}={v}" for k, v in env.items()) or "(none)"


# ----------------------------------------------------------------------------- CLI

def build_parser(lib_names=()) -> argparse.ArgumentParser:
    """This script's own flags; every other flag goes to collectives.py."""
    p = argparse.ArgumentParser(prog=PROG, allow_abbrev=False,
                                description="Time the active MPI's own algorithms of a collective, each forced in turn, "
                                            "with benchmarks/collectives.py (its flags pass through).")
    p.add_argument("-n", "--nproc", type=bc.int_at_least(1), default=2, help="ranks of each run (default 2)")
    p.add_argument("--collective", default="allreduce", choices=tuple(CALLS),
                   help="the collective whose algorithms are forced (default allreduce)")
    p.add_argument("--algorithms", default="",
                   help="comma-separated algorithms to force (default: every one the library offers; see --list)")
    p.add_argument("--backends", default="", help="npddp backends timed beside MPI in the default run (collectives.py's "
                                                  "names, comma-separated; default none)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each run may take (default 600)")
    p.add_argument("--out", default="", help="write the merged HDF5 dump here")
    p.add_argument("--csv", default="", help="write its rows as CSV here")
    p.add_argument("--cluster", default="", metavar="KxR@RATE",
                   help="run each job across K emulated nodes of R ranks, links of RATE (python -m npddp.cluster "
                        "--launcher mpi; -n is then K x R), e.g. 2x1@1gbit")
    p.add_argument("--lock", default="", metavar="FILE",
                   help="run each job under flock FILE (the emulated clusters' shared lock)")
    p.add_argument("--rounds", type=bc.int_at_least(1), default=1,
                   help="jobs per algorithm, in ABBA order (round 2 runs the list backwards), their iterations "
                        "pooled: load that drifts during the runs hits every algorithm alike (default 1)")
    p.add_argument("--list", action="store_true", help="print the active library's algorithms and variables, and exit")
    return p


def child_args(passthrough: list, backends: str, default_run: bool, collective: str = "allreduce") -> list:
    """collectives.py's flags of one run: the user's, the collective, the backends, its own dump (added by the caller).

    MPI's own call is the ``mpi`` backend's (the sweep adds the bare ``raw`` loop beside it); for a collective
    npddp's protocol does not have yet, the ``raw`` loop alone."""
    mine = "mpi" if bc.offered(collective) else RAW
    names = [mine] + [b for b in backends.split(",") if b.strip() and b.strip() != mine] if default_run else [mine]
    forced = [] if default_run else ["--transports", "mpi"]
    return [*passthrough, "--collective", collective, "--backends", ",".join(b.strip() for b in names), *forced]


def main(argv=None) -> int:
    """Detect the library, run every algorithm, print the summary, write the dump; see the module docstring."""
    parser = build_parser()
    args, passthrough = parser.parse_known_args(argv)
    if not args.timeout > 0:
        parser.error(f"--timeout must be > 0 seconds, got {args.timeout}")
    for flag in ("--out", "--csv"):
        if any(a == flag or a.startswith(flag + "=") for a in passthrough):
            parser.error(f"{flag}: this script writes its own dump (--out, --csv)")
    try:
        args.cluster = parse_cluster(args.cluster) if args.cluster else None
    except ValueError as e:
        parser.error(str(e))
    if args.cluster is not None:
        args.nproc = args.cluster[0] * args.cluster[1]
    if args.lock and shutil.which("flock") is None:
        parser.error(f"--lock {args.lock!r}: no flock on PATH")
    for option, path in (("--out", args.out), ("--csv", args.csv)):
        problem = target_problem(f"{option} {path!r}", path) if path else None
        if problem:
            parser.error(problem)
    try:
        version = library_version()
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        parser.error(str(e))
    lib = detect(version)
    if lib is None:
        parser.error(f"unknown MPI library {library_name(version)!r}; known: "
                     f"{', '.join(lib.family for lib in LIBRARIES)}")
    valid = [a.name for a in lib.menu(args.collective)]
    names = [n.strip() for n in args.algorithms.split(",") if n.strip()] or None
    bad = [n for n in names or () if n not in valid]
    if bad or (names is not None and len(set(names)) != len(names)):
        parser.error(f"--algorithms: {bad[0] if bad else args.algorithms!r} is not one of {lib.family}'s "
                     f"{args.collective} algorithms (each once): {', '.join(valid)}")
    if args.list:
        print(f"# {library_name(version)} ({lib.family}), {args.collective}; source: {lib.source}")
        for a in lib.menu(args.collective):
            print(f"  {PREFIX + a.name:<34} {variables_text(a.env)}\n  {'':<34} {a.about}")
        return 0
    launcher = find_program("mpirun") or find_program("mpiexec")
    if launcher is None:
        parser.error("no mpirun or mpiexec beside this Python or on PATH")
    return measure(lib, version, plan(lib, names, args.collective), launcher, args, passthrough, argv)


def run_once(lib: Library, run: Run, k: int, launcher: str, args, passthrough, workdir: Path) -> int | None:
    """Round ``k`` of ``run``: relaunch, judge (a round's failure stays the run's status), keep its dump; exit status."""
    label = run.backend.removeprefix(PREFIX) + (f"_round{k + 1}" if k else "")
    dump = workdir / f"{label}.h5"
    default_run = run.algorithm is None
    command = launch_command(lib, launcher, args.nproc,
                             child_args(passthrough, args.backends, default_run, args.collective) + ["--out", str(dump)],
                             args.cluster, args.lock)
    before = load_average()
    code, log, seconds = relaunch(command, run_environment(lib, run, launcher), args.timeout, workdir, label)
    earlier = run.status if k else "ok"
    judge(run, code, log, args.timeout, lib)
    run.status = run.status if earlier == "ok" else earlier
    run.seconds += seconds
    run.load += (before, load_average())
    if code in (0, 1) and dump.exists():
        run.dumps.append(str(dump))
    print(f"# {run.backend} ({variables_text(run.env)}){f' round {k + 1}' if args.rounds > 1 else ''}: "
          f"{run.status}, {seconds:.1f} s, load average {run.load[-2]:.2f} -> {run.load[-1]:.2f}", flush=True)
    if default_run and k == 0 and code == EXIT_BAD:
        sys.stderr.write(log)
    elif code != 0:
        tail = [line for line in log.strip().splitlines() if line.strip()][-5:]
        print("\n".join(f"#   | {line}" for line in tail), flush=True)
    return code


def measure(lib: Library, version: str, runs: list[Run], launcher: str, args, passthrough, argv) -> int:
    """Run each of ``runs`` (the default first: bad flags end everything there), then summarise and write."""
    where = launcher if args.cluster is None else "npddp.cluster {}x{} at {}".format(*args.cluster)
    print(f"# {library_name(version)}: {len(runs)} runs of collectives.py on {args.nproc} ranks with {where}",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="mpi-algorithms-") as tmp:
        workdir = Path(tmp)
        for run in runs:
            if run.algorithm is not None and not present(lib, run.algorithm):
                run.status = "skipped: not in this build"
                print(f"# {run.backend}: {run.status}", flush=True)
        todo = [run for run in runs if not run.status.startswith("skipped")]
        for k in range(args.rounds):
            for run in (todo if k % 2 == 0 else todo[::-1]):   # ABBA: a steady drift of load hits every run alike
                code = run_once(lib, run, k, launcher, args, passthrough, workdir)
                if k == 0 and run is runs[0] and code == EXIT_BAD:
                    return EXIT_BAD          # collectives.py refused the flags: every run would
        rows, raw, meta = merge(runs)
        print("\n".join(summary(runs, rows)))
        if rows:
            write(args, lib, version, runs, rows, raw, meta, argv)
    return 0 if all(r.ok or r.status.startswith("skipped") for r in runs) else 1


def write(args, lib: Library, version: str, runs: list[Run], rows: list[dict], raw: np.ndarray, meta: dict,
          argv) -> None:
    """The merged dump (``--out``) and CSV (``--csv``), each if asked for."""
    record = [{"backend": r.backend, "variables": r.env, "status": r.status, "seconds": round(r.seconds, 2),
               "fallback_notices": r.fallbacks, "honoured": honoured(rows, judged(rows, r.backend)),
               "load_average": list(r.load)}
              for r in runs]
    backends = list(dict.fromkeys(r["backend"] for r in rows))
    if args.out:
        results.write_dump(args.out, KIND, rows, world_size=args.nproc, backends=backends, raw={"time_s": raw},
                           attrs={"collective": meta["collective"], "dtype": meta["dtype"], "op": meta["op"],
                                  "places": meta.get("places", []), "mpi_library": library_name(version),
                                  "mpi_family": lib.family, "mpi_algorithms": json.dumps(record),
                                  "mpi_algorithms_source": lib.source,
                                  "argv": json.dumps(list(sys.argv[1:] if argv is None else argv))})
        print(f"# wrote {args.out} (--out)")
    if args.csv:
        results.write_csv(args.csv, KIND, rows)
        print(f"# wrote {args.csv} (--csv)")


if __name__ == "__main__":
    sys.exit(main())
