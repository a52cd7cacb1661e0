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

This module also decides which transport ``transport="auto"`` means, from the environment alone.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from npddp.util import env

#: Transports by name, as ``npddp.comm.create(..., transport=NAME)`` accepts them.
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
        """``mpi`` or ``tcp``: one of :data:`TRANSPORTS`."""

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


def is_transport(obj) -> bool:
    """True for a Transport; False for an mpi4py communicator (whose lower-case isend/irecv pickle)."""
    return isinstance(obj, Transport) and not type(obj).__module__.startswith("mpi4py")


def resolve_transport(name: str, environ=None) -> str:
    """``mpi`` or ``tcp`` for ``name``; ``auto`` is tcp when RANK/WORLD_SIZE are set outside an MPI launcher."""
    if name not in (*TRANSPORTS, "auto"):
        raise ValueError(f"unknown transport {name!r}; valid transports: {', '.join(TRANSPORTS)}, auto")
    if name != "auto":
        return name
    return "tcp" if env.launched_by_tcp_launcher(environ) else "mpi"
