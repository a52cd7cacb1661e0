"""The Communicator protocol every backend implements, the Work handle of a non-blocking call, and the
backends' base class (:class:`Backend`: rank, size, the timeout, ordinary ``empty``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import numpy as np

from npddp.comm.checks import check_timeout


@runtime_checkable
class Work(Protocol):
    """Handle of a non-blocking collective or point-to-point call."""

    def wait(self) -> np.ndarray:
        """Block until the collective is complete; return its result array."""

    def test(self) -> bool:
        """Advance the collective as far as possible without blocking; True once complete."""


@runtime_checkable
class Communicator(Protocol):
    """Collectives over NumPy buffers. Backends only reduce; they never average."""

    @property
    def rank(self) -> int:
        """This process's rank, 0 <= rank < size."""

    @property
    def size(self) -> int:
        """Number of ranks in the group."""

    @property
    def name(self) -> str:
        """Backend name as accepted by ``npddp.comm.create``."""

    #: Optional capability (read with ``getattr(comm, "algorithm_for", None)``): a backend that picks an all-reduce
    #: algorithm per call (``auto``) names it by ``algorithm_for(nbytes, dtype) -> str``; elsewhere it is :attr:`name`.
    algorithm_for: Callable[[int, np.dtype], str] | None = None

    @property
    def shared_memory(self) -> bool:
        """True when :meth:`empty` returns memory the other ranks of this node read in place."""

    def empty(self, shape, dtype=np.float32) -> np.ndarray:
        """A zeroed array for collective buffers: node shared memory where :attr:`shared_memory` (then a
        collective call: every rank, same shape and dtype), else ordinary memory."""

    def barrier(self) -> None:
        """Return only once every rank has entered the barrier."""

    def broadcast(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        """Overwrite ``buf`` on every rank with root's ``buf``, in place; return ``buf``."""

    def allreduce(self, buf: np.ndarray, op: str = "sum", out: np.ndarray | None = None) -> np.ndarray:
        """Reduce ``buf`` elementwise over ranks into ``out`` (``buf`` itself when None); return it."""

    def iallreduce(self, buf: np.ndarray, op: str = "sum") -> Work:
        """Start an in-place all-reduce of ``buf``; progress it with ``Work.test``/``Work.wait``."""

    def reduce_scatter(self, buf: np.ndarray, op: str = "sum") -> np.ndarray:
        """Reduce ``buf`` over ranks; return this rank's block, blocks as ``np.array_split(buf.ravel(), size)``."""

    def allgather(self, buf: np.ndarray) -> np.ndarray:
        """Return every rank's ``buf`` stacked, shape ``(size, *buf.shape)``."""

    def gather(self, buf: np.ndarray, root: int = 0) -> np.ndarray | None:
        """On root return every rank's ``buf`` stacked as ``(size, *buf.shape)``; None elsewhere."""

    def scatter(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        """Every rank passes ``buf`` of shape ``(size, *block)``; each returns root's ``buf[rank]``."""

    def send(self, buf: np.ndarray, dest: int, tag: int = 0) -> None:
        """Blocking point-to-point send of ``buf`` to ``dest``."""

    def recv(self, buf: np.ndarray, source: int, tag: int = 0, status=None) -> np.ndarray:
        """Blocking receive into ``buf`` from ``source``; return ``buf``. ``status`` (:class:`npddp.comm.status.Status`)
        gets the count and the sender's dtype where the transport carries it; ValueError when the message has
        another dtype or does not fit ``buf``."""

    def isend(self, buf: np.ndarray, dest: int, tag: int = 0) -> Work:
        """Start a send of ``buf`` to ``dest`` (user tag 0..16383); ``Work.wait`` returns ``buf``, reusable then."""

    def irecv(self, buf: np.ndarray, source: int, tag: int = 0, status=None) -> Work:
        """Start a receive into ``buf`` from ``source`` (user tag 0..16383); ``Work.wait`` returns ``buf``, filled,
        and fills ``status`` as :meth:`recv`."""

    def split(self, color: int | None, key: int = 0) -> "Communicator | None":
        """The same backend over the ranks that pass this rank's ``color``, ranked by ``key`` then rank, with
        messages of its own (collective: every rank calls it); None where ``color`` is None or negative."""

    def ireduce_scatter(self, buf: np.ndarray, op: str = "sum", out: np.ndarray | None = None) -> Work:
        """Start :meth:`reduce_scatter` into ``out`` (this rank's 1-d block; None: a new array)."""

    def iallgather(self, buf: np.ndarray, out: np.ndarray | None = None) -> Work:
        """Start :meth:`allgather` into ``out`` of shape ``(size, *buf.shape)``; ``buf`` may be ``out[rank]``."""

    def alltoall(self, buf: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """Rank r's ``buf[j]`` lands in rank j's ``out[r]``: ``buf`` and ``out`` (None: a new array) of shape
        ``(size, *block)``, ``out`` apart from ``buf``; return ``out``."""

    def ialltoall(self, buf: np.ndarray, out: np.ndarray | None = None) -> Work:
        """Start :meth:`alltoall`; ``Work.wait`` returns ``out``."""

    def alltoallv(self, buf: np.ndarray, sendcounts, recvcounts, out: np.ndarray | None = None) -> np.ndarray:
        """All-to-all with counts per peer. ``buf`` (read flat) holds ``sum(sendcounts)`` elements: block j, the
        ``sendcounts[j]`` after blocks 0..j-1, goes to rank j. ``out`` (1-d, ``sum(recvcounts)`` elements; None: a
        new array) gets rank s's block for this rank as block s (``recvcounts[s]`` elements). Rank i's
        ``sendcounts[j]`` must equal rank j's ``recvcounts[i]`` (with the argument check: CollectiveMismatchError
        on every rank otherwise); return ``out``."""

    def ialltoallv(self, buf: np.ndarray, sendcounts, recvcounts, out: np.ndarray | None = None) -> Work:
        """Start :meth:`alltoallv`; ``Work.wait`` returns ``out``."""


class Backend:
    """Base of the backends: rank and size (read once by the subclass) and the timeout every wait honours."""

    _rank: int
    _size: int
    _timeout: float

    #: Whether :meth:`empty` gives node shared memory; the shared-memory backends set it.
    shared_memory = False

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._rank

    def empty(self, shape, dtype=np.float32) -> np.ndarray:
        """A zeroed array in ordinary memory (backends with node shared memory override this)."""
        return np.zeros(shape, dtype=dtype)

    @property
    def size(self) -> int:
        """Number of ranks."""
        return self._size

    @property
    def timeout(self) -> float:
        """Seconds a blocking call (or ``Work.wait``) may wait for its peers before TimeoutError."""
        return self._timeout

    @timeout.setter
    def timeout(self, value) -> None:
        self._timeout = check_timeout(value)
