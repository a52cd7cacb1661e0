"""Run the communicator contract on any backend, built in or your own: one line per property.

    mpirun -n 4 python -m npddp.check --backend custom_ring --plugin examples.custom_allreduce
    python -m npddp.run --nproc 3 -m npddp.check --backend ring --transport tcp
    mpirun -n 4 python -m npddp.check --backend ring --alltoall bruck --broadcast scatter_allgather

Every rank runs the same calls (see :mod:`npddp.comm.contract`); rank 0 prints ``PASS`` or
``FAIL`` per property, then a summary, and on a failure one line naming the first failing case
(operation, dtype, op, size, rank). Exit status 0 when everything passed, 1 otherwise, 2 on bad
arguments.
"""

from __future__ import annotations

import argparse
import sys

from npddp.comm import backend_names
from npddp.comm.algorithms import registry
from npddp.comm.contract import PROPERTIES, run_contract
from npddp.process.job import JobError, open_communicator
from npddp.tools.arguments import load_plugins_and_check_transport
from npddp.util import env

PROG = "python -m npddp.check"
#: Collectives whose algorithm a flag of their name chooses (--alltoall, --broadcast).
CHOSEN = ("alltoall", "broadcast")


class _RankZeroParser(argparse.ArgumentParser):
    """An ArgumentParser whose help, usage and errors rank 0 alone prints; every rank exits alike."""

    def _print_message(self, message, file=None):
        if env.world_rank() == 0:
            super()._print_message(message, file)


def parse_args(argv=None) -> argparse.Namespace:
    """The options; ``--plugin`` modules are imported before ``--backend`` and ``--transport`` are checked."""
    p = _RankZeroParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import MODULE (a dotted name or a .py path) first; it registers algorithms or "
                        "transports (repeatable)")
    p.add_argument("--backend", required=True, metavar="NAME", help="the backend to check")
    p.add_argument("--transport", default="auto", metavar="NAME",
                   help="how hand-written backends move messages: auto, mpi, tcp or one a plugin registers "
                        "(default auto: tcp under npddp.run, else mpi)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="seconds a call may wait for its peers (default 60)")
    for collective in CHOSEN:
        p.add_argument(f"--{collective}", metavar="NAME",
                       help=f"the {collective} algorithm of a hand-written backend (default auto; one of "
                            f"npddp.comm.algorithms.registry.names({collective!r}))")
    args = p.parse_args(argv)
    load_plugins_and_check_transport(p, args)
    for collective in CHOSEN:
        name = getattr(args, collective)
        if name is not None and (args.backend == "mpi" or name not in ("auto", *registry.names(collective))):
            p.error(f"--{collective} {name!r} is unknown or --backend mpi (MPI's own); valid with a hand-written "
                    f"backend: auto, {', '.join(registry.names(collective))}")
    if args.backend not in backend_names():
        p.error(f"--backend {args.backend!r} is unknown; valid: {', '.join(backend_names())} "
                "(an algorithm of your own: --plugin MODULE)")
    return args


def main(argv=None) -> int:
    """Check, print, and return the exit status."""
    args = parse_args(argv)
    try:
        comm = open_communicator(args.backend, transport=args.transport, timeout=args.timeout,
                                 algorithms=None if args.alltoall is None else {"alltoall": args.alltoall})
    except JobError as exc:   # no MPI for --backend mpi, a world other than the launcher's: one line, exit 2
        if exc.local or env.world_rank() == 0:
            sys.stderr.write(f"error: {exc}\n")
        return exc.code
    if args.broadcast is not None:
        comm.broadcast_algorithm = args.broadcast
    outcomes = run_contract(comm)
    if comm.rank == 0:
        print(f"# {PROG}: backend {args.backend}, {comm.size} ranks")
        for o in outcomes:
            print(f"{'PASS' if o.failure is None else 'FAIL'}  {o.name} ({o.cases} cases)")
        failed = [o for o in outcomes if o.failure is not None]
        print(f"{len(outcomes) - len(failed)} passed, {len(failed)} failed of {len(PROPERTIES)} properties")
        if failed:
            print(f"first failure: {failed[0].failure}")
    return 1 if any(o.failure is not None for o in outcomes) else 0
