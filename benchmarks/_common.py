"""What the benchmark faces share; everything here is small and has no side effects on import.

* Units: :func:`parse_size` / :func:`format_size` (bytes, binary suffixes: ``1K`` = 1024, as
  nccl-tests), :func:`parse_count` / :func:`format_count` (decimal: ``25M`` = 25,000,000);
  bandwidths in GB/s with :data:`GB` = 1e9 bytes; :func:`busbw_factor` of each collective.
* Arguments: :class:`RankParser` (prints on one rank only), the argparse types :func:`names`,
  :func:`positive_floats`, :func:`int_at_least`, and :func:`check_out` for output paths.
* Communicators: :func:`create_comm` (a backend over a transport), :func:`algorithm_of` (what
  an ``auto`` backend picks), :class:`NoComm` (all-reduces skipped: the DDP no-comm ceiling).
* The MLP workload the DDP benchmarks train: :data:`MODELS`, :func:`param_count`, :data:`LR`,
  :data:`MOMENTUM`.
* :func:`format_table`: a fixed-width text table from row dicts.

Import it as ``from . import _common`` inside the package, or ``import _common`` from a
script run by path (its directory is then ``sys.path[0]``).
"""

from __future__ import annotations

import argparse
import re

import numpy as np

from benchmarks.columns import COLLECTIVES, NO_COMM
from npddp.comm import DoneWork
from npddp.util import plugins
from npddp.util.atomicfile import target_problem

GB = 1e9
#: The transport every backend uses today; the sweep's ``transport`` column.
DEFAULT_TRANSPORT = "mpi"

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)\s*$", re.IGNORECASE)
_BINARY = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_DECIMAL = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


# ----------------------------------------------------------------------------- units

def parse_size(text: str) -> int:
    """Bytes from ``"8"``, ``"1K"``, ``"64M"``, ``"1G"`` (binary multiples); ValueError otherwise."""
    return _parse(text, _BINARY, "size")


def parse_count(text: str) -> int:
    """A count from ``"1M"``, ``"350M"`` (decimal multiples); ValueError otherwise."""
    return _parse(text, _DECIMAL, "count")


def _parse(text: str, table: dict, what: str) -> int:
    """Integer with an optional K/M/G/T suffix scaled by ``table``."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"bad {what} {text!r}; expected an integer with an optional K, M, G or T "
                         "suffix, e.g. 8, 1K, 64M")
    return int(m.group(1)) * table[m.group(2).upper()]


def format_size(nbytes: int) -> str:
    """Short binary size: 8 -> "8", 4096 -> "4K", 3 << 20 -> "3M", 1536 -> "1536"."""
    for suffix in ("T", "G", "M", "K"):
        unit = _BINARY[suffix]
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return str(nbytes)


def format_count(n: int) -> str:
    """Short decimal count, 3 significant digits: 25_000_000 -> "25M", 1500 -> "1.5K", 1068810 -> "1.07M"."""
    for suffix in ("T", "G", "M", "K"):
        unit = _DECIMAL[suffix]
        if n >= unit:
            return f"{n / unit:.3g}{suffix}"
    return str(n)


def check_collective(collective: str, n: int) -> None:
    """ValueError for an unknown collective or a world size below 1."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; valid: {', '.join(COLLECTIVES)}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"world size must be an int >= 1, got {n!r}")


def offered(collective: str) -> bool:
    """True when npddp's communicator protocol declares ``collective`` (so every backend has it); MPI's own call in a
    bare mpi4py loop times it either way. A collective the protocol gains later (all-to-all) needs no change here."""
    from npddp.comm import Communicator

    check_collective(collective, 1)
    return collective in vars(Communicator)


def busbw_factor(collective: str, n: int) -> float:
    """busbw = algbw x this (nccl-tests'): all-reduce 2(n-1)/n, all-gather, reduce-scatter and all-to-all (n-1)/n,
    broadcast 1."""
    check_collective(collective, n)
    if collective == "allreduce":
        return 2.0 * (n - 1) / n
    if collective == "broadcast":
        return 1.0
    return (n - 1) / n


# ----------------------------------------------------------------------------- arguments

class RankParser(argparse.ArgumentParser):
    """ArgumentParser that prints (help, usage, errors) only where ``verbose`` is set."""

    def __init__(self, *args, verbose: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.verbose = verbose

    def _print_message(self, message, file=None):
        if self.verbose:
            super()._print_message(message, file)

    def error(self, message):
        """argparse's error; an unknown backend's also says that a --plugin module registers more."""
        if "unknown backend" in message and "--plugin" not in message:
            message += f" ({PLUGIN_HINT})"
        super().error(message)


def names(valid) -> callable:
    """argparse type: a comma-separated list of distinct names from ``valid``."""
    def convert(text: str) -> tuple:
        items = tuple(t.strip() for t in text.split(","))
        bad = [t for t in items if t not in valid]
        if bad:
            from npddp.comm import BACKENDS
            hint = f" ({PLUGIN_HINT})" if set(BACKENDS) <= set(valid) else ""
            raise argparse.ArgumentTypeError(f"unknown name {bad[0]!r}; valid: {', '.join(valid)}{hint}")
        if len(set(items)) != len(items):
            raise argparse.ArgumentTypeError(f"{text!r} names something twice")
        return items
    return convert


def positive_floats(text: str) -> tuple:
    """argparse type: a comma-separated list of distinct numbers > 0."""
    try:
        values = tuple(float(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not all(np.isfinite(v) and v > 0 for v in values) or len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"expected distinct finite numbers > 0, got {text!r}")
    return values


def int_at_least(low: int) -> callable:
    """argparse type: an int >= ``low``."""
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        return value
    return convert


def out_ok(path: str) -> bool:
    """True if ``path`` may be replaced: a regular file or nothing, in a writable directory (no FIFO, no device)."""
    return target_problem(repr(path), path) is None


def check_out(paths: dict, world, parser: argparse.ArgumentParser) -> None:
    """Exit 2 on every rank if rank 0 cannot write one of ``paths`` ({option: path}; one broadcast)."""
    problems = {option: target_problem(f"{option} {path!r}", path) if path else None for option, path in paths.items()}
    flags = np.array([problems[option] is not None if world.Get_rank() == 0 else False for option in paths],
                     dtype=np.int8)
    world.Bcast(flags, root=0)
    for (option, path), flag in zip(paths.items(), flags):
        if flag:
            parser.error(problems[option] or f"{option} {path!r} cannot be written")


# ----------------------------------------------------------------------------- communicators

def create_comm(backend: str, mpi_comm, transport: str = DEFAULT_TRANSPORT, tcp_world=None,
                progress: str = "caller", check_args: bool | None = None, algorithms: dict | None = None):
    """``npddp.comm.create`` of ``backend`` over ``transport``, its ranks those of ``mpi_comm``.

    Over tcp the communicator gets a message context of its own in ``tcp_world`` (see :func:`tcp_world`); over
    a transport a plugin registers (``npddp.comm.transport_names()``), one over every rank of the job.
    ``check_args``: the default argument check on or off (None: ``NPDDP_CHECK_ARGS``); ``algorithms``: ``create``'s.
    """
    from npddp import comm as npcomm

    kwargs = {"progress": progress, "check_args": check_args, "algorithms": algorithms}
    if transport == "tcp":
        return npcomm.create(backend, tcp_world.transport(), **kwargs)
    if transport != "mpi":   # a registered transport: every rank of the job, in a context of its own
        return npcomm.create(backend, transport=transport, **kwargs)
    return npcomm.create(backend, mpi_comm, transport=transport, **kwargs)


def tcp_world(mpi_comm):
    """A TCP mesh among ``mpi_comm``'s ranks, so one mpirun job can put the tcp transport beside mpi's."""
    from npddp.comm.transports.world import world_over_mpi

    return world_over_mpi(mpi_comm, 300.0)


def algorithm_of(comm, backend: str, nbytes: int, dtype: str) -> str:
    """The all-reduce algorithm ``comm`` runs for ``nbytes`` of ``dtype``: ``comm.algorithm_for`` if it
    has one (a backend that picks per call), else the backend's name."""
    pick = getattr(comm, "algorithm_for", None)
    return str(pick(int(nbytes), np.dtype(dtype))) if pick is not None else backend


class NoComm:
    """A communicator whose all-reduces do nothing: the same DDP step without communication.

    Rank and size are the wrapped communicator's, so DDP buckets, hooks and averages exactly
    as it would; the set-up calls DDP makes (broadcast, all-gather) go to the wrapped one.
    """

    name = NO_COMM
    algorithm_for = None   # picks no algorithm: not the wrapped communicator's (DDP's traces name none)

    def __init__(self, inner):
        self._inner = inner

    @property
    def rank(self) -> int:
        """The wrapped communicator's rank."""
        return self._inner.rank

    @property
    def size(self) -> int:
        """The wrapped communicator's size."""
        return self._inner.size

    def allreduce(self, buf, op="sum", out=None):
        """Skip the reduction: ``out`` receives ``buf`` unchanged (nothing happens in place)."""
        if out is not None and out is not buf:
            np.copyto(out, buf)
            return out
        return buf

    def iallreduce(self, buf, op="sum"):
        """A Work handle that is already complete."""
        return DoneWork(buf)

    def __getattr__(self, name):
        """Everything else (barrier, broadcast, allgather, ...) is the wrapped communicator's."""
        return getattr(self._inner, name)


# ----------------------------------------------------------------------------- the MLP workload

IN_FEATURES, OUT_FEATURES = 784, 10
#: Hidden widths of the MLPs the DDP benchmarks train (784 inputs, 10 outputs, ReLU between layers).
#: Hidden widths by name: tiny 1.07M parameters, base 2.9M (784-1024x3-10), small 5.0M, medium 18.4M.
MODELS = {"tiny": (1024, 256), "base": (1024,) * 3, "small": (1024,) * 5, "medium": (2048,) * 5}
LR, MOMENTUM = 0.01, 0.9


def widths(model: str) -> tuple:
    """Layer widths of a named model, input to output."""
    return (IN_FEATURES, *MODELS[model], OUT_FEATURES)


def param_count(model: str) -> int:
    """Trainable parameters of a named model."""
    w = widths(model)
    return sum(a * b + b for a, b in zip(w[:-1], w[1:]))


# ----------------------------------------------------------------------------- text tables

def format_table(rows: list[dict], spec) -> str:
    """Fixed-width table of ``rows``; ``spec``: (column, header, width, format spec) per column."""
    lines = [" ".join(head.rjust(width) for _, head, width, _ in spec)]
    for r in rows:
        lines.append(" ".join(format(r[col], f">{width}{fmt}") for col, _, width, fmt in spec))
    return "\n".join(lines)


#: What an unknown backend's error adds: where algorithms of one's own come from.
PLUGIN_HINT = "an algorithm of your own: --plugin MODULE registers it"
PLUGIN_HELP = ("import MODULE first (a dotted name or a .py path; repeatable): it registers all-reduce "
               "algorithms (npddp.comm.register_algorithm) that the backend lists then accept")


def load_plugins(argv) -> None:
    """Import the modules ``--plugin MODULE`` names in ``argv`` (before a parser checks backend names).

    Entry points of group ``npddp.algorithms`` load too. A module that cannot be imported is
    reported by the parser, which knows the flag (argparse ``type`` :func:`plugin`).
    """
    import sys
    for name in plugins.named(sys.argv[1:] if argv is None else argv):
        try:
            plugins.load([name])
        except ValueError:
            pass  # the parser's type check reports it


def plugin(text: str) -> str:
    """argparse type of ``--plugin``: the module, imported (it registers its algorithms)."""
    try:
        plugins.load([text])
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
