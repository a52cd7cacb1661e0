"""The columns of every benchmark dump: one list, read by the producers, the checker and the report.

A benchmark dump holds one flat table (one row per measurement). Each kind of dump declares
here its columns in order, with a type, a unit and a one-line meaning, plus the root
attributes the table cannot be read without and any raw (per-iteration) arrays beside it.
:mod:`benchmarks.results` writes and :mod:`npddp.results` checks and reads dumps from these declarations;
docs/guide/benchmarks.md's analysis section and ``python -m benchmarks.results --schema`` print them. To add a kind of dump,
add its ``Kind`` to :data:`KINDS`.

Units: ``B`` bytes, ``s``/``ms`` seconds/milliseconds, ``GB/s`` with GB = 1e9 B, ``MiB`` =
2**20 B, ``1`` a dimensionless ratio; an empty unit marks a text label.
"""

from __future__ import annotations

from dataclasses import dataclass

STR, INT, FLOAT = "str", "int", "float"
#: Collectives the sweep can time.
COLLECTIVES = ("allreduce", "broadcast", "allgather", "reduce_scatter", "alltoall")
#: Where a collective leaves its result: over its input, or in another buffer.
PLACES = ("inplace", "outofplace")
#: Where the timed buffers live: from ``comm.empty`` (node shared memory where the backend offers
#: it, as DDP's buckets are), or ordinary NumPy arrays.
BUFFERS = ("shared", "private")
#: The ``backend`` of rows measured with every all-reduce skipped (the DDP no-comm ceiling).
NO_COMM = "none"
#: The ``backend`` of rows measured on the same MLP step written in bare NumPy (no DDP, no communication).
BARE = "bare"
#: The ``backend`` of an all-reduce sweep's rows of MPI's own all-reduce called by a bare mpi4py loop, outside npddp.
RAW = "raw"


@dataclass(frozen=True)
class Column:
    """One column (or attribute): its name, type, unit, meaning and the values it may take.

    ``low``: smallest allowed value; ``positive``: values must be > 0; ``nan_ok``: NaN allowed
    (it then means "not measured"); ``choices``: the allowed strings.
    """

    name: str
    type: str
    unit: str
    doc: str
    low: float | None = None
    positive: bool = False
    nan_ok: bool = False
    choices: tuple = ()

    def expectation(self) -> str:
        """What a valid value is, in words: 'an int >= 1', 'a finite float > 0', 'one of a, b'."""
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.type == STR:
            return "a non-empty UTF-8 string"
        what = ("an int" if self.type == INT else "a finite float" + (" (or NaN)" if self.nan_ok else ""))
        if self.positive:
            return f"{what} > 0"
        return f"{what} >= {self.low:g}" if self.low is not None else what


@dataclass(frozen=True)
class Raw:
    """A raw array beside the table: 2-D, float, with the table's rows along ``row_axis``."""

    name: str
    unit: str
    doc: str
    row_axis: int


@dataclass(frozen=True)
class Kind:
    """A kind of dump: its table columns in order, required root attributes, raw arrays, orderings.

    ``ordered``: groups of columns whose values must not decrease from left to right in every
    row (min <= p10 <= median <= p90 <= max). ``world_size``: how the ``world_size`` column
    relates to the root attribute of that name: ``"equal"``, or ``"at_most"`` (weak scaling
    runs on the first 1, 2, 4, ... ranks of the world).
    """

    name: str
    doc: str
    columns: tuple
    attrs: tuple = ()
    raw: tuple = ()
    ordered: tuple = ()
    world_size: str = "equal"

    @property
    def names(self) -> tuple:
        """Column names in their declared order."""
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        """The column called ``name``; KeyError if there is none."""
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.name} has no column {name!r}; columns: {', '.join(self.names)}")


def _label(name: str, doc: str, choices: tuple = ()) -> Column:
    """A text column."""
    return Column(name, STR, "", doc, choices=choices)


def _count(name: str, unit: str, doc: str, low: int = 0) -> Column:
    """An int column with a lower bound."""
    return Column(name, INT, unit, doc, low=low)


def _time(name: str, unit: str, doc: str) -> Column:
    """A float time column: finite and > 0."""
    return Column(name, FLOAT, unit, doc, positive=True)


def _part(name: str, doc: str) -> Column:
    """A float ms column: finite and >= 0 (a part of a step may take no time)."""
    return Column(name, FLOAT, "ms", doc, low=0.0)


WORLD_SIZE = Column("world_size", INT, "ranks", "ranks taking part", low=1)
BACKEND = _label("backend", "backend name passed to npddp.comm.create; 'none' on rows measured with every "
                            "all-reduce skipped (the no-comm ceiling)")
TRANSPORT = _label("transport", "what carries bytes between ranks: 'mpi' (MPI point-to-point calls, or MPI's own "
                                "collectives for the mpi backend); 'none' on no-comm rows")
MODEL = _label("model", "model name; its layer widths are in the root attribute 'models'")
PARAMS = _count("params", "parameters", "trainable parameters of the model", low=1)
SYNC = _label("sync", "DDP sync strategy: per_param, flat, bucketed or overlap")
BUCKET = Column("bucket_mb", FLOAT, "MiB", "DDP bucket cap (0 for per_param and flat, which do not bucket)", low=0.0)
BATCH = _count("batch", "samples", "samples per rank per step", low=1)
STEPS = _count("steps", "steps", "timed steps behind this row", low=1)
#: The step time columns of both DDP kinds.
STEP_MS = _time("step_ms", "ms", "median over steps of the step time, each step timed as the max over ranks")
STEP_P10 = _time("step_ms_p10", "ms", "10th percentile of the step times")
STEP_P90 = _time("step_ms_p90", "ms", "90th percentile of the step times")
SAMPLES = _time("samples_per_s", "samples/s", "global throughput: world_size x batch / step time")
DDP_EFFICIENCY = Column("ddp_efficiency", FLOAT, "1", "step_ms of the no-comm row with the same model, sync and "
                        "bucket cap (and world size and repeat) / step_ms: 1 = communication costs nothing; NaN "
                        "when the run had no --no-comm rows", positive=True, nan_ok=True)
BARE_EFFICIENCY = Column("bare_efficiency", FLOAT, "1", "step_ms of the bare-NumPy row (the same MLP step in plain "
                         "NumPy: no modules, hooks, buckets or communication) with the same model, sync, bucket "
                         "cap and world size / step_ms; NaN when the run had no --bare rows", positive=True,
                         nan_ok=True)
KIND_ATTRS = (
    Column("kind", STR, "", "which kind of dump this is"),
    Column("schema_version", INT, "index", "version of the dump layout", low=1),
    WORLD_SIZE,
)

ALLREDUCE_SWEEP = Kind(
    "allreduce_sweep", "benchmarks/collectives.py (any collective; allreduce.py is its old name): one row per size, "
                      "backend, transport and place",
    columns=(
        _label("collective", "collective timed", COLLECTIVES),
        BACKEND,
        TRANSPORT,
        _label("algorithm", "algorithm that ran at this size: the backend's name unless the backend picks one "
                            "per call (auto)"),
        _label("place", "inplace: the result overwrites the input; outofplace: it goes to another buffer", PLACES),
        WORLD_SIZE,
        _label("dtype", "element type"),
        _label("op", "reduction; 'none' for broadcast, allgather and alltoall"),
        _count("bytes", "B", "size of the whole vector (nccl-tests' convention): the all-reduce and broadcast "
                             "buffer, the reduce-scatter input, the all-gather output, one rank's all-to-all input", low=1),
        _count("count", "elements", "elements of the whole vector", low=1),
        _count("iters", "iterations", "timed iterations at this size", low=1),
        _time("time_min_s", "s", "fastest timed iteration; an iteration's time is the max over ranks"),
        _time("time_p10_s", "s", "10th percentile of the iteration times"),
        _time("time_median_s", "s", "median iteration time: the time the bandwidths use"),
        _time("time_p90_s", "s", "90th percentile of the iteration times"),
        _time("time_max_s", "s", "slowest timed iteration"),
        _time("algbw_GBps", "GB/s", "algorithm bandwidth: bytes / time_median_s"),
        Column("busbw_GBps", FLOAT, "GB/s", "bus bandwidth: algbw x 2(N-1)/N (all-reduce), (N-1)/N (all-gather, "
                                            "reduce-scatter, all-to-all), 1 (broadcast); 0 on one rank", low=0.0),
        _count("wrong", "elements", "elements that differ from the exact result in the checked iteration, summed "
                                    "over ranks (nccl-tests' #wrong)"),
        _label("buffers", "shared: the all-reduce buffers come from comm.empty (node shared memory where the "
                          "backend offers it); private: ordinary NumPy arrays", BUFFERS),
    ),
    attrs=KIND_ATTRS + (_label("collective", "collective timed", COLLECTIVES), _label("dtype", "element type"),
                        _label("op", "reduction ('none' for broadcast, allgather and alltoall)")),
    raw=(Raw("time_s", "s", "every timed iteration's time (max over ranks), one row per table row; NaN past "
                            "that row's iters", row_axis=0),),
    ordered=(("time_min_s", "time_p10_s", "time_median_s", "time_p90_s", "time_max_s"),),
)

DDP_BREAKDOWN = Kind(
    "ddp_breakdown", "benchmarks/ddp.py: one row per model, sync, bucket cap and backend",
    columns=(
        MODEL, PARAMS, SYNC, BACKEND, TRANSPORT, BUCKET, WORLD_SIZE, BATCH, STEPS,
        STEP_MS,
        _time("step_ms_min", "ms", "fastest step"),
        STEP_P10,
        STEP_P90,
        _time("step_ms_max", "ms", "slowest step"),
        _part("forward_ms", "zero_grad + forward + loss (median over steps of the mean over ranks, as every "
                            "part below)"),
        _part("backward_ms", "backward compute, without the communication calls issued from its hooks"),
        _part("comm_issued_ms", "communication calls made during backward (overlap: starting and polling "
                                "all-reduces); it is part of backward's wall time"),
        _part("comm_exposed_ms", "waiting for communication after backward returned"),
        _part("optimizer_ms", "the optimizer step"),
        _part("compute_ms", "forward_ms + backward_ms + optimizer_ms"),
        _part("comm_ms", "comm_issued_ms + comm_exposed_ms: time the step spends in communication"),
        Column("comm_fraction", FLOAT, "1", "comm_ms / step_ms", low=0.0),
        _count("num_comm_ops", "calls", "all-reduce calls per step (0 on one rank and on no-comm rows)"),
        _count("comm_bytes", "B", "bytes all-reduced per rank per step"),
        SAMPLES,
        DDP_EFFICIENCY,
        BARE_EFFICIENCY,
    ),
    attrs=KIND_ATTRS,
    ordered=(("step_ms_min", "step_ms_p10", "step_ms", "step_ms_p90", "step_ms_max"),),
)

WEAK_SCALING = Kind(
    "weak_scaling", "benchmarks/ddp.py --weak-scaling: one row per repeat, world size and combination",
    columns=(
        MODEL, PARAMS, SYNC, BACKEND, TRANSPORT, BUCKET, WORLD_SIZE, BATCH, STEPS,
        _count("repeat", "index", "which repetition of the whole sweep (0, 1, ...)"),
        STEP_MS,
        STEP_P10,
        STEP_P90,
        SAMPLES,
        Column("efficiency", FLOAT, "1", "samples_per_s / (world_size x the one-rank samples/s), the one-rank "
                                         "figure being the median over every backend's one-rank run of the same "
                                         "model, sync and bucket cap in the same repeat", positive=True),
        DDP_EFFICIENCY,
    ),
    attrs=KIND_ATTRS,
    ordered=(("step_ms_p10", "step_ms", "step_ms_p90"),),
    world_size="at_most",
)

TORCH_COMPARE = Kind(
    "torch_compare", "benchmarks/compare_torch.py: one row per side (PyTorch first)",
    columns=(
        _label("framework", "who trained: torch or npddp", ("torch", "npddp")),
        _label("backend", "npddp backend, or 'gloo' for PyTorch"),
        _label("sync", "npddp sync strategy, or 'ddp' for PyTorch"),
        MODEL, PARAMS, WORLD_SIZE, BATCH, STEPS,
        _count("reps", "repetitions", "timed repetitions of --steps steps", low=1),
        _time("samples_per_s", "samples/s", "median over repetitions of the global throughput"),
        _time("samples_per_s_min", "samples/s", "slowest repetition"),
        _time("samples_per_s_max", "samples/s", "fastest repetition"),
        _time("step_ms", "ms", "world_size x batch / samples_per_s"),
        _time("ratio_to_torch", "1", "samples_per_s / PyTorch's samples_per_s (> 1: faster than PyTorch)"),
        Column("max_param_diff", FLOAT, "1", "largest absolute parameter difference to PyTorch after the warm-up",
               low=0.0),
    ),
    attrs=KIND_ATTRS,
    raw=(Raw("samples_per_s", "samples/s", "every repetition's throughput: (reps, sides), sides in row order",
             row_axis=1),),
    ordered=(("samples_per_s_min", "samples_per_s", "samples_per_s_max"),),
)

NAIVE_DDP = Kind(
    "naive_ddp", "benchmarks/naive_ddp.py (the DDP coursework benchmark): one row per GPT size and sync; "
                 "the first eight columns are the coursework's CSV",
    columns=(
        _label("model_size", "GPT preset that ran (smaller than requested_size when that did not fit in memory)"),
        _count("d_model", "features", "model width", low=1),
        _count("num_layers", "blocks", "Transformer blocks", low=1),
        _time("total_time_ms", "ms", "median over steps of the step time (zero_grad, forward, loss, backward, "
                                     "optimizer), each step timed as the max over ranks"),
        _part("compute_time_ms", "median over steps of the mean over ranks of the step time minus comm_time_ms"),
        _part("comm_time_ms", "median over steps of the mean over ranks of the time in all-reduce calls, "
                              "during backward and after it"),
        Column("comm_fraction", FLOAT, "1", "comm_time_ms / total_time_ms", low=0.0),
        _count("num_comm_ops", "calls", "all-reduce calls per step (0 on one rank)"),
        _label("requested_size", "GPT preset asked for with --model-size"),
        _count("num_heads", "heads", "attention heads", low=1),
        _count("d_ff", "features", "MLP hidden width", low=1),
        PARAMS,
        SYNC,
        BACKEND,
        TRANSPORT,
        BUCKET,
        WORLD_SIZE,
        _count("batch_size", "sequences", "global batch per step, split evenly over the ranks", low=1),
        _count("context_length", "tokens", "tokens per sequence", low=1),
        _count("vocab_size", "tokens", "vocabulary size", low=2),
        STEPS,
        _time("total_time_ms_p10", "ms", "10th percentile of the step times"),
        _time("total_time_ms_p90", "ms", "90th percentile of the step times"),
        _time("tokens_per_s", "tokens/s", "batch_size x context_length / total_time_ms"),
        _part("cpu_time_ms", "median over steps of the mean over ranks of the process CPU time during the step "
                             "(far below total_time_ms when other processes share the cores)"),
    ),
    attrs=KIND_ATTRS,
    ordered=(("total_time_ms_p10", "total_time_ms", "total_time_ms_p90"),),
)

PARALLELISM = Kind(
    "parallelism", "benchmarks/parallelism.py: one row per GPT size, world size and layout (DDP, ZeRO-3, "
                   "tensor, pipeline and their combinations), each from an mpirun job of its own",
    columns=(
        _label("model_size", "GPT preset"),
        _label("layout", "ddp, zero3, tp (tp = N), pp-gpipe / pp-1f1b (pp = N), or a combination such as tp2-pp2"),
        WORLD_SIZE,
        _count("dp", "ranks", "data replicas", low=1),
        _count("pp", "stages", "pipeline stages", low=1),
        _count("tp", "ranks", "tensor-parallel ranks", low=1),
        _label("schedule", "pipeline schedule (gpipe or 1f1b); 'none' without a pipeline"),
        _count("micro_batches", "micro-batches", "micro-batches per step and replica (1 without a pipeline)", low=1),
        PARAMS,
        _count("batch", "sequences", "global batch per step", low=1),
        _count("context_length", "tokens", "tokens per sequence", low=1),
        STEPS,
        STEP_MS,
        STEP_P10,
        STEP_P90,
        _count("comm_bytes", "B", "bytes passed to communication calls per rank per step (an all-reduce of B bytes "
                                  "counts B; a send counts its array), mean over ranks"),
        Column("sent_bytes", FLOAT, "B", "bytes a bandwidth-optimal algorithm sends per rank per step for those calls "
                                         "(all-reduce 2(n-1)/n x B, reduce-scatter (n-1)/n x B, all-gather (n-1) x "
                                         "its block, a send its array; n the group's size), mean over ranks", low=0.0),
        Column("link_bytes", FLOAT, "B", "across emulated nodes: bytes each node's link (eth0) sent per step during "
                                         "the timed steps, over its ranks, mean over nodes; NaN on one node",
               low=0.0, nan_ok=True),
        _part("comm_ms", "time inside communication calls per step (blocking calls, and the issue and wait of "
                         "non-blocking ones): the exposed communication, waiting for other ranks included; median "
                         "over steps of the mean over ranks"),
        Column("comm_fraction", FLOAT, "1", "comm_ms / step_ms", low=0.0),
        Column("bubble", FLOAT, "1", "measured pipeline idle share: time blocked in the pipeline's sends and "
                                     "receives, plus the wait for the slowest rank after a stage's step, / step "
                                     "time (median over steps of the mean over ranks); 0 without a pipeline",
               low=0.0),
        Column("bubble_theory", FLOAT, "1", "(K-1)/(M+K-1) for K stages and M micro-batches", low=0.0),
        Column("peak_rss_mib", FLOAT, "MiB", "peak resident memory of the largest rank over the steps (VmHWM, "
                                             "reset after the model is split; getrusage ru_maxrss where it cannot be)",
               positive=True),
        Column("peak_rss_min_mib", FLOAT, "MiB", "the same of the smallest rank", positive=True),
        _time("tokens_per_s", "tokens/s", "batch x context_length / step_ms"),
        _count("nodes", "nodes", "nodes the ranks ran on (MPI's shared-memory groups)", low=1),
        _count("ranks_per_node", "ranks", "ranks on each node", low=1),
        _label("rate", "each link's rate across emulated nodes (tc syntax, as given); 'local' on one node"),
        _count("repeats", "jobs", "jobs behind the row; each number is the median over them", low=1),
    ),
    attrs=KIND_ATTRS,
    ordered=(("step_ms_p10", "step_ms", "step_ms_p90"), ("peak_rss_min_mib", "peak_rss_mib")),
    world_size="at_most",
)

#: Every kind of benchmark dump, by name.
KINDS = {k.name: k for k in (ALLREDUCE_SWEEP, DDP_BREAKDOWN, WEAK_SCALING, TORCH_COMPARE, NAIVE_DDP, PARALLELISM)}
