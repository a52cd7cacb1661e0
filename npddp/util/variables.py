"""Every ``NPDDP_*`` environment variable, declared once: name, kind, default, meaning; typed readers for them.

Code reads and writes these variables only through the declarations here (``variables.TIMEOUT.name``)
and the readers below, which share one true/false table and one number parser, each raising a
ValueError that names the variable, the value and the valid values. The table of variables in
docs/reference/variables.md is generated from the declarations (by docs/generate.py, which calls
:func:`markdown`; ``python -m npddp.util.variables --markdown`` prints the same table).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

#: What every npddp variable's name starts with.
PREFIX = "NPDDP_"
#: Spellings of on and off (any case, surrounding blanks ignored); unset or empty takes the default.
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
#: Where the generated table sits in docs/reference/variables.md.
BEGIN_MARK, END_MARK = "<!-- variables: begin (python -m npddp.util.variables --markdown) -->", "<!-- variables: end -->"


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, the kind of value, the default and what it does."""

    name: str
    kind: str      # flag, integer, seconds, threads, steps, path, text
    default: str   # as shown in the docs ("" : unset, nothing happens)
    meaning: str


ABORT_ON_EXCEPTION = Variable(
    "NPDDP_ABORT_ON_EXCEPTION", "flag", "on",
    "an exception escaping on one rank of several ends the whole job at once (a user's script, from its first "
    "`create`)")
AUTO_SHM = Variable(
    "NPDDP_AUTO_SHM", "flag", "on", "backend `auto` may pick shared memory on a node (`shm`, `hier`); off keeps both out")
CHECK_ARGS = Variable(
    "NPDDP_CHECK_ARGS", "flag", "on",
    "every collective checks that all ranks passed the same kind, dtype, count, op and root; off only to measure it")
CLUSTER_STATE = Variable(
    "NPDDP_CLUSTER_STATE", "path", "/run/npddp-cluster, else the temp dir",
    "where `python -m npddp.cluster` keeps its state files")
DEBUG = Variable(
    "NPDDP_DEBUG", "flag", "off",
    "`create` wraps every communicator in a checker that all ranks make the same call before each collective")
JOB_ID = Variable(
    "NPDDP_JOB_ID", "text", "the process id",
    "set by the launchers: names the job's shared-memory segments (so a failed job's are removed) and tells a rank "
    "that `python -m npddp.run` reports a Ctrl-C itself")
JOB_SECRET = Variable(
    "NPDDP_JOB_SECRET", "text", "a fresh one per job",
    "the key every TCP connection of the job proves it holds; `python -m npddp.run` makes one (or reads "
    "`--secret-file`)")
JOIN_DIR = Variable(
    "NPDDP_JOIN_DIR", "path", "",
    "set by `python -m npddp.run`: where each rank marks that it joins and has joined the TCP world")
LISTEN_ADDR = Variable(
    "NPDDP_LISTEN_ADDR", "text", "`MASTER_ADDR`",
    "where rank 0 listens for the rendezvous (`0.0.0.0`: every interface; beyond loopback only with a secret)")
RANKS_PER_NODE = Variable(
    "NPDDP_RANKS_PER_NODE", "integer", "",
    "pretend ranks `0..K-1` are one node, `K..2K-1` the next, ... (`1`: no shared memory)")
RESTART_COUNT = Variable(
    "NPDDP_RESTART_COUNT", "integer", "0",
    "set by the launchers with `--max-restarts`: how many times the job was started again")
SHM_WATCH = Variable(
    "NPDDP_SHM_WATCH", "flag", "on",
    "`mpi_run.sh` removes the shared-memory files a failed job leaves behind; `0` turns it off")
SINGLE_COPY = Variable(
    "NPDDP_SINGLE_COPY", "flag", "on",
    "ranks on a node read each other's private buffers directly (`process_vm_readv`); off stages them")
THREADS = Variable(
    "NPDDP_THREADS", "threads", "auto",
    "BLAS threads of a user's script with several ranks on a node and no thread variable set: `auto` (its share "
    "of the cores), a number, or `off`")
TIMEOUT = Variable(
    "NPDDP_TIMEOUT", "seconds", "300",
    "seconds any wait of any backend may last when `create` is given no timeout (`inf`: forever)")
TRACE = Variable(
    "NPDDP_TRACE", "path", "",
    "write a Chrome-format timeline of the traced steps to this file (any script using DDP)")
TRACE_STEPS = Variable(
    "NPDDP_TRACE_STEPS", "steps", "3:5", "the optimizer steps `NPDDP_TRACE` records, FIRST:LAST counted from 1")
TUNING = Variable(
    "NPDDP_TUNING", "path", "",
    "the tuning table backend `auto` reads (`python -m npddp.tune` writes one)")

#: Every variable, by name.
VARIABLES = tuple(sorted((v for v in globals().values() if isinstance(v, Variable)), key=lambda v: v.name))


def _environ(environ):
    return os.environ if environ is None else environ


def text(variable: Variable, environ=None) -> str:
    """The variable's value, blanks stripped ("" when unset)."""
    return _environ(environ).get(variable.name, "").strip()


def is_set(variable: Variable, environ=None) -> bool:
    """True when the variable is present in the environment, even empty."""
    return variable.name in _environ(environ)


def parse_flag(variable: Variable, raw: str) -> bool:
    """``raw`` as on or off (empty: the variable's default); ValueError naming the variable and the valid values."""
    value = raw.strip().lower() or variable.default
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise ValueError(f"{variable.name}={raw!r} is not understood; valid: 1/true/yes/on or 0/false/no/off (or unset)")


def flag(variable: Variable, environ=None) -> bool:
    """The variable as on or off (unset or empty: its default); ValueError naming the valid values."""
    return parse_flag(variable, _environ(environ).get(variable.name, ""))


def integer(variable: Variable, environ=None, minimum: int = 0) -> int | None:
    """The variable as an integer >= ``minimum`` (unset or empty: None); ValueError naming the valid values."""
    raw = _environ(environ).get(variable.name, "")
    if not raw.strip():
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValueError(f"{variable.name}={raw.strip()!r} is out of range; valid: an integer >= {minimum}")
    return value


def number(variable: Variable, environ=None, valid: str = "a number") -> float | None:
    """The variable as a float (unset or empty: None); ValueError naming the variable and ``valid``."""
    raw = text(variable, environ)
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{variable.name}={raw!r} is not a number; valid: {valid}") from None


def threads(environ=None) -> int | str | None:
    """``NPDDP_THREADS``: ``"auto"`` (unset or empty), a positive int, or None for off; ValueError otherwise."""
    raw = _environ(environ).get(THREADS.name, "")
    value = raw.strip().lower()
    if value in ("", "auto"):
        return "auto"
    if value in FALSE:
        return None
    if value.isdigit() and int(value) > 0:
        return int(value)
    raise ValueError(f"{THREADS.name}={raw!r} is not understood; valid: auto, a positive integer, or off")


def markdown() -> str:
    """The table of every variable, as docs/reference/variables.md shows it between its markers."""
    rows = ["| variable | value | default | what it does |", "|---|---|---|---|"]
    for v in VARIABLES:
        rows.append(f"| `{v.name}` | {v.kind} | {v.default or 'unset'} | {v.meaning} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    """Print the variables: the markdown table, or one name per line."""
    parser = argparse.ArgumentParser(prog="python -m npddp.util.variables",
                                     description="The NPDDP_* environment variables npddp reads.")
    parser.add_argument("--markdown", action="store_true", help="print the table docs/reference/variables.md holds")
    args = parser.parse_args(argv)
    print(markdown() if args.markdown else "\n".join(v.name for v in VARIABLES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
