"""Communicators: the protocol, and backends chosen by name with :func:`create`.

Two environment variables reach every communicator ``create`` builds (and so the training CLI):

* ``NPDDP_DEBUG=1`` wraps it in :class:`~npddp.comm.debug.DebugCommunicator`, which checks before
  every collective that all ranks make the same call and raises :class:`CollectiveMismatchError`
  (on every rank) when they do not.
* ``NPDDP_TIMEOUT=SECONDS`` sets the timeout of the ``ring`` and ``naive`` backends when
  ``create`` is given none (default ``DEFAULT_TIMEOUT``, 300 s). The ``mpi`` backend runs inside
  MPI's own collectives, which cannot be interrupted: it has no timeout, so the variable is ignored
  there and an explicit ``timeout=`` is an error. Bound such a job with the launcher's own limit
  instead (MPICH: ``MPIEXEC_TIMEOUT=SECONDS``; Open MPI: ``mpirun --timeout SECONDS``).
"""

from __future__ import annotations

import os

from ._common import DEFAULT_TIMEOUT, DTYPES, OPS, check_timeout
from .base import Communicator, Work
from .debug import CollectiveMismatchError

BACKENDS = ("mpi", "ring", "naive")
#: Backends whose waits time out.
TIMEOUT_BACKENDS = ("ring", "naive")

__all__ = ["BACKENDS", "DEFAULT_TIMEOUT", "DTYPES", "OPS", "TIMEOUT_BACKENDS", "CollectiveMismatchError",
           "Communicator", "Work", "create", "debug_from_env", "timeout_from_env"]

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


def create(name: str, mpi_comm=None, debug: bool = False, timeout: float | None = None) -> Communicator:
    """Build the backend called ``name`` over ``mpi_comm`` (default ``MPI.COMM_WORLD``).

    ``debug=True`` (or ``NPDDP_DEBUG=1``) checks every collective's arguments across ranks first.
    ``timeout`` (ring and naive only): seconds a blocking call may wait for its peers before
    TimeoutError; None takes ``NPDDP_TIMEOUT``, else ``DEFAULT_TIMEOUT``.
    """
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; valid backends: {', '.join(BACKENDS)}")
    if not isinstance(debug, bool):
        raise TypeError(f"debug must be a bool, got {type(debug).__name__}")
    if timeout is not None:
        if name not in TIMEOUT_BACKENDS:
            raise ValueError(f"timeout={timeout} is not supported by backend {name!r}: MPI's own collectives "
                             f"cannot be interrupted; backends with a timeout: {', '.join(TIMEOUT_BACKENDS)}")
        timeout = check_timeout(timeout)
    elif name in TIMEOUT_BACKENDS:
        timeout = timeout_from_env()
    debug = debug or debug_from_env()
    if mpi_comm is None:
        from mpi4py import MPI
        mpi_comm = MPI.COMM_WORLD
    if name == "mpi":
        from .mpi import MPICommunicator
        comm = MPICommunicator(mpi_comm)
    elif name == "ring":
        from .ring import RingCommunicator
        comm = RingCommunicator(mpi_comm, timeout)
    else:
        from .naive import NaiveCommunicator
        comm = NaiveCommunicator(mpi_comm, timeout)
    if debug:
        from .debug import DebugCommunicator
        comm = DebugCommunicator(comm)
    return comm
