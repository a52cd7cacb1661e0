"""Communicators: the protocol, and backends chosen by name with :func:`create`.

A backend is either ``mpi`` (MPI's own collectives) or a hand-written algorithm over a
transport's point-to-point messages (``ring``, ``naive``, ``rd``, ``rabenseifner``, ``tree``,
or ``auto``, which picks one per call). The transport is ``mpi`` (mpi4py's Isend/Irecv) or
``tcp`` (plain sockets, set up from torchrun's environment variables by ``python -m npddp.run``);
``auto`` takes tcp when RANK and WORLD_SIZE are set outside an MPI launcher, mpi otherwise (a
single process started by no launcher where MPI cannot be loaded gets a TCP world of one, where
backend ``mpi`` is refused as under ``npddp.run``: it needs MPI).

Two environment variables reach every communicator ``create`` builds (and so the training CLI):

* ``NPDDP_DEBUG=1`` wraps it in :class:`~npddp.comm.wrappers.debug.DebugCommunicator`, which checks before
  every collective that all ranks make the same call and raises :class:`CollectiveMismatchError`
  (on every rank) when they do not.
* ``NPDDP_CHECK_ARGS=0`` turns off the check every collective makes by default: that all ranks
  passed the same kind of collective, dtype, element count, op and root (a mismatch raises
  :class:`CollectiveMismatchError` on every rank and closes the communicator; see
  :mod:`npddp.comm.signature` and docs/guide/comm.md). Off only to measure what the check costs.
* ``NPDDP_TIMEOUT=SECONDS`` sets the timeout of every backend when ``create`` is given none
  (default ``DEFAULT_TIMEOUT``, 300 s): no wait lasts longer.

The first ``create`` also protects the calling script (:mod:`npddp.util.guard`): an exception
escaping on one rank ends the whole job (``NPDDP_ABORT_ON_EXCEPTION=0`` turns that off), and
each rank's BLAS gets its share of the node's cores unless a thread variable is set
(``NPDDP_THREADS=off`` turns that off). Under MPI, the first world-wide ``create`` also sets up the
notices by which a rank that leaves normally ends the ranks still waiting for it (:class:`guard.Departures`).
"""

from __future__ import annotations

from npddp.comm.checks import (DEFAULT_TIMEOUT, DTYPES, OPS, check_args_from_env, check_timeout, debug_from_env,
                               timeout_from_env)
from npddp.comm.base import Communicator, Work
from npddp.comm.engine.work import DoneWork
from npddp.comm.signature import CollectiveMismatchError
from npddp.comm.communicators.choice import check_algorithms
from npddp.comm.wrappers.progress_thread import PROGRESS
from npddp.comm.algorithms.registry import ALGORITHMS, BACKENDS, backend_names, load_plugins
from npddp.comm.algorithms.api import register_algorithm
from npddp.comm.transports.base import (TRANSPORTS, Transport, is_transport, register_transport, resolve_transport,
                                       transport_names, world_transport)
from npddp.util import guard

__all__ = ["ALGORITHMS", "BACKENDS", "DEFAULT_TIMEOUT", "DTYPES", "OPS", "TRANSPORTS",
           "CollectiveMismatchError", "Communicator", "DoneWork", "Transport", "Work", "create",
           "register_algorithm", "register_transport", "backend_names", "load_plugins", "transport_names"]


def create(name: str, group=None, debug: bool = False, timeout: float | None = None, *,
           transport: str = "auto", tuning=None, progress: str = "caller", check_args: bool | None = None,
           algorithms: dict | None = None) -> Communicator:
    """Build the backend called ``name`` over ``group`` (default: every rank of the chosen transport).

    ``group`` is an mpi4py communicator (transport mpi), a :class:`Transport`, or None. With None,
    every communicator gets a message context of its own (MPI: a ``Dup`` of COMM_WORLD; TCP: a
    context all ranks agree on), so none ever matches another's messages; a group you pass is
    used as it is (its context shared with your own messages on it: pass ``comm.Dup()`` to isolate).
    ``transport``: ``mpi``, ``tcp``, ``auto`` (see the module docstring) or a registered one (:func:`register_transport`).
    ``debug=True`` (or ``NPDDP_DEBUG=1``) checks every collective's arguments across ranks first.
    ``timeout``: seconds a blocking call may wait for its peers before TimeoutError; None takes
    ``NPDDP_TIMEOUT``, else ``DEFAULT_TIMEOUT``. ``tuning`` (``auto`` only): a tuning table path.
    ``progress``: ``caller`` (non-blocking work moves when tested or waited on) or ``thread`` (a
    background thread drives it; see :mod:`npddp.comm.wrappers.progress_thread`).
    ``check_args``: every collective checks that all ranks passed the same kind, dtype, count, op
    and root (None: ``NPDDP_CHECK_ARGS``, on unless set to 0); every rank must pass the same.
    ``algorithms``: the algorithm of each other collective, e.g. ``{"allgather": "bruck", "reduce_scatter":
    "halving"}`` or ``"auto"`` (the cost model's pick per call); unnamed ones run the ring's halves, under ``auto``
    its picks (:mod:`npddp.comm.communicators.choice`). Every rank must pass the same.
    """
    _check_create(name, debug, tuning, progress, check_args)
    algorithms = check_algorithms(algorithms)
    if algorithms and name == "mpi":
        raise ValueError(f"algorithms={algorithms} applies to npddp's own backends; the mpi backend runs MPI's own "
                         "collectives (force MPI's algorithms with its own variables: benchmarks/mpi_algorithms.py)")
    check_args = check_args_from_env() if check_args is None else check_args
    timeout = timeout_from_env() if timeout is None else check_timeout(timeout)
    debug = debug or debug_from_env()
    kind = _transport_of(group, transport)
    if kind == "mpi" and group is None:
        from npddp.comm.transports.mpi import launcher_refusal
        refusal = launcher_refusal()     # before anything loads MPI: its MPI_Init would end the process
        if refusal is not None:
            raise ValueError(refusal)
    guard.install()
    if name == "mpi":
        comm = _mpi_backend(group, kind, timeout, check_args)
    else:
        from npddp.comm.backends import build
        comm = build(name, _transport_for(group, kind, timeout), timeout, tuning, algorithms=algorithms)
        comm.check_args = check_args
    if kind == "mpi" and group is None:
        guard.watch_departures()   # a rank that leaves while others need it ends them (collective, once)
    if debug:
        from npddp.comm.wrappers.debug import DebugCommunicator
        comm = DebugCommunicator(comm)
    if progress == "thread":
        from npddp.comm.wrappers.progress_thread import ThreadedCommunicator
        comm = ThreadedCommunicator(comm)
    return comm


def _check_create(name: str, debug, tuning, progress: str, check_args) -> None:
    """``create``'s arguments, each checked before anything is built; ValueError/TypeError naming the bad one."""
    if progress not in PROGRESS:
        raise ValueError(f"unknown progress {progress!r}; valid: {', '.join(PROGRESS)}")
    if name not in BACKENDS and name not in backend_names():
        raise ValueError(f"unknown backend {name!r}; valid backends: {', '.join(backend_names())}")
    if not isinstance(debug, bool):
        raise TypeError(f"debug must be a bool, got {type(debug).__name__}")
    if tuning is not None and name != "auto":
        raise ValueError(f"tuning={tuning!r} applies to backend 'auto' only, not {name!r}")
    if check_args is not None and not isinstance(check_args, bool):
        raise TypeError(f"check_args must be a bool or None, got {type(check_args).__name__}")


def _mpi_backend(group, kind: str, timeout: float, check_args: bool) -> Communicator:
    """Backend ``mpi``: MPI's own collectives on ``group`` (None: a Dup of the world); transport mpi only."""
    if kind != "mpi":
        from npddp.comm.transports.mpi import mpi_missing
        missing = mpi_missing() if group is None else None
        why = f" (no MPI here: {missing})" if missing else ""
        raise ValueError(f"backend 'mpi' runs MPI's own collectives, so it needs transport 'mpi', not {kind!r}{why}; "
                         f"over {kind} use a hand-written backend: {', '.join(BACKENDS[1:])}")
    from npddp.comm.mpi import MPICommunicator
    return MPICommunicator(group.comm if is_transport(group) else group, timeout, dup=group is None,
                           check_args=check_args)


def _transport_for(group, kind: str, timeout: float) -> Transport:
    """The transport a hand-written backend runs over: ``group`` itself, an mpi4py group wrapped, or the world
    of transport ``kind`` in a context of its own (every rank alike)."""
    if is_transport(group):
        return group
    if group is not None:   # an mpi4py communicator: used as it is
        from npddp.comm.transports.mpi import MPITransport
        return MPITransport(group, dup=False)
    return world_transport(kind, timeout)


def _transport_of(group, transport: str) -> str:
    """``mpi`` or ``tcp``: what ``group`` is, else what ``transport`` resolves to; ValueError on a clash."""
    kind = resolve_transport(transport, probe=group is None)
    if group is None:
        return kind
    given = group.name if is_transport(group) else "mpi"
    if transport != "auto" and given != kind:
        raise ValueError(f"transport={transport!r} does not match the group passed, which is a {given} group")
    return given
