"""The Transport seam: what the hand-written algorithms need to move bytes between ranks, and nothing more.

An algorithm is a schedule of sends, receives and reductions; a transport moves bytes. Every
hand-written collective (``ring``, ``naive``, ``rd``, ...) is written against :class:`Transport`
only, so the same schedule runs over MPI's point-to-point layer
(:class:`~npddp.comm.transports.mpi.MPITransport`) or over plain TCP sockets
(:class:`~npddp.comm.transports.tcp.TCPTransport`) and adds in the same order on both.

Semantics follow MPI's non-blocking point-to-point calls: a message is matched by (source,
tag); messages between one pair with the same tag arrive in the order they were sent; messages
with different tags may be matched in any order. A send may complete only once the receiver
has posted its receive (large messages), so a schedule posts its receives before it waits on
its sends. ``cancel()`` abandons a request after a timeout: the transport stops using the
request, although (over MPI) the library may still touch its buffer.

This module also holds the transports by name (:func:`register_transport`: ``mpi`` and ``tcp``
are registered through it, a user's own the same way) and decides which one ``transport="auto"``
means, from the environment alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

from npddp.util import env
from npddp.util.registry import Registry

#: The built-in transports by name (every registered one: :func:`transport_names`).
TRANSPORTS = ("mpi", "tcp")


@runtime_checkable
class Request(Protocol):
    """One posted send or receive."""

    def test(self) -> bool:
        """Progress the transport without blocking; True once this request has completed."""

    def cancel(self) -> None:
        """Abandon the request (after a timeout); it never completes afterwards."""


@runtime_checkable
class Transport(Protocol):
    """Non-blocking point-to-point messages of NumPy buffers between the ranks of one group."""

    @property
    def name(self) -> str:
        """The name it is registered under (:func:`transport_names`): ``mpi``, ``tcp`` or a user's."""

    @property
    def rank(self) -> int:
        """This process's rank in the group."""

    @property
    def size(self) -> int:
        """Number of ranks in the group."""

    def isend(self, buf: np.ndarray, dest: int, tag: int) -> Request:
        """Start sending the bytes of contiguous ``buf`` to ``dest``; ``buf`` must not change until done."""

    def irecv(self, buf: np.ndarray, source: int, tag: int) -> Request:
        """Start receiving a message from ``source`` with ``tag`` into contiguous ``buf``."""

    def split(self, colors) -> "Transport":
        """The transport among the ranks whose color matches this rank's (collective: every rank, same list)."""

    # Optional, read with getattr: ``tag_bound``, the largest tag it carries (32767, MPI's least, when absent);
    # ``unmatched_tags(source)``, the tags of messages from ``source`` that arrived before their receive (a stalled
    # call's argument check looks there: npddp.comm.engine.signed). Without them every collective is signed in full.
    # A receive's request may offer ``received() -> (nbytes, dtype or None)`` once complete: the bytes that came and
    # the sender's dtype where the transport carries it (npddp.comm.status); without it a user's recv reports a full
    # buffer.


def is_transport(obj) -> bool:
    """True for a Transport; False for an mpi4py communicator (whose lower-case isend/irecv pickle)."""
    return isinstance(obj, Transport) and not type(obj).__module__.startswith("mpi4py")


#: Transports by name -> factory(timeout) building this rank's world transport (collective: every rank calls it).
_WORLDS = Registry("transport", reserved=("auto",))


def register_transport(name: str, world: Callable) -> None:
    """Make ``name`` a transport ``create(..., transport=name)`` accepts.

    ``world(timeout)`` returns this rank's :class:`Transport` over every rank of the job, in a message
    context of its own (``create`` calls it once per communicator, on every rank alike).
    """
    _WORLDS.check(name)
    if not callable(world):
        raise TypeError(f"the world of transport {name!r} must be callable (timeout -> Transport), "
                        f"got {type(world).__name__}")
    _WORLDS.add(name, world)


def transport_names() -> tuple:
    """Every transport name ``create`` accepts now (without ``auto``): the built-in ones, then the registered ones."""
    return _WORLDS.names()


def world_transport(name: str, timeout: float) -> Transport:
    """A new transport ``name`` over every rank of the job, in a context of its own (collective)."""
    return _WORLDS.get(resolve_transport(name))(timeout)


def resolve_transport(name: str, environ=None, probe: bool = False) -> str:
    """The transport ``name`` means; ``auto`` is tcp when RANK/WORLD_SIZE are set outside an MPI launcher, else mpi.

    ``probe=True`` (about to build a world): ``auto`` is also tcp, a world of one, when no launcher started this
    process and MPI cannot be loaded (:func:`~npddp.comm.transports.mpi.mpi_missing`, which loads it otherwise).
    """
    if name not in (*_WORLDS, "auto"):
        raise ValueError(f"unknown transport {name!r}; valid transports: {', '.join(_WORLDS)}, auto")
    if name != "auto":
        return name
    if env.launched_by_tcp_launcher(environ):
        return "tcp"
    if probe:
        from npddp.comm.transports.mpi import mpi_missing
        return "tcp" if mpi_missing(environ) else "mpi"
    return "mpi"


def _mpi_world(timeout: float) -> Transport:
    """MPI's point-to-point layer over a Dup of COMM_WORLD (mpi4py is imported here, on first use)."""
    from npddp.comm.transports.mpi import MPITransport
    return MPITransport(None, dup=True)


def _tcp_world(timeout: float) -> Transport:
    """npddp's sockets over the launcher's world, in a context every rank agrees on."""
    from npddp.comm.transports.world import transport_from_env
    return transport_from_env(timeout)


register_transport("mpi", _mpi_world)
register_transport("tcp", _tcp_world)
