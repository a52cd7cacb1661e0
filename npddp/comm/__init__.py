"""Communicators: the protocol, and backends chosen by name with :func:`create`.

A backend is either ``mpi`` (MPI's own collectives) or a hand-written algorithm over a
transport's point-to-point messages (``ring``, ``naive``, ``rd``, ``rabenseifner``, ``tree``,
or ``auto``, which picks one per call). The transport is ``mpi`` (mpi4py's Isend/Irecv) or
``tcp`` (plain sockets, set up from torchrun's environment variables by ``python -m npddp.run``);
``auto`` takes tcp when RANK and WORLD_SIZE are set outside an MPI launcher, mpi otherwise.

Two environment variables reach every communicator ``create`` builds (and so the training CLI):

* ``NPDDP_DEBUG=1`` wraps it in :class:`~npddp.comm.wrappers.debug.DebugCommunicator`, which checks before
  every collective that all ranks make the same call and raises :class:`CollectiveMismatchError`
  (on every rank) when they do not.
* ``NPDDP_TIMEOUT=SECONDS`` sets the timeout of every backend when ``create`` is given none
  (default ``DEFAULT_TIMEOUT``, 300 s): no wait lasts longer.
"""

from __future__ import annotations

import os

from npddp.comm.checks import DEFAULT_TIMEOUT, DTYPES, OPS, check_timeout
from npddp.comm.base import Communicator, Work
from npddp.comm.wrappers.debug import CollectiveMismatchError
from npddp.comm.wrappers.progress_thread import PROGRESS
from npddp.comm.registry import ALGORITHMS, BACKENDS, backend_names, load_plugins
from npddp.comm.algorithm import register_algorithm
from npddp.comm.transports.base import TRANSPORTS, Transport, is_transport, resolve_transport

__all__ = ["ALGORITHMS", "BACKENDS", "DEFAULT_TIMEOUT", "DTYPES", "OPS", "TRANSPORTS",
           "CollectiveMismatchError", "Communicator", "Transport", "Work", "create", "debug_from_env",
           "timeout_from_env", "register_algorithm", "backend_names", "load_plugins"]

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


def debug_from_env(environ=None) -> bool:
    """``NPDDP_DEBUG`` as a bool (unset: False); ValueError naming the valid values otherwise."""
    raw = (os.environ if environ is None else environ).get("NPDDP_DEBUG", "")
    value = raw.strip().lower()
    if value not in _TRUE + _FALSE:
        raise ValueError(f"NPDDP_DEBUG={raw!r} is not understood; valid: 1/true/yes/on or 0/false/no/off (or unset)")
    return value in _TRUE


def timeout_from_env(environ=None) -> float:
    """``NPDDP_TIMEOUT`` in seconds (unset or empty: ``DEFAULT_TIMEOUT``); ValueError when malformed."""
    raw = (os.environ if environ is None else environ).get("NPDDP_TIMEOUT", "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"NPDDP_TIMEOUT={raw!r} is not a number; valid: seconds > 0 (inf: wait forever)") from None
    return check_timeout(value, "NPDDP_TIMEOUT")


def create(name: str, group=None, debug: bool = False, timeout: float | None = None, *,
           transport: str = "auto", tuning=None, progress: str = "caller") -> Communicator:
    """Build the backend called ``name`` over ``group`` (default: every rank of the chosen transport).

    ``group`` is an mpi4py communicator (transport mpi), a :class:`Transport`, or None.
    ``transport``: ``mpi``, ``tcp`` or ``auto`` (see the module docstring).
    ``debug=True`` (or ``NPDDP_DEBUG=1``) checks every collective's arguments across ranks first.
    ``timeout``: seconds a blocking call may wait for its peers before TimeoutError; None takes
    ``NPDDP_TIMEOUT``, else ``DEFAULT_TIMEOUT``. ``tuning`` (``auto`` only): a tuning table path.
    ``progress``: ``caller`` (non-blocking work moves when tested or waited on) or ``thread`` (a
    background thread drives it; see :mod:`npddp.comm.wrappers.progress_thread`).
    """
    if progress not in PROGRESS:
        raise ValueError(f"unknown progress {progress!r}; valid: {', '.join(PROGRESS)}")
    if name not in BACKENDS and name not in backend_names():
        raise ValueError(f"unknown backend {name!r}; valid backends: {', '.join(backend_names())}")
    if not isinstance(debug, bool):
        raise TypeError(f"debug must be a bool, got {type(debug).__name__}")
    if tuning is not None and name != "auto":
        raise ValueError(f"tuning={tuning!r} applies to backend 'auto' only, not {name!r}")
    timeout = timeout_from_env() if timeout is None else check_timeout(timeout)
    debug = debug or debug_from_env()
    kind = _transport_of(group, transport)
    if name == "mpi":
        if kind != "mpi":
            raise ValueError("backend 'mpi' runs MPI's own collectives, so it needs transport 'mpi', not "
                             f"{kind!r}; over tcp use a hand-written backend: {', '.join(BACKENDS[1:])}")
        from npddp.comm.mpi import MPICommunicator
        comm = MPICommunicator(group.comm if is_transport(group) else group, timeout, dup=True)
    else:
        if kind == "mpi" and not is_transport(group):
            from npddp.comm.transports.mpi import MPITransport
            group = MPITransport(group, dup=True)   # a context of its own: never matches another's messages
        elif group is None:
            from npddp.comm.transports.rendezvous import transport_from_env
            group = transport_from_env(timeout)     # a context of its own, agreed by every rank
        from npddp.comm.registry import build
        comm = build(name, group, timeout, tuning)
    if debug:
        from npddp.comm.wrappers.debug import DebugCommunicator
        comm = DebugCommunicator(comm)
    if progress == "thread":
        from npddp.comm.wrappers.progress_thread import ThreadedCommunicator
        comm = ThreadedCommunicator(comm)
    return comm


def _transport_of(group, transport: str) -> str:
    """``mpi`` or ``tcp``: what ``group`` is, else what ``transport`` resolves to; ValueError on a clash."""
    kind = resolve_transport(transport)
    if group is None:
        return kind
    given = group.name if is_transport(group) else "mpi"
    if transport != "auto" and given != kind:
        raise ValueError(f"transport={transport!r} does not match the group passed, which is a {given} group")
    return given
