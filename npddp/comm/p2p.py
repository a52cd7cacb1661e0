"""Point-to-point plumbing shared by the hand-written backends (``ring``, ``naive``).

* :class:`ScratchPool` lends reusable receive buffers, so steady-state collectives allocate nothing.
* :class:`TagSequence` gives each collective its own tag, identical on all ranks, above the user tags.
* :class:`P2PWork` is the Work handle of a collective driven by point-to-point requests; its
  subclasses implement ``_advance(block)``. :class:`RoundWork` runs a schedule of rounds.
* :class:`P2PCommunicator` holds what both backends share: rank and size, the pool and tags,
  ``allreduce`` as start + wait, linear ``gather``/``scatter``, ``send``/``recv``.

Only point-to-point methods of the MPI communicator are called here (``Send``, ``Recv``,
``Isend``, ``Irecv``, ``Wait``/``Test`` on requests), never a collective.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np
from mpi4py import MPI

from . import _common as c


def wait_for(request) -> None:
    """Complete one MPI request, yielding the CPU between polls.

    Same as ``request.Wait()`` when every rank has a core; when ranks outnumber cores,
    a waiting rank hands its time slice to the rank it is waiting for instead of spinning.
    """
    while not request.Test():
        os.sched_yield()


class ScratchPool:
    """Receive buffers lent out and given back; a buffer is replaced only when too small."""

    __slots__ = ("_free", "_nbuffers", "_nbytes")

    def __init__(self):
        self._free: list[bytearray] = []
        self._nbuffers = 0
        self._nbytes = 0

    @property
    def nbuffers(self) -> int:
        """Number of buffers the pool owns (free and lent)."""
        return self._nbuffers

    @property
    def nbytes(self) -> int:
        """Total bytes of the buffers the pool owns (free and lent)."""
        return self._nbytes

    def acquire(self, nbytes: int) -> bytearray:
        """Lend the smallest free buffer of at least ``nbytes``; replace the largest free one if none fits."""
        free = self._free
        best = -1
        for i, b in enumerate(free):
            if len(b) >= nbytes and (best < 0 or len(b) < len(free[best])):
                best = i
        if best >= 0:
            return free.pop(best)
        if free:
            largest = max(range(len(free)), key=lambda i: len(free[i]))
            self._nbytes -= len(free.pop(largest))
            self._nbuffers -= 1
        buf = bytearray(max(nbytes, 1))
        self._nbytes += len(buf)
        self._nbuffers += 1
        return buf

    def release(self, buf: bytearray) -> None:
        """Take back a buffer lent by :meth:`acquire`."""
        self._free.append(buf)


class TagSequence:
    """Tags for collectives: ``USER_TAG_LIMIT + (sequence % COLLECTIVE_TAG_SPAN)``, same order on all ranks."""

    __slots__ = ("_seq",)

    def __init__(self):
        self._seq = 0

    def next(self) -> int:
        """Tag of the next collective."""
        tag = c.USER_TAG_LIMIT + self._seq
        self._seq = (self._seq + 1) % c.COLLECTIVE_TAG_SPAN
        return tag


class P2PWork:
    """Work handle of a collective driven by point-to-point requests.

    Subclasses implement ``_advance(block)``: move the collective on (blocking on MPI
    requests only if ``block``) and return True once it is complete. While a handle is
    waited on and other handles of the same communicator are outstanding, all of them are
    polled, so handles may be waited on in any order without deadlock.
    """

    __slots__ = ("_active", "_result", "_done")

    def __init__(self, active: list, result: np.ndarray):
        self._active = active
        self._result = result
        self._done = False
        active.append(self)

    def _advance(self, block: bool) -> bool:
        """Progress the collective; True once complete."""
        raise NotImplementedError

    def _release(self) -> None:
        """Give back scratch buffers; called once, on completion."""

    def _complete(self) -> None:
        self._done = True
        self._active.remove(self)
        self._release()

    def test(self) -> bool:
        """Advance as far as possible without blocking; True once complete."""
        if not self._done and self._advance(False):
            self._complete()
        return self._done

    def wait(self) -> np.ndarray:
        """Drive the collective to completion; return its result array."""
        if self._done:
            return self._result
        if len(self._active) == 1:
            self._advance(True)
            self._complete()
        else:
            while True:
                for work in tuple(self._active):
                    work.test()
                if self._done:
                    break
                os.sched_yield()
        return self._result


class DoneWork:
    """Work handle of a collective that needed no messages."""

    __slots__ = ("_result",)

    def __init__(self, result: np.ndarray):
        self._result = result

    def test(self) -> bool:
        """Always True."""
        return True

    def wait(self) -> np.ndarray:
        """Return the result array."""
        return self._result


class RoundWork(P2PWork):
    """Runs rounds in order: post a round's receives and sends, wait for all, run its action.

    A round is ``(sends, recvs, action)``: sends as ``(array, dest)`` pairs, receives as
    ``(array, source)`` pairs, and a callable (or None) run once all of them have completed.
    """

    __slots__ = ("_comm", "_tag", "_rounds", "_next", "_reqs", "_on_release")

    def __init__(self, comm, tag: int, rounds: Sequence[tuple], active: list, result: np.ndarray,
                 on_release: Callable[[], None] | None = None):
        super().__init__(active, result)
        self._comm = comm
        self._tag = tag
        self._rounds = rounds
        self._next = 0
        self._reqs = None
        self._on_release = on_release
        if self._advance(False):
            self._complete()

    def _advance(self, block):
        comm, tag = self._comm, self._tag
        while True:
            if self._reqs is None:
                if self._next == len(self._rounds):
                    return True
                sends, recvs, _ = self._rounds[self._next]
                self._reqs = [comm.Irecv(a, source, tag) for a, source in recvs]
                self._reqs += [comm.Isend(a, dest, tag) for a, dest in sends]
            if block:
                for request in self._reqs:
                    wait_for(request)
            elif not MPI.Request.Testall(self._reqs):
                return False
            action = self._rounds[self._next][2]
            if action is not None:
                action()
            self._reqs = None
            self._next += 1

    def _release(self):
        if self._on_release is not None:
            self._on_release()


class P2PCommunicator:
    """Base of the backends built from point-to-point calls; subclasses add the collectives.

    Collective tags come from a sequence private to this object, so non-blocking work that
    overlaps must go through one communicator per ``mpi_comm`` (or one ``mpi_comm.Dup()`` each).
    """

    name = "p2p"

    def __init__(self, mpi_comm=None):
        self.comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self._rank = self.comm.Get_rank()
        self._size = self.comm.Get_size()
        self.scratch = ScratchPool()
        self._tags = TagSequence()
        self._active: list[P2PWork] = []

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._rank

    @property
    def size(self) -> int:
        """Number of ranks."""
        return self._size

    def allreduce(self, buf, op="sum", out=None):
        """Start the all-reduce and wait for it."""
        return self._start_allreduce(buf, op, out).wait()

    def iallreduce(self, buf, op="sum"):
        """Start an in-place all-reduce; return its Work handle."""
        return self._start_allreduce(buf, op, None)

    def _start_allreduce(self, buf, op, out):
        """Check the arguments, take a tag, then hand the flat views to the backend's ``_allreduce_work``."""
        ufunc = c.check_op(op)
        if out is None:
            dst = c.check_buffer(buf)
        else:
            c.check_buffer(buf, writable=False)
            dst = c.check_out(buf, out)
        tag = self._tags.next()
        if self._size == 1 or buf.size == 0:
            if dst is not buf:
                np.copyto(dst, buf)
            return DoneWork(dst)
        return self._allreduce_work(buf.reshape(-1), dst.reshape(-1), ufunc, tag, dst)

    def _allreduce_work(self, src, dst, ufunc, tag, result) -> P2PWork:
        """Start reducing flat ``src`` over ranks into flat ``dst`` (maybe ``src`` itself)."""
        raise NotImplementedError

    def gather(self, buf, root=0):
        """Every rank sends ``buf`` to root, which receives them in rank order."""
        c.check_buffer(buf, writable=False)
        root = c.check_rank(root, self._size)
        tag = self._tags.next()
        if self._rank != root:
            if buf.size:
                self.comm.Send(buf, dest=root, tag=tag)
            return None
        out = np.empty((self._size, *buf.shape), dtype=buf.dtype)
        rows = out.reshape(self._size, -1)  # (size, buf.size)
        rows[root] = buf.reshape(-1)
        if buf.size:
            for source in range(self._size):
                if source != root:
                    self.comm.Recv(rows[source], source=source, tag=tag)
        return out

    def scatter(self, buf, root=0):
        """Root sends ``buf[i]`` to each rank i; the others receive their block."""
        c.check_stacked(buf, self._size)
        root = c.check_rank(root, self._size)
        tag = self._tags.next()
        out = np.empty(buf.shape[1:], dtype=buf.dtype)
        if self._rank == root:
            rows = buf.reshape(self._size, -1)  # (size, block size)
            out[...] = buf[root]
            if out.size:
                for dest in range(self._size):
                    if dest != root:
                        self.comm.Send(rows[dest], dest=dest, tag=tag)
        elif out.size:
            self.comm.Recv(out, source=root, tag=tag)
        return out

    def send(self, buf, dest, tag=0):
        """Blocking MPI_Send with a user tag."""
        c.check_buffer(buf, writable=False)
        dest, tag = c.check_rank(dest, self._size, "dest"), c.check_tag(tag)
        self.comm.Send(buf, dest=dest, tag=tag)

    def recv(self, buf, source, tag=0):
        """Blocking MPI_Recv into ``buf`` with a user tag."""
        c.check_buffer(buf)
        source, tag = c.check_rank(source, self._size, "source"), c.check_tag(tag)
        self.comm.Recv(buf, source=source, tag=tag)
        return buf
