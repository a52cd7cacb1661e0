"""Backend that calls the MPI library's own collectives through mpi4py's buffer methods.

With a finite timeout (the default), each collective is MPI's non-blocking variant
(``Iallreduce``, ``Ibcast``, ...) polled against the call's deadline, so a peer that never
arrives raises TimeoutError here as it does in the hand-written backends; the communicator is
unusable afterwards (the pending MPI request cannot be cancelled). With ``timeout=inf`` every
call is the blocking one (``Allreduce``, ``Bcast``, ...), which waits forever.

``op="avg"``: MPI sums, then the sum is scaled by 1/N in place (MPI has no average op).

Argument check (on unless ``check_args=False``; ``create`` reads ``NPDDP_CHECK_ARGS``). MPI checks
nothing: ranks that pass different counts, dtypes or ops get wrong numbers or worse. So before
each collective every rank all-reduces, with MAX, its call's signature (:mod:`npddp.comm.signature`)
beside its negation: the maxima equal the negated minima exactly when all ranks agree. Only
then does the collective run; otherwise one all-gather of the signatures names who passed what,
and every rank raises the same :class:`CollectiveMismatchError`. The check is one extra small
all-reduce per call (it also makes the non-blocking calls synchronise when they start).
"""

from __future__ import annotations

import math
import os
import time
import weakref

import numpy as np
from mpi4py import MPI

from npddp.comm import checks as c
from npddp.comm import signature as sg
from npddp.comm.engine.deadline import NAP_S, SPIN_ROUNDS
from npddp.comm.engine.work import DoneWork
from npddp.comm.transports.mpi import free_comm
from npddp.util import variables

_MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}
_CLOCK_EVERY = 64


class MPIWork:
    """Work handle over an MPI request, waited on against the communicator's deadline."""

    __slots__ = ("_owner", "_request", "_result", "_what", "_done", "_scale")

    def __init__(self, owner, request, result: np.ndarray, what: str, scale: float = 0.0):
        self._owner, self._request, self._result, self._what = owner, request, result, what
        self._done = False
        self._scale = scale  # op avg: 1/N, applied in place once the sum is complete

    def test(self) -> bool:
        """True once the MPI request has completed."""
        if not self._done:
            self._owner._check_usable()
            if self._request.Test():
                self._finish()
        return self._done

    def wait(self) -> np.ndarray:
        """Wait for the MPI request (at most the timeout); return the reduced buffer."""
        if not self._done:
            self._owner._check_usable()
            self._owner._wait(self._request, self._what)
            self._finish()
        return self._result

    def _finish(self) -> None:
        self._done = True
        if self._scale:
            np.multiply(self._result, self._scale, out=self._result)


class MPICommunicator(c.Backend):
    """Communicator over MPI's native collectives (Allreduce, Bcast, Iallreduce, ...)."""

    name = "mpi"

    def __init__(self, mpi_comm=None, timeout: float = c.DEFAULT_TIMEOUT, dup: bool = False, check_args: bool = False):
        self.comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self._abandoned = [False]  # True once a call timed out: its messages may still come, so never free
        if dup:  # a context of its own (collective), freed with this communicator unless abandoned
            self.comm = self.comm.Dup()
            weakref.finalize(self, free_comm, self.comm, self._abandoned)
        self._rank, self._size = self.comm.Get_rank(), self.comm.Get_size()
        self.timeout = timeout
        self._calls = 0
        self._failure: str | None = None
        #: Whether every collective first checks that all ranks passed the same arguments (see the module docstring).
        self.check_args = check_args
        self._sig = np.empty((2, sg.WORDS), dtype=np.int64)      # this call's signature, and its negation
        self._extremes = np.empty((2, sg.WORDS), dtype=np.int64)  # their maxima over ranks

    def _agree(self, operation: str, buf=None, op=None, root=None) -> None:
        """With ``check_args``: CollectiveMismatchError on every rank unless all ranks pass this call's signature."""
        if not self.check_args or self._size == 1:
            return
        sig, extremes = self._sig, self._extremes
        sg.encode(sig[0], operation, self._calls + 1, buf, op, root)
        np.negative(sig[0], out=sig[1])
        comm = self.comm
        what = f"{operation} (collective #{self._calls + 1}) argument check"
        self._run(what, lambda: comm.Allreduce(sig, extremes, op=MPI.MAX),
                  lambda: comm.Iallreduce(sig, extremes, op=MPI.MAX))
        self._calls -= 1   # the check is part of the call it checks
        np.negative(extremes[1], out=extremes[1])   # the minima
        if sg.agree(extremes[0], extremes[1]):
            return
        every = np.empty((self._size, sg.WORDS), dtype=np.int64)
        self._run(what, lambda: comm.Allgather(sig[0], every),
                  lambda: comm.Iallgather(sig[0], every))
        self._calls -= 1
        mine = every[self._rank]
        odd = next(r for r in range(self._size) if not sg.agree(every[r], every[0]))
        text = sg.message(int(mine[1]), 0, every[0], odd, every[odd])
        self._failure = text
        raise sg.CollectiveMismatchError(f"[rank {self._rank}] {text}; this communicator is now closed")

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"this mpi communicator is unusable after an earlier failure: {self._failure}")

    def _run(self, what: str, blocking, nonblocking, waiting: str = "for its peers") -> None:
        """Run one call: ``blocking()`` without a deadline, else ``nonblocking()``'s request polled against it."""
        self._check_usable()
        self._calls += 1
        if math.isinf(self._timeout):  # no deadline: MPI's blocking call
            blocking()
        else:
            self._wait(nonblocking(), what, waiting)

    def _wait(self, request, what: str, waiting: str = "for its peers") -> None:
        """Poll ``request`` (yielding between polls) until done; TimeoutError past the deadline."""
        polls, expires = 0, 0.0
        while not request.Test():
            os.sched_yield()
            polls += 1
            if not polls % _CLOCK_EVERY:
                now = time.monotonic()
                if polls > _CLOCK_EVERY * SPIN_ROUNDS:
                    time.sleep(NAP_S)
                if not expires:
                    expires = now + self._timeout
                elif now > expires:
                    number = "" if "(collective #" in what or what.endswith(")") else f" (collective #{self._calls})"
                    self._abandoned[0] = True
                    self._failure = (f"[rank {self._rank}] mpi {what}{number} timed out after "
                                     f"{self._timeout:g} s waiting {waiting}: a peer crashed, hangs, or called a different collective "
                                     f"({variables.DEBUG.name}=1 checks that); this communicator is now unusable")
                    raise TimeoutError(self._failure)

    def barrier(self) -> None:
        """MPI_Barrier."""
        comm = self.comm
        self._check_usable()
        self._agree("barrier")
        self._run("barrier", comm.Barrier, comm.Ibarrier)

    def broadcast(self, buf, root=0):
        """MPI_Bcast in place."""
        c.check_buffer(buf)
        root = c.check_rank(root, self._size)
        self._check_usable()
        self._agree("broadcast", buf, None, root)
        if buf.size:
            comm = self.comm
            self._run("broadcast", lambda: comm.Bcast(buf, root=root), lambda: comm.Ibcast(buf, root=root))
        return buf

    def allreduce(self, buf, op="sum", out=None):
        """MPI_Allreduce, with MPI_IN_PLACE when ``out`` is None (or ``buf`` itself)."""
        c.check_op(op)
        mpi_op, comm = _MPI_OPS.get(op, MPI.SUM), self.comm
        if out is None or out is buf:
            c.check_buffer(buf)
            scale = c.average_scale(op, buf, self._size)
            self._check_usable()
            self._agree("allreduce", buf, op)
            if buf.size and self._size > 1:
                self._run("allreduce", lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=mpi_op),
                          lambda: comm.Iallreduce(MPI.IN_PLACE, buf, op=mpi_op))
                if scale:  # op avg: MPI sums, then the sum is scaled in place
                    np.multiply(buf, scale, out=buf)
            return buf
        c.check_buffer(buf, writable=False)
        c.check_out(buf, out)
        scale = c.average_scale(op, buf, self._size)
        self._check_usable()
        self._agree("allreduce", buf, op)
        if self._size == 1 or buf.size == 0:
            np.copyto(out, buf)
        else:
            self._run("allreduce", lambda: comm.Allreduce(buf, out, op=mpi_op),
                      lambda: comm.Iallreduce(buf, out, op=mpi_op))
            if scale:
                np.multiply(out, scale, out=out)
        return out

    def iallreduce(self, buf, op="sum"):
        """MPI_Iallreduce in place."""
        c.check_op(op)
        c.check_buffer(buf)
        scale = c.average_scale(op, buf, self._size)
        self._check_usable()
        self._agree("iallreduce", buf, op)
        self._calls += 1
        request = self.comm.Iallreduce(MPI.IN_PLACE, buf, op=_MPI_OPS.get(op, MPI.SUM))
        return MPIWork(self, request, buf, "iallreduce", scale)

    def reduce_scatter(self, buf, op="sum"):
        """MPI_Reduce_scatter with ``np.array_split`` block counts."""
        c.check_op(op)
        c.check_buffer(buf, writable=False)
        scale = c.average_scale(op, buf, self._size)
        flat = buf.reshape(-1)
        counts = np.diff(c.block_bounds(flat.size, self._size)).tolist()
        out = np.empty(counts[self._rank], dtype=buf.dtype)
        self._check_usable()
        self._agree("reduce_scatter", buf, op)
        if self._size == 1:
            np.copyto(out, flat)
        elif flat.size:
            comm, mpi_op = self.comm, _MPI_OPS.get(op, MPI.SUM)
            self._run("reduce_scatter", lambda: comm.Reduce_scatter(flat, out, recvcounts=counts, op=mpi_op),
                      lambda: comm.Ireduce_scatter(flat, out, recvcounts=counts, op=mpi_op))
            if scale:
                np.multiply(out, scale, out=out)
        return out

    def allgather(self, buf):
        """MPI_Allgather into a ``(size, *shape)`` array."""
        c.check_buffer(buf, writable=False)
        out = np.empty((self._size, *buf.shape), dtype=buf.dtype)
        self._check_usable()
        self._agree("allgather", buf)
        if buf.size:
            comm = self.comm
            self._run("allgather", lambda: comm.Allgather(buf, out), lambda: comm.Iallgather(buf, out))
        return out

    def gather(self, buf, root=0):
        """MPI_Gather into a ``(size, *shape)`` array on root."""
        c.check_buffer(buf, writable=False)
        root = c.check_rank(root, self._size)
        out = np.empty((self._size, *buf.shape), dtype=buf.dtype) if self._rank == root else None
        self._check_usable()
        self._agree("gather", buf, None, root)
        if buf.size:
            comm = self.comm
            self._run("gather", lambda: comm.Gather(buf, out, root=root), lambda: comm.Igather(buf, out, root=root))
        return out

    def scatter(self, buf, root=0):
        """MPI_Scatter of root's ``(size, *block)`` array."""
        c.check_stacked(buf, self._size)
        root = c.check_rank(root, self._size)
        out = np.empty(buf.shape[1:], dtype=buf.dtype)
        self._check_usable()
        self._agree("scatter", buf, None, root)
        if out.size:
            comm, send = self.comm, buf if self._rank == root else None
            self._run("scatter", lambda: comm.Scatter(send, out, root=root),
                      lambda: comm.Iscatter(send, out, root=root))
        return out

    def send(self, buf, dest, tag=0):
        """MPI_Send (MPI_Isend polled against the deadline)."""
        c.check_buffer(buf, writable=False)
        dest, tag, comm = c.check_rank(dest, self._size, "dest"), c.check_tag(tag), self.comm
        self._run(f"send (tag {tag})", lambda: comm.Send(buf, dest=dest, tag=tag),
                  lambda: comm.Isend(buf, dest=dest, tag=tag), f"to send to rank {dest}")

    def recv(self, buf, source, tag=0):
        """MPI_Recv into ``buf`` (MPI_Irecv polled against the deadline)."""
        c.check_buffer(buf)
        source, tag, comm = c.check_rank(source, self._size, "source"), c.check_tag(tag), self.comm
        self._run(f"recv (tag {tag})", lambda: comm.Recv(buf, source=source, tag=tag),
                  lambda: comm.Irecv(buf, source=source, tag=tag), f"to receive from rank {source}")
        return buf

    def ireduce_scatter(self, buf, op="sum", out=None):
        """MPI_Ireduce_scatter with ``np.array_split`` block counts into ``out`` (this rank's block)."""
        c.check_op(op)
        c.check_buffer(buf, writable=False)
        scale = c.average_scale(op, buf, self._size)   # op avg: MPI sums, the block is scaled on completion
        out = c.check_block_out(buf, out, self._size, self._rank)
        self._check_usable()
        self._agree("ireduce_scatter", buf, op)
        flat = buf.reshape(-1)
        if self._size == 1 or flat.size == 0:
            np.copyto(out, flat)
            return DoneWork(out)
        counts = np.diff(c.block_bounds(flat.size, self._size)).tolist()
        self._calls += 1
        request = self.comm.Ireduce_scatter(flat, out, recvcounts=counts, op=_MPI_OPS["sum" if scale else op])
        return MPIWork(self, request, out, "ireduce_scatter", scale)

    def iallgather(self, buf, out=None):
        """MPI_Iallgather into ``out`` of shape ``(size, *buf.shape)`` (MPI_IN_PLACE when ``buf`` is ``out[rank]``)."""
        c.check_buffer(buf, writable=False)
        out = c.check_stacked_out(buf, out, self._size, self._rank)
        self._check_usable()
        self._agree("iallgather", buf)
        if buf.size == 0 or self._size == 1:
            if not c.is_row(buf, out, self._rank):
                out.reshape(self._size, -1)[self._rank] = buf.reshape(-1)
            return DoneWork(out)
        self._calls += 1
        send = MPI.IN_PLACE if c.is_row(buf, out, self._rank) else buf
        return MPIWork(self, self.comm.Iallgather(send, out), out, "iallgather")
