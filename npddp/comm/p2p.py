"""Point-to-point plumbing shared by the hand-written backends (``ring``, ``naive``).

* :class:`~npddp.comm.scratch.ScratchPool` lends reusable receive buffers, so steady-state
  collectives allocate nothing.
* :class:`~npddp.comm.calls.TagSequence` gives each collective its own tag, identical on all
  ranks, above the user tags; :class:`~npddp.comm.calls.Call` is one collective in progress:
  its name, number and tag, and the deadline of its waits.
* :class:`P2PWork` is the Work handle of a collective driven by point-to-point requests; its
  subclasses implement ``_advance(block)``. :class:`RoundWork` runs a schedule of rounds.
* :class:`P2PCommunicator` holds what both backends share: rank and size, the pool and tags,
  ``allreduce`` as start + wait, linear ``gather``/``scatter``, ``send``/``recv``.

Only point-to-point methods of the MPI communicator are called here (``Isend``, ``Irecv``,
``Test``/``Cancel``/``Free`` on requests), never a collective.

Timeouts. Every wait polls its request with ``Test`` and yields the CPU between polls; every
``CLOCK_EVERY`` polls it reads the clock. A call's deadline starts at its first clock read, so a
call that never waits long never reads the clock. A call still waiting ``timeout`` seconds
later raises TimeoutError naming the operation, its number and the ranks it waits for. Then
its receives (and those of every outstanding handle) are cancelled, all its requests freed,
and their buffers kept alive, since MPI may still touch them; the communicator refuses any
further call, because its peers now stand at different points of the call sequence.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np

from . import _common as c
from .calls import CLOCK_EVERY, Call, Overdue, TagSequence
from .scratch import ScratchPool

class P2PWork:
    """Work handle of a collective driven by point-to-point requests.

    Subclasses implement ``_advance(block)``: move the collective on (blocking on MPI
    requests only if ``block``) and return True once it is complete, and ``_requests()``:
    the outstanding receive and send requests with their peers. While a handle is waited on
    and other handles of the same communicator are outstanding, all of them are polled, so
    handles may be waited on in any order without deadlock.
    """

    __slots__ = ("_call", "_active", "_result", "_done", "_abandoned")

    def __init__(self, call: Call, result: np.ndarray):
        self._call = call
        self._active = call.owner._active
        self._result = result
        self._done = self._abandoned = False
        self._active.append(self)

    def _advance(self, block: bool) -> bool:
        """Progress the collective; True once complete."""
        raise NotImplementedError

    def _requests(self) -> tuple[list, list]:
        """Outstanding ``[(request, peer)]`` receives and sends."""
        raise NotImplementedError

    def _release(self) -> None:
        """Give back scratch buffers; called once, on completion."""

    def _complete(self) -> None:
        self._done = True
        self._active.remove(self)
        self._release()

    def test(self) -> bool:
        """Advance as far as possible without blocking; True once complete."""
        if not self._done:
            if self._abandoned:
                raise self._call.owner.unusable()
            if self._advance(False):
                self._complete()
        return self._done

    def wait(self) -> np.ndarray:
        """Drive the collective to completion; return its result array."""
        if self._done:
            return self._result
        if self._abandoned:
            raise self._call.owner.unusable()
        call = self._call
        try:
            if len(self._active) == 1:
                self._advance(True)
                self._complete()
            else:
                polls = 0
                while True:
                    for work in tuple(self._active):
                        work.test()
                    if self._done:
                        break
                    os.sched_yield()
                    polls += 1
                    if not polls % CLOCK_EVERY and call.overdue():
                        raise Overdue
        except Overdue:
            raise call.owner.give_up(call, *self._requests()) from None
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

    __slots__ = ("_rounds", "_next", "_reqs", "_on_release")

    def __init__(self, call: Call, rounds: Sequence[tuple], result: np.ndarray,
                 on_release: Callable[[], None] | None = None):
        super().__init__(call, result)
        self._rounds = rounds
        self._next = 0
        self._reqs = None
        self._on_release = on_release
        if self._advance(False):
            self._complete()

    def _advance(self, block):
        call = self._call
        comm, tag = call.owner.comm, call.tag
        while True:
            if self._reqs is None:
                if self._next == len(self._rounds):
                    return True
                sends, recvs, _ = self._rounds[self._next]
                self._reqs = [comm.Irecv(a, source, tag) for a, source in recvs]
                self._reqs += [comm.Isend(a, dest, tag) for a, dest in sends]
            for request in self._reqs:
                if block:
                    call.wait(request)
                elif not request.Test():
                    return False
            action = self._rounds[self._next][2]
            if action is not None:
                action()
            self._reqs = None
            self._next += 1

    def _requests(self):
        if self._reqs is None:
            return [], []
        sends, recvs, _ = self._rounds[self._next]
        nrecv = len(recvs)
        return (list(zip(self._reqs[:nrecv], (s for _, s in recvs))),
                list(zip(self._reqs[nrecv:], (d for _, d in sends))))

    def _release(self):
        if self._on_release is not None:
            self._on_release()


class P2PCommunicator(c.RankedComm):
    """Base of the backends built from point-to-point calls; subclasses add the collectives.

    Collective tags come from a sequence private to this object, so non-blocking work that
    overlaps must go through one communicator per ``mpi_comm`` (or one ``mpi_comm.Dup()`` each).
    ``timeout`` bounds every blocking call (and ``Work.wait``): see the module docstring.
    """

    name = "p2p"

    def __init__(self, mpi_comm=None, timeout: float = c.DEFAULT_TIMEOUT):
        if mpi_comm is None:
            from mpi4py import MPI
            mpi_comm = MPI.COMM_WORLD
        super().__init__(mpi_comm)
        self.timeout = timeout
        self.scratch = ScratchPool()
        self._tags = TagSequence()
        self._active: list[P2PWork] = []
        self._failure: str | None = None   # why this communicator is unusable
        self._stranded: list = []           # buffers and handles abandoned requests may still touch

    @property
    def timeout(self) -> float:
        """Seconds a blocking call (or ``Work.wait``) may wait for its peers before TimeoutError."""
        return self._timeout

    @timeout.setter
    def timeout(self, value) -> None:
        self._timeout = c.check_timeout(value)

    # --- calls, waits and giving up --------------------------------------------------
    def _begin(self, operation: str, user_tag: int | None = None) -> Call:
        """Open a call (after its arguments were checked): a fresh collective tag, or the user's tag."""
        if self._failure is not None:
            raise self.unusable()
        if user_tag is not None:
            return Call(self, operation, None, user_tag)
        tag = self._tags.next()
        return Call(self, operation, self._tags.count, tag)

    def unusable(self) -> RuntimeError:
        """The error of any call after a timeout."""
        return RuntimeError(f"this {self.name} communicator is unusable after an earlier failure: {self._failure}")

    def _transfer(self, call: Call, recvs=(), sends=()) -> None:
        """Post receives ``[(array, source)]`` and sends ``[(array, dest)]`` under the call's tag; wait for all."""
        comm, tag = self.comm, call.tag
        rreqs = [(comm.Irecv(a, source, tag), source) for a, source in recvs]
        sreqs = [(comm.Isend(a, dest, tag), dest) for a, dest in sends]
        try:
            for request, _ in rreqs:
                call.wait(request)
            for request, _ in sreqs:
                call.wait(request)
        except Overdue:
            raise self.give_up(call, rreqs, sreqs, (recvs, sends)) from None

    def give_up(self, call: Call, recvs: list, sends: list, keep=None) -> TimeoutError:
        """After ``call`` timed out: abandon every request in flight, mark this communicator unusable.

        ``recvs``/``sends`` are the call's ``[(request, peer)]``; ``keep`` is what its requests may
        still touch. Returns the TimeoutError to raise, naming the peers still outstanding.
        """
        recv_from = [peer for request, peer in recvs if request and not request.Test()]
        send_to = [peer for request, peer in sends if request and not request.Test()]
        error = call.timeout_error(recv_from, send_to)
        self._failure = str(error)
        self._abandon(recvs, sends)
        self._stranded.append(keep)
        for work in tuple(self._active):
            self._abandon(*work._requests())
            work._abandoned = True
            self._stranded.append(work)
        self._active.clear()
        return error

    @staticmethod
    def _abandon(recvs: list, sends: list) -> None:
        """Cancel pending receives and free every pending request (cancelling sends is not portable)."""
        for request, _ in recvs:
            if request:
                request.Cancel()
        for request, _ in (*recvs, *sends):
            if request:
                request.Free()

    # --- collectives -----------------------------------------------------------------
    def allreduce(self, buf, op="sum", out=None):
        """Start the all-reduce and wait for it."""
        return self._start_allreduce(buf, op, out, "allreduce").wait()

    def iallreduce(self, buf, op="sum"):
        """Start an in-place all-reduce; return its Work handle."""
        return self._start_allreduce(buf, op, None, "iallreduce")

    def _start_allreduce(self, buf, op, out, operation):
        """Check the arguments, open the call, then hand the flat views to the backend's ``_allreduce_work``."""
        ufunc = c.check_op(op)
        if out is None:
            dst = c.check_buffer(buf)
        else:
            c.check_buffer(buf, writable=False)
            dst = c.check_out(buf, out)
        call = self._begin(operation)
        if self._size == 1 or buf.size == 0:
            if dst is not buf:
                np.copyto(dst, buf)
            return DoneWork(dst)
        return self._allreduce_work(call, buf.reshape(-1), dst.reshape(-1), ufunc, dst)

    def _allreduce_work(self, call, src, dst, ufunc, result) -> P2PWork:
        """Start reducing flat ``src`` over ranks into flat ``dst`` (maybe ``src`` itself)."""
        raise NotImplementedError

    def gather(self, buf, root=0):
        """Every rank sends ``buf`` to root, which receives them all at once."""
        c.check_buffer(buf, writable=False)
        root = c.check_rank(root, self._size)
        call = self._begin("gather")
        if self._rank != root:
            if buf.size:
                self._transfer(call, sends=[(buf, root)])
            return None
        out = np.empty((self._size, *buf.shape), dtype=buf.dtype)
        rows = out.reshape(self._size, -1)  # (size, buf.size)
        rows[root] = buf.reshape(-1)
        if buf.size:
            self._transfer(call, recvs=[(rows[s], s) for s in range(self._size) if s != root])
        return out

    def scatter(self, buf, root=0):
        """Root sends ``buf[i]`` to each rank i; the others receive their block."""
        c.check_stacked(buf, self._size)
        root = c.check_rank(root, self._size)
        call = self._begin("scatter")
        out = np.empty(buf.shape[1:], dtype=buf.dtype)
        if self._rank == root:
            rows = buf.reshape(self._size, -1)  # (size, block size)
            out[...] = buf[root]
            if out.size:
                self._transfer(call, sends=[(rows[d], d) for d in range(self._size) if d != root])
        elif out.size:
            self._transfer(call, recvs=[(out, root)])
        return out

    def send(self, buf, dest, tag=0):
        """Blocking send of ``buf`` with a user tag (times out like a collective)."""
        c.check_buffer(buf, writable=False)
        dest, tag = c.check_rank(dest, self._size, "dest"), c.check_tag(tag)
        self._transfer(self._begin("send", tag), sends=[(buf, dest)])

    def recv(self, buf, source, tag=0):
        """Blocking receive into ``buf`` with a user tag (times out like a collective)."""
        c.check_buffer(buf)
        source, tag = c.check_rank(source, self._size, "source"), c.check_tag(tag)
        self._transfer(self._begin("recv", tag), recvs=[(buf, source)])
        return buf
