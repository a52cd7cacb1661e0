"""The training CLI's configuration: one dataclass whose field metadata builds the argparse parser.

Each field of :class:`Config` is one ``--flag`` (underscores become dashes). Its metadata
holds the help text, the valid choices, and whether a resumed run must repeat the value
(``resume="match"``). :func:`npddp.train.cli.parser.parse_config` builds the parser from the fields and
turns argv into a ``Config``; :func:`npddp.train.cli.validate.check_config` validates it against the
world size. Both raise :class:`ConfigError` with a message meant to be printed after ``error: ``;
neither communicates, so every rank reaches the same verdict.

The choice lists come from the modules that implement them; importing this module does not
import mpi4py.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field

from npddp.comm import BACKENDS, DEFAULT_TIMEOUT, TRANSPORTS
from npddp.comm.algorithms.registry import backend_help
from npddp.comm.transports.base import resolve_transport
from npddp.comm.transports.mpi import mpi_missing
from npddp.data import DATASET_NAMES, NORMALIZE_MODES
from npddp.data.arrays import ARRAY_SUFFIXES
from npddp.nn.gpt import PRESETS
from npddp.optim import DEFAULT_LR, OPTIMIZERS
from npddp.parallel.ddp import BUCKET_CAP_MB, SYNCS
from npddp.parallel.hook_registry import comm_hook_help, comm_hook_names
from npddp.parallel.model.schedules import SCHEDULES
from npddp.util.threads import parse_threads
from npddp.train.models import DTYPES, MODELS
from npddp.util import variables
from npddp.util.tracing import DEFAULT_STEPS, steps_text

#: When and how progress within an epoch is shown (``--progress``; :class:`~npddp.train.console.printer.Printer`).
PROGRESS_MODES = ("auto", "bar", "log", "none")

#: Data set names the CLI trains on: the classification sets among the loaders' names.
DATASETS = tuple(n for n in DATASET_NAMES if n != "regression")
DATA_SUFFIXES = ARRAY_SUFFIXES
H5_SUFFIXES = (".h5", ".hdf5")
#: How a field behaves on --resume: must repeat the saved value / taken from the checkpoint
#: unless given (may change) / this run's own.
RESUME_KINDS = ("match", "inherit", "")


class ConfigError(ValueError):
    """Bad command-line input: printed once as ``error: <message>``, exit code 2."""


def _opt(default, help: str, *, choices=None, metavar=None, resume: str = "", shown=None, parse=None,
         const=None):
    """A dataclass field carrying its command-line help.

    ``resume``: "match" (fixed: taken from the checkpoint, and a different value given again is
    an error), "inherit" (taken from the checkpoint unless given; may change) or "" (this
    run's own). ``parse`` converts the command-line string (default: the field's type).
    ``const``: the value of the flag given without one (its value is then optional).
    """
    assert resume in RESUME_KINDS, resume
    meta = {"help": help, "choices": choices, "metavar": metavar, "resume": resume, "shown": shown,
            "parse": parse, "const": const}
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def default_backend(transport: str, environ=None) -> tuple[str, str]:
    """The backend a run gets without ``--backend``, and why: mpi when MPI carries the job, else auto over tcp
    (no MPI launcher, ``--transport tcp``, or no MPI in this install)."""
    if resolve_transport(transport, environ, probe=True) == "mpi":
        return "mpi", ""
    missing = mpi_missing(environ) if transport == "auto" else None
    return "auto", f"no MPI here, {missing}" if missing else "not started by MPI" if transport == "auto" else \
        "--transport tcp"


def resume_text(text: str) -> str:
    """The value of ``--resume VALUE``: only ``auto``."""
    if text != "auto":
        raise ValueError(f"--resume takes no value or 'auto', not {text!r}")
    return text


@dataclass(frozen=True)
class Config:
    """Every setting of a training run."""

    # --- communication
    backend: str = _opt("mpi", "communication backend: " + backend_help() + "; may change on --resume",  # below
                        choices=BACKENDS, resume="inherit",
                        shown="mpi under an MPI launcher; auto when the job runs over tcp, as under python -m "
                        "npddp.run")
    transport: str = _opt("auto", "how the hand-written backends move messages: tcp (sockets; processes "
                          "started by python -m npddp.run or torchrun, no MPI needed), mpi (MPI's "
                          "point-to-point calls) or auto (tcp when RANK/WORLD_SIZE are set and no MPI "
                          "launcher started the job, else mpi); --backend mpi needs mpi",
                          choices=("auto", *TRANSPORTS), resume="inherit")
    sync: str = _opt("overlap", "gradient sync strategy: one all-reduce per tensor (per_param), one "
                     "flat buffer (flat), buckets after backward (bucketed), or buckets reduced "
                     "while backward runs (overlap)", choices=SYNCS, resume="inherit")
    bucket_mb: float = _opt(BUCKET_CAP_MB, "bucket size cap in MiB for bucketed/overlap (DistributedDataParallel's "
                            "bucket_cap_mb); smaller buckets start all-reducing earlier during backward",
                            metavar="MB", resume="inherit")
    comm_hook: str = _opt("allreduce", "DDP communication hook: " + comm_hook_help(),    # with --plugin's: below
                          choices=comm_hook_names(), resume="match")
    topk_ratio: float = _opt(0.01, "fraction of each bucket sent by --comm-hook topk, in (0, 1]",
                             metavar="R", resume="match")
    powersgd_rank: int = _opt(1, "rank of PowerSGD's low-rank approximation (--comm-hook powersgd)",
                              metavar="R", resume="match")
    powersgd_start_iter: int = _opt(10, "plain all-reduce for this many steps before PowerSGD starts "
                                    "(--comm-hook powersgd; >= 2)", metavar="K", resume="match")
    plugin: str = _opt("", "comma-separated modules (dotted names or .py paths) imported first; they register "
                       "all-reduce algorithms that --backend then accepts", metavar="MODULES", resume="inherit")
    algorithms: str = _opt("", "the algorithm of each other collective, COLLECTIVE=NAME,... e.g. allgather=bruck,"
                           "reduce_scatter=halving (or =auto: the cost model's pick per call); ZeRO and split runs "
                           "take their all-gathers and reduce-scatters from it; hand-written backends only",
                           metavar="C=NAME,...", shown="the ring's halves; auto's picks with --backend auto")
    local_sgd: int = _opt(0, "average parameters every K steps instead of gradients every step "
                          "(0: plain data parallelism)", metavar="K", resume="match")
    timeout: typing.Optional[float] = _opt(
        None, "seconds a collective may wait for the other ranks before raising TimeoutError, which "
        "ends the job (inf: wait forever)", metavar="SECONDS",
        shown=f"${variables.TIMEOUT.name}, else {DEFAULT_TIMEOUT:g}")
    zero: int = _opt(0, "sharded data parallelism (ZeRO): 0 plain DDP; 1 shards the optimizer state; 2 also "
                     "the averaged gradients (reduce-scattered during backward); 3 also the parameters "
                     "(gathered per layer group before its forward and backward, freed after); with "
                     "1-3 checkpoints are one shard file per rank plus an index, read back at any stage "
                     "and world size, so it may change on --resume", metavar="{0,1,2,3}",
                     resume="inherit")
    tp: int = _opt(1, "tensor parallelism: split every attention's heads and every MLP pair of Linears over "
                   "this many ranks (Megatron-style; --model mlp or gpt); the world holds dp x pp x tp ranks; "
                   "may change on --resume", metavar="K", resume="inherit")
    sequence_parallel: bool = _opt(False, "with --tp above 1 and --model gpt: split every LayerNorm and residual "
                                   "region along the sequence over the tensor group (Megatron-style; all-gather "
                                   "before each column-parallel layer, reduce-scatter after each row-parallel "
                                   "one); --context-length must be a multiple of --tp; may change on --resume")
    pp: int = _opt(1, "pipeline parallelism: cut the model into this many stages balanced by parameter count, "
                   "one per rank of a pipeline (--model mlp or gpt); may change on --resume", metavar="K",
                   resume="inherit")
    micro_batches: int = _opt(0, "micro-batches per step and data replica with --tp/--pp (0: --pp)",
                              metavar="M", resume="inherit")
    pp_schedule: str = _opt("1f1b", "pipeline schedule: gpipe (all forwards, then all backwards) or 1f1b "
                            "(one forward, one backward; fewer micro-batches in flight)",
                            choices=SCHEDULES, resume="inherit")
    # --- model
    model: str = _opt("mlp", "network: mlp (Linear+ReLU layers), cnn (3x3 conv, ReLU, 2x2 max-pool "
                      "stages, then a dense head) or gpt (a Transformer language model on token data)",
                      choices=MODELS, resume="match")
    hidden: list = _opt([256, 256], "widths of the hidden dense layers (the MLP, or the CNN's head)",
                        metavar="N", resume="match")
    channels: list = _opt([8, 16], "CNN only: output channels of each conv stage", metavar="C",
                          resume="match")
    dropout: float = _opt(0.0, "dropout probability after each hidden dense layer, in [0, 1) "
                          "(0: no dropout layers); each rank draws its own masks (with --tp/--pp: one process's "
                          "masks, positioned by sample row)", metavar="P",
                          resume="match")
    dtype: str = _opt("float32", "floating type of data, parameters and gradients", choices=DTYPES,
                      resume="match")
    model_size: str = _opt("tiny", "GPT only: size preset (" + ", ".join(
        f"{k} d_model {v[0]}, {v[2]} layers" for k, v in PRESETS.items()) + ")", choices=tuple(PRESETS),
        resume="match")
    context_length: int = _opt(64, "GPT only: tokens per training sequence (and learned positions)",
                               metavar="T", resume="match")
    moe_experts: int = _opt(0, "GPT only: a mixture of this many expert MLPs in every block's MLP place, with a "
                            "learned router (0: plain MLPs)", metavar="E", resume="match")
    moe_top_k: int = _opt(1, "GPT with --moe-experts: experts per token, in [1, E]", metavar="K", resume="match")
    moe_capacity: float = _opt(1.25, "GPT with --moe-experts: capacity factor, > 0; an expert takes at most "
                               "ceil(factor * K * T / E) tokens of a sequence, the rest pass by", metavar="F",
                               resume="match")
    moe_aux: float = _opt(0.01, "GPT with --moe-experts: weight of the load-balancing loss, >= 0", metavar="C",
                          resume="match")
    vocab_size: int = _opt(0, "GPT only: vocabulary size (0: from the data: 256 for text: and "
                           "synthetic-tokens, largest id + 1 for tokens:)", metavar="V", resume="match")
    # --- data
    dataset: typing.Optional[str] = _opt(
        None, "synthetic, synthetic-image, digits (needs scikit-learn), mnist (IDX files in "
        "--data-dir), a .npz/.h5/.hdf5 file, or a directory (a path with a '/') of two .npy "
        "files; the arrays are --x-key (inputs) and --y-key (integer labels); for --model gpt: "
        "synthetic-tokens (a random Markov chain), tokens:PATH (a .bin of uint16 token ids, as "
        "nanoGPT writes them, or a 1-D .npy) or text:PATH (a file's bytes)",
        metavar="NAME|PATH", resume="match",
        shown="synthetic; synthetic-image with --model cnn; synthetic-tokens with --model gpt")
    x_key: str = _opt("X", "array of inputs in an array file: an .npz name, an HDF5 path such as "
                      "train/images, or <KEY>.npy in a directory", metavar="KEY", resume="match")
    y_key: str = _opt("y", "array of integer class labels, named like --x-key", metavar="KEY",
                      resume="match")
    normalize: str = _opt("none", "rescale inputs on load with training-set statistics: standard "
                          "(per feature: subtract the mean, divide by the standard deviation), unit "
                          "(min-max to [0, 1]) or none; inputs that look unscaled (integers, or "
                          "values beyond +-10) get a warning", choices=NORMALIZE_MODES,
                          resume="match")
    data_dir: typing.Optional[str] = _opt(None, "directory holding the MNIST files (and relative "
                                          "array-file paths)", metavar="DIR", shown="none",
                                          resume="inherit")
    train_samples: int = _opt(0, "use this many training rows (synthetic sets generate exactly that "
                              "many; 0: 32768 for synthetic, 8192 for synthetic-image, all rows "
                              "otherwise)", metavar="N",
                              resume="match")
    val_samples: int = _opt(0, "use this many validation rows (0: 1024 for synthetic sets, all "
                            "rows otherwise)", metavar="N", resume="inherit")
    # --- optimisation
    epochs: int = _opt(5, "passes over the training set", metavar="N", resume="inherit")
    batch_size: int = _opt(96, "GLOBAL batch size, split evenly across ranks: it must be a multiple "
                           "of the world size (96 suits 1, 2, 3, 4, 6, 8, ... ranks)", metavar="B",
                           resume="match")
    lr: typing.Optional[float] = _opt(
        None, "learning rate", metavar="LR", resume="inherit",
        shown=", ".join(f"{v:g} with {k}" for k, v in DEFAULT_LR.items()) + "; each optimizer's own, adamw's "
        "PyTorch's")
    optimizer: str = _opt("sgd", "sgd (with --momentum) or adamw", choices=OPTIMIZERS, resume="match")
    momentum: float = _opt(0.9, "SGD momentum in [0, 1) (ignored by adamw)", metavar="M",
                           resume="match")
    weight_decay: float = _opt(0.0, "L2 penalty for sgd, decoupled decay for adamw", metavar="WD",
                               resume="match")
    seed: int = _opt(0, "seed of the initial weights, the data shuffle (seed + epoch) and the "
                     "dropout streams", metavar="S", resume="match")
    max_steps: int = _opt(0, "stop after this many optimizer steps in all (counting those before a "
                          "--resume), writing the checkpoint; 0: no limit", metavar="N")
    # --- files
    checkpoint: typing.Optional[str] = _opt(
        None, "HDF5 checkpoint written atomically by rank 0 at the end of every epoch and of the "
        "run (and every --checkpoint-every steps), with a checksum per dataset; it may replace "
        "an npddp checkpoint, never another file", metavar="PATH.h5", shown="none")
    checkpoint_every: int = _opt(0, "also write the checkpoint every N optimizer steps (0: only "
                                 "at epoch ends and at the end)", metavar="N", resume="inherit")
    resume: typing.Union[bool, str] = _opt(
        False, "continue the run saved in --checkpoint, with its settings: flags "
        "marked [fixed on resume] are taken from it (given again, they must "
        "repeat the saved value), those marked [from the checkpoint] too unless "
        "given; the backend and the world size may change. --resume auto: resume if the "
        "checkpoint exists, else start fresh (for restarts by python -m npddp.run --max-restarts)",
        metavar="auto", shown="off", parse=resume_text, const=True)
    metrics: typing.Optional[str] = _opt(
        None, "HDF5 file of per-step and per-epoch metrics (groups /steps and /epochs of 1-D "
        "columns), rewritten atomically by rank 0 at every epoch end and checkpoint; an existing "
        "metrics file is replaced only with --overwrite (as the checkpoint is) and continued by "
        "--resume; never another file",
        metavar="PATH.h5", shown="none", resume="inherit")
    trace: typing.Optional[str] = _opt(
        None, "timeline of the --trace-steps steps on every rank (layers' forward and backward, each "
        "bucket's all-reduce, optimizer, data, checkpoints) in the Chrome trace format, for Perfetto "
        "or chrome://tracing; written by rank 0 when the last traced step ends (or at the end), and "
        "on a failure with what each failing rank recorded", metavar="FILE.json", shown=f"none, or ${variables.TRACE.name}")
    trace_steps: str = _opt(DEFAULT_STEPS, "optimizer steps --trace records, FIRST:LAST counted from 1 "
                            "as in the metrics, both included", metavar="FIRST:LAST", parse=steps_text)
    overwrite: bool = _opt(False, "let a new run replace an existing --checkpoint, --metrics or --trace "
                           "file; without it a run refuses to overwrite them, as they may hold another run "
                           "(--resume continues the checkpoint and metrics, and writes its own trace)")
    # --- process
    threads: typing.Union[int, str] = _opt(
        "auto", "BLAS threads per rank, applied with threadpoolctl before any NumPy work: auto "
        "(the CPUs this process may use divided by the ranks on this node, at least 1) or N",
        metavar="auto|N", parse=parse_threads)
    quiet: bool = _opt(False, "print only the final summary (and errors and warnings)")
    progress: str = _opt("auto", "progress within an epoch: bar (a tqdm bar on stderr), log (a "
                         "line every --log-every seconds on stdout, as under mpirun or in a log "
                         "file), auto (bar when stderr is a terminal, else log), or none",
                         choices=PROGRESS_MODES)
    log_every: float = _opt(10.0, "seconds between progress lines (--progress log)", metavar="SECONDS")
    inject_fault: typing.Optional[str] = _opt(
        None, "testing aid: on rank RANK at the start of optimizer step STEP (counted from 1, as "
        "in the metrics) raise an exception (KIND raise, the default), call sys.exit(3) (exit), "
        "or make the loss NaN (nan), to check that a failure on one rank ends the whole job",
        metavar="RANK:STEP[:KIND]", shown="none")

    def __post_init__(self):
        if self.lr is None:      # each optimizer's own default (an unknown name is check_config's error)
            object.__setattr__(self, "lr", DEFAULT_LR.get(self.optimizer, DEFAULT_LR["sgd"]))

    def dataset_name(self) -> str:
        """--dataset, or the default for --model."""
        if self.dataset is not None:
            return self.dataset
        return {"cnn": "synthetic-image", "gpt": "synthetic-tokens"}.get(self.model, "synthetic")

    def as_dict(self) -> dict:
        """The fields as a plain dict (lists copied)."""
        return {f.name: _copy(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _copy(value):
    return list(value) if isinstance(value, list) else value


def flag(name: str) -> str:
    """``batch_size`` -> ``--batch-size``."""
    return "--" + name.replace("_", "-")


def fixed_on_resume() -> tuple[str, ...]:
    """Names of the fields a resumed run takes from the checkpoint and may not change."""
    return tuple(f.name for f in dataclasses.fields(Config) if f.metadata["resume"] == "match")


def inherited_on_resume() -> tuple[str, ...]:
    """Names of the fields a resumed run takes from the checkpoint unless they are given again."""
    return tuple(f.name for f in dataclasses.fields(Config) if f.metadata["resume"] == "inherit")
