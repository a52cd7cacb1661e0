"""How the ``mpi`` backend runs one call: its Work handle, the deadline, a departed rank, the argument check.

:class:`MPICalls` is the base of :class:`~npddp.comm.mpi.MPICommunicator`, which passes each call's
blocking and non-blocking MPI variants to :meth:`MPICalls._run`.

With a finite timeout (the default), each collective is MPI's non-blocking variant
(``Iallreduce``, ``Ibcast``, ...) polled against the call's deadline, so a peer that never
arrives raises TimeoutError here as it does in the hand-written backends; the communicator is
unusable afterwards (the pending MPI request cannot be cancelled). With ``timeout=inf`` every
call is the blocking one (``Allreduce``, ``Bcast``, ...), which waits forever.

A rank that left the job normally (:class:`npddp.util.guard.Departures`) ends a wait that needs it, a
grace interval after the notice, with ConnectionError naming it: every member for a collective, the
peer for a send or receive (:mod:`npddp.comm.engine.deadline`); not a blocking call under ``timeout=inf``.

Argument check (on unless ``check_args=False``; ``create`` reads ``NPDDP_CHECK_ARGS``). MPI checks
nothing: ranks that pass different counts, dtypes or ops get wrong numbers or worse (MPICH's
all-reduce of mismatched counts corrupts its heap). So each collective first all-gathers its
signature (:mod:`npddp.comm.signature`), non-blocking, on a communicator of its own (a Dup: MPI
orders collectives per communicator, so the data communicator's order is untouched), and starts
its data collective only once every rank's signature has arrived and agrees; otherwise every rank
raises the same :class:`CollectiveMismatchError`, naming who passed what, and the communicator is
closed. A non-blocking call returns at once: its data starts, in call order, as soon as its check
is complete and the communicator is entered again (any later call, ``test`` or ``wait``).
Most calls need no all-gather: where every rank's history forecasts a small blocking all-reduce, the
call is that all-reduce with its agreement in one extra element (:mod:`npddp.comm.mpi_carried`).
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from functools import partial

import numpy as np
from mpi4py import MPI

from npddp.comm import checks as c
from npddp.comm import signature as sg
from npddp.comm.base import Backend
from npddp.comm.engine.deadline import CLOCK_EVERY, Deadline, Overdue, timeout_text, wait_until
from npddp.comm.mpi_carried import Forecast
from npddp.comm.status import check_received
from npddp.comm.transports.mpi import free_comm, mpi_world
from npddp.util.guard import departures

MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}
#: Polls of a request before a wait reads the clock (most small calls complete within them).
QUICK_POLLS = range(16)


class MPIWork:
    """Work handle over an MPI request, waited on against the communicator's deadline.

    With the argument check its data collective starts only once the signatures have agreed
    (``start``, called by :meth:`MPICalls._pump`); until then ``_request`` is None."""

    __slots__ = ("_owner", "_request", "_result", "_what", "_done", "_scale", "_check", "_start", "_peer", "_tests",
                 "_deadline")

    def __init__(self, owner, request, result: np.ndarray, what: str, scale: float = 0.0, check=None, start=None,
                 peer: int | None = None):
        self._owner, self._request, self._result, self._what = owner, request, result, what
        self._done = False
        self._peer = peer    # isend/irecv: the one rank the wait needs (None: every member)
        self._scale = scale  # op avg: 1/N, applied in place once the sum is complete
        self._check, self._start = check, start   # (signature table, its all-gather), and what starts the data
        self._tests, self._deadline = 0, None     # test() calls that found it incomplete; its clock, once read

    def test(self) -> bool:
        """True once the MPI request has completed; every ``CLOCK_EVERY`` tests that find it incomplete read the
        call's clock, so a loop of tests ends at the deadline with the TimeoutError a wait raises."""
        if not self._done:
            owner = self._owner
            owner._check_usable()
            if self._request is None:
                owner._pump()
            if self._request is not None and self._request.Test():
                self._finish()
            else:
                self._tests += 1
                if not self._tests % CLOCK_EVERY:
                    if self._deadline is None:
                        self._deadline = owner._deadline(self._peer)
                    owner._read_clock(self._deadline, self._what)
        return self._done

    def wait(self) -> np.ndarray:
        """Wait for the MPI request (at most the timeout); return the reduced buffer."""
        if not self._done:
            owner = self._owner
            owner._check_usable()
            if self._request is None:
                owner._wait(self._started, self._what)
            owner._wait(self._request.Test, self._what, peer=self._peer)
            self._finish()
        return self._result

    def _started(self) -> bool:
        """True once the data collective has started (its check, and every earlier one, agreed)."""
        self._owner._pump()
        return self._request is not None

    def _finish(self) -> None:
        self._done = True
        if self._scale:
            np.multiply(self._result, self._scale, out=self._result)


class MPICalls(Backend):
    """An MPI communicator's state, and how it runs one call: against the deadline, with the argument check."""

    def __init__(self, mpi_comm=None, timeout: float = c.DEFAULT_TIMEOUT, dup: bool = False, check_args: bool = False):
        self.comm = mpi_world() if mpi_comm is None else mpi_comm
        self._abandoned = [False]  # True once a call timed out: its messages may still come, so never free
        if dup:  # a context of its own (collective), freed with this communicator unless abandoned
            self.comm = self.comm.Dup()
            weakref.finalize(self, free_comm, self.comm, self._abandoned)
        self._rank, self._size = self.comm.Get_rank(), self.comm.Get_size()
        self.timeout = timeout
        self._calls = 0
        self._failure: str | None = None
        self._checks = None       # the communicator the signatures travel on (a Dup), once the check is on
        self._checking = False
        self._queue: deque[MPIWork] = deque()   # checked calls whose data has not started, in call order
        self._forecast = Forecast(self._size)
        self.check_args = check_args

    @property
    def check_args(self) -> bool:
        """Whether every collective checks that all ranks passed the same arguments (see the module docstring).
        Turning it on the first time duplicates the communicator: collective, every rank alike."""
        return self._checking

    @check_args.setter
    def check_args(self, on: bool) -> None:
        if self._queue:
            raise RuntimeError("check_args cannot change while non-blocking calls are in flight; wait for them first")
        self._checking = bool(on) and self._size > 1
        if self._checking and self._checks is None:
            self._checks = self.comm.Dup()
            weakref.finalize(self, free_comm, self._checks, self._abandoned)

    def _checked(self, what: str, start, result, scale: float = 0.0, buf=None, op=None, root=None,
                 extra=None) -> MPIWork:
        """A checked call: start the all-gather of its signature now, its data (``start()``) once all agree."""
        self._carry(what, buf, op, root)   # a forecast all-reduce first, where every rank makes one
        table = self._signatures(what, buf, op, root, extra)
        work = MPIWork(self, None, result, what, scale, (table, self._checks.Iallgather(MPI.IN_PLACE, table)), start)
        self._queue.append(work)
        self._pump()
        return work

    def _signatures(self, what: str, buf=None, op=None, root=None, extra=None) -> np.ndarray:
        """A table for every rank's signature of this call, this rank's row filled in; ``extra``: int64 words after
        the signature (an all-to-all-v's counts, :mod:`npddp.comm.signature`), compared once the signatures agree."""
        table = np.empty((self._size, sg.WORDS + (0 if extra is None else extra.size)), dtype=np.int64)
        sg.encode(table[self._rank, :sg.WORDS], what, self._calls, buf, op, root)
        if extra is not None:
            table[self._rank, sg.WORDS:] = extra
        return table

    def _pump(self) -> None:
        """Start, in call order, the data of every queued call whose signatures have arrived and agree;
        CollectiveMismatchError (and close) at the first that disagree."""
        queue = self._queue
        while queue:
            work = queue[0]
            table, request = work._check
            if not request.Test():
                return
            queue.popleft()
            self._verdict(table)
            work._check = None
            work._request = work._start()

    def _verdict(self, table: np.ndarray) -> None:
        """CollectiveMismatchError (and close) unless every rank's signature in ``table`` agrees with rank 0's."""
        first = table[0]
        text = None
        for rank in range(1, self._size):
            if not sg.agree(table[rank], first):
                text = sg.message(int(table[self._rank][1]), 0, first[:sg.WORDS], rank, table[rank, :sg.WORDS])
                break
        if text is None and table.shape[1] > sg.WORDS:   # an all-to-all-v: every pair's counts
            pair = sg.counts_disagreement(table[:, sg.WORDS:])
            if pair is not None:
                text = sg.counts_message(int(table[self._rank][1]), table[:, sg.WORDS:], pair)
        if text is not None:
            self._failure = text
            self._queue.clear()
            raise sg.CollectiveMismatchError(f"[rank {self._rank}] {text}; this communicator is now closed")

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"this mpi communicator is unusable after an earlier failure: {self._failure}")

    def _run(self, what: str, blocking, nonblocking, waiting: str = "for its peers", sig=None, peer=None,
             carry=None, extra=None) -> None:
        """Run one call: ``blocking()`` without a deadline, else ``nonblocking()``'s request polled against it;
        a collective (``sig``: its buffer, op and root) with ``check_args`` starts its data once all agree.
        ``peer``: the one rank a send or receive needs (None: every member). ``carry``: an all-reduce's
        ``(input, output)``, which a forecast all-reduce moves itself (:mod:`npddp.comm.mpi_carried`)."""
        self._check_usable()
        self._calls += 1
        if sig is not None and self._checking:
            if self._queue:   # earlier calls' data must start first
                self._wait(self._drained, what, waiting)
            if self._carry(what, *sig, carry=carry):
                return
            table = self._signatures(what, *sig, extra=extra)
            self._wait(self._checks.Iallgather(MPI.IN_PLACE, table).Test, what, waiting)
            self._verdict(table)
        if math.isinf(self._timeout):  # no deadline: MPI's blocking call
            blocking()
        else:
            self._complete(nonblocking().Test, what, waiting, peer)

    def _carry(self, what: str, buf=None, op=None, root=None, carry=None) -> bool:
        """Step the forecast; where it is a blocking all-reduce, run that first (with ``carry``'s data when this call
        is the forecast one). True when every rank agreed, so the call is done."""
        key = (what, None, -1, op, root) if buf is None else (what, buf.dtype.char, buf.size, op, root)
        forecast = self._forecast.step(key)
        if forecast is None:
            return False
        if self._queue:
            self._wait(self._drained, what)
        send, receive, sent, received, count, agree, disagree, expected, op = self._forecast.arrays(forecast)
        comm, op, mine = self.comm, MPI_OPS[op], carry is not None and forecast == key
        if receive.size == 1 and count:   # large: the flag beside the data, which goes straight to its buffers
            send[0] = agree if mine else disagree
            data, out = carry if mine else self._forecast.spare(forecast)
            if math.isinf(self._timeout):
                flag = self._checks.Iallreduce(send, receive, op=op)
                comm.Allreduce(MPI.IN_PLACE if data is out else data, out, op=op)
                flag.Wait()
            else:
                flag = self._checks.Iallreduce(send, receive, op=op)
                self._complete(comm.Iallreduce(MPI.IN_PLACE if data is out else data, out, op=op).Test, what)
                self._complete(flag.Test, what)
            return mine and receive[0] == expected
        if mine:
            data = carry[0]
            sent[...] = data if data.ndim == 1 else data.reshape(-1)
            send[count] = agree
        else:
            send[count] = disagree
        if math.isinf(self._timeout):
            comm.Allreduce(send, receive, op=op)
        else:
            self._complete(comm.Iallreduce(send, receive, op=op).Test, what)
        if not mine or receive[count] != expected:
            return False
        out = carry[1]
        if out.ndim == 1:
            out[...] = received
        else:
            out.reshape(-1)[...] = received
        return True

    def _drained(self) -> bool:
        """True once every queued call's data has started."""
        self._pump()
        return not self._queue

    def _complete(self, done, what: str, waiting: str = "for its peers", peer: int | None = None) -> None:
        """:meth:`_wait`, after a few polls that need no clock (most small calls complete within them)."""
        for _ in QUICK_POLLS:
            if done():
                return
        self._wait(done, what, waiting, peer)

    def _nothing(self, what: str, buf=None, op=None, root=None, carry=None, extra=None) -> None:
        """A collective that moves no data on this rank: with ``check_args`` it still takes part in the check."""
        if self._checking:
            self._run(what, None, no_request, sig=(buf, op, root), carry=carry, extra=extra)

    def _wait(self, done, what: str, waiting: str = "for its peers", peer: int | None = None) -> None:
        """Poll ``done()`` through the one deadline loop until it is true; TimeoutError past the deadline,
        ConnectionError once a rank it needs (``peer``, else every member) has left the job."""
        deadline = self._deadline(peer)
        try:
            wait_until(done, partial(deadline.past, self._timeout))
        except (Overdue, ConnectionError) as exc:   # past the deadline, or a rank it needs left the job
            self._give_up(exc, what, waiting)

    def _deadline(self, peer: int | None) -> Deadline:
        """The clock of one wait that needs ``peer`` (None: every member)."""
        return Deadline(self._members if peer is None else partial(self._members, [peer]))

    def _read_clock(self, deadline: Deadline, what: str) -> None:
        """One clock read of a polled call: its TimeoutError past the deadline, ConnectionError once a rank left."""
        if math.isinf(self._timeout):
            return
        try:
            if deadline.past(self._timeout):
                raise Overdue
        except (Overdue, ConnectionError) as exc:
            self._give_up(exc, what, "for its peers")

    def _give_up(self, exc: Exception, what: str, waiting: str) -> None:
        """Abandon this communicator after ``exc`` (Overdue or ConnectionError) and raise its error."""
        number = "" if "(collective #" in what or what.endswith(")") else f" (collective #{self._calls})"
        self._abandoned[0] = True
        if isinstance(exc, Overdue):
            self._failure = timeout_text(f"[rank {self._rank}] mpi {what}{number}", self._timeout, waiting)
            raise TimeoutError(self._failure) from None
        self._failure = f"[rank {self._rank}] mpi {what}{number}: {exc}; this communicator is now unusable"
        raise ConnectionError(self._failure) from None

    def _members(self, ranks=None) -> list[int]:
        """The world ranks of ``ranks`` of this communicator (None: every member); read once a rank has left."""
        job = departures()
        return [] if job is None else job.world_ranks(self.comm, ranks)


class Received:
    """A receive's MPI request, tested with a status: once complete, the message is checked against the buffer
    (:func:`~npddp.comm.status.check_received`) and the user's ``status`` filled; truncation is ValueError.
    Point-to-point messages are bytes (``MPI_BYTE``) both ways: a typed receive of a part of an element aborts MPICH."""

    __slots__ = ("request", "buf", "source", "tag", "status", "where", "mpi_status")

    def __init__(self, request, buf: np.ndarray, source: int, tag: int, status, where: str):
        self.request, self.buf, self.source, self.tag = request, buf, source, tag
        self.status, self.where = status, where
        self.mpi_status = MPI.Status()

    def Test(self) -> bool:
        """MPI_Test with a status; the check once it has completed."""
        try:
            done = self.request.Test(self.mpi_status)
        except MPI.Exception as exc:
            raise self.refused(exc) from None
        if done:
            check_received(self.buf, self.mpi_status.Get_count(), None, self.source, self.tag, self.status, self.where)
        return done

    def blocking(self, comm) -> None:
        """MPI_Recv (no deadline), then the check."""
        try:
            comm.Recv([self.buf, MPI.BYTE], source=self.source, tag=self.tag, status=self.mpi_status)
        except MPI.Exception as exc:
            raise self.refused(exc) from None
        check_received(self.buf, self.mpi_status.Get_count(), None, self.source, self.tag, self.status, self.where)

    def refused(self, exc):
        """A truncated message as ValueError naming both sizes' side (other MPI errors as they are)."""
        if exc.Get_error_class() != MPI.ERR_TRUNCATE:
            return exc
        return ValueError(f"{self.where}: message from rank {self.source} with tag {self.tag} is longer than the "
                          f"{self.buf.nbytes} bytes of the receive buffer (MPI: message truncated)")


def no_request():
    """The request of a call that moves no data: complete from the start."""
    return MPI.REQUEST_NULL
