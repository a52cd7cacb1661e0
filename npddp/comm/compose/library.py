"""MPI's own ``Allreduce`` as one of ``auto``'s candidates (name ``mpi``), where the transport is MPI.

It runs the library's default selection, as backend ``mpi`` calls it (the same op table,
``MPI_IN_PLACE`` in place, the average as a sum scaled afterwards), on a duplicate of the
transport's mpi4py communicator made at set-up (collective): MPI orders collectives per
communicator, and a checked non-blocking call here starts later than the call that made it
(below), so no other collective on the transport's communicator (a split, backend ``mpi`` on the
same group) may come between them on one rank and not on another.

Argument check. Ranks that pass different counts or dtypes may pick different algorithms for the
same call, so the check goes where the other candidates' checks go, and MPI sees no data before it
has passed (every rank then raises :class:`~npddp.comm.signature.CollectiveMismatchError`):

* every rank on one node (``shm`` is the other candidate): the call publishes its size (with the
  signature folded in when checked) and meets the node's ranks at one node barrier, as ``shm``'s
  small path does (:meth:`~npddp.comm.node.allreduce.NodeGroup.check_sizes`); always, since MPICH's
  all-reduce of mismatched counts corrupts its heap and the barrier costs about a microsecond;
* otherwise, with ``check_args`` on, the call trades its signature with every peer through the
  signed call's messages, as a hand-written collective with nothing to move does
  (:meth:`~npddp.comm.communicators.lifecycle.CallLifecycle._signed_empty`): a peer on another
  algorithm, or passing other arguments, meets a mismatch on that edge.

A blocking call on one node then runs MPI's blocking ``Allreduce``: the node barrier has seen every
rank of the group reach this very call, so no late peer can hold it and no deadline can fall due
while it waits on one (a rank that dies inside MPI's call ends the job through its launcher); MPI's
non-blocking call polled against the deadline costs several microseconds a small call, and under
some libraries twice the time at a mebibyte. Off one node the call is polled against its deadline.
A non-blocking call starts MPI's ``Iallreduce`` once its check has passed, always in call order.

Failure: a call past its deadline raises TimeoutError like any other; MPI's request cannot be
cancelled, so a communicator with one left in flight is never freed.
"""

from __future__ import annotations

import math
import weakref
from collections import deque

import numpy as np

from npddp.comm import checks as c
from npddp.comm.engine.deadline import Overdue, wait_until
from npddp.comm.engine.work import P2PWork
from npddp.comm.transports.mpi import free_comm
from npddp.util.mpilibs import identify

_EMPTY = np.empty(0, dtype=np.uint8)


def library_name() -> str:
    """The running MPI library's name (:attr:`npddp.util.mpilibs.MPILibrary.name`), from its version text."""
    from mpi4py import MPI

    return identify("", MPI.Get_library_version()).name


def library_candidate(ctx):
    """MPI's ``Allreduce`` over ``ctx``'s transport (collective), or None where it holds no mpi4py communicator."""
    from mpi4py import MPI   # only here: a job over TCP never loads MPI

    comm = getattr(ctx.transport, "comm", None)
    return LibraryAllreduce(ctx, comm) if isinstance(comm, MPI.Intracomm) else None


class LibraryAllreduce:
    """MPI's ``Allreduce`` on a duplicate of the transport's communicator, run as an all-reduce algorithm."""

    def __init__(self, ctx, comm):
        from mpi4py import MPI

        from npddp.comm.mpi import MPI_OPS

        self.ctx = ctx
        self.library = library_name()   # the key of the cost model's per-library bound on one node
        self.in_place = MPI.IN_PLACE
        self.ops = {c.OPS[name]: op for name, op in MPI_OPS.items()}   # the ufunc a reduction runs -> MPI's op
        self.comm = comm.Dup()
        self.in_flight = [0]   # MPI requests started and not complete: while any is, the duplicate is never freed
        weakref.finalize(self, free_comm, self.comm, self.in_flight)
        self.queue: deque[LibraryWork] = deque()   # calls whose MPI call has not started, in call order

    def run(self, call, src, dst, ufunc) -> None:
        """A blocking call: its check (node barrier, or signature trade), then MPI's ``Allreduce``."""
        node = self.ctx.node
        if node is not None:
            seq, word, value = node.reserve(1), node.size_word(), node.size_value(call, src.nbytes)
            node.publish_size(word, value)
            node.sync.arrive(seq)
            node.wait(call, seq)
            node.check_sizes(call, word, value)
        else:
            call.owner._signed_empty(call)
        send, op = self.in_place if src is dst else src, self.ops[ufunc]
        if node is not None or math.isinf(call.owner.timeout):   # every rank is here (above), or no deadline
            self.comm.Allreduce(send, dst, op=op)
            return
        request = self.comm.Iallreduce(send, dst, op=op)
        self.in_flight[0] += 1
        call.rounds = 0   # MPI's wait spins afresh (see LibraryWork._begin)
        try:
            wait_until(request.Test, call.overdue)
        except Overdue:
            raise call.owner.give_up(call, [], [], (src, dst, request)) from None
        except BaseException:   # a peer's abort heard while waiting: MPI may still write dst
            call.owner.strand([], (src, dst, request))
            raise
        self.in_flight[0] -= 1

    def start(self, call, src, dst, ufunc, result):
        """A non-blocking call: its Work handle."""
        return LibraryWork(self, call, src, dst, ufunc, result)

    def pump(self) -> None:
        """Start, in call order, the MPI call of every queued call whose check has passed."""
        queue = self.queue
        while queue and queue[0]._checked():
            queue.popleft()._begin()


class LibraryWork(P2PWork):
    """One non-blocking call of MPI's ``Allreduce``: its check, then ``Iallreduce``."""

    __slots__ = ("_library", "_args", "_trade", "_request", "_node", "_seq", "_word", "_value")

    def __init__(self, library: LibraryAllreduce, call, src, dst, ufunc, result):
        super().__init__(call, result)
        self._library, self._args = library, (library.in_place if src is dst else src, dst, library.ops[ufunc],
                                                src)
        self._request = None
        node = self._node = library.ctx.node
        if node is not None:   # one node barrier, reached once every earlier call on the node is done
            self._seq, self._word, self._value = node.reserve(1), node.size_word(), node.size_value(call, src.nbytes)
            self._trade = None
        else:
            self._seq = self._word = self._value = None
            self._trade = _post_trade(call, library.ctx.rank, library.ctx.size)   # [(request, peer, is_recv)]
        library.queue.append(self)
        self._start()

    def _checked(self) -> bool:
        """Move the check on; True once it has passed (a mismatch raises)."""
        node = self._node
        if node is None:   # test every outstanding message of the trade: any may hold a peer's mismatch
            self._trade = [t for t in self._trade if not t[0].test()]
            return not self._trade
        if self._seq is not None:   # not yet arrived: only once every earlier call has completed
            if self._active[0] is not self:
                return False
            node.publish_size(self._word, self._value)
            node.sync.arrive(self._seq)
            self._seq, self._value = None, (self._seq, self._value)
        seq, value = self._value
        if not node.sync.poll(seq):
            return False
        node.check_sizes(self._call, self._word, value)
        return True

    def _begin(self) -> None:
        """Start MPI's ``Iallreduce``; its wait spins afresh: after a check that waited long the call's clock
        would have it nap between polls, and MPI's progress moves only while both ranks poll."""
        send, dst, op, _ = self._args
        self._request = self._library.comm.Iallreduce(send, dst, op=op)
        self._library.in_flight[0] += 1
        self._call.rounds = 0

    def _advance(self, block: bool) -> bool:
        library, call = self._library, self._call
        library.pump()
        if self._request is None:
            if not block:
                return False
            wait_until(self._checked, call.overdue)   # the only call in flight: first in the queue
            library.queue.popleft()._begin()
        if block:
            wait_until(self._request.Test, call.overdue)
        elif not self._request.Test():
            return False
        library.in_flight[0] -= 1
        return True

    def _requests(self):
        trade = self._trade if self._request is None and self._trade else []
        return ([(r, p) for r, p, is_recv in trade if is_recv], [(r, p) for r, p, is_recv in trade if not is_recv])

    def target(self) -> int:
        """The node barrier this call waits for (on a node: who is late, if it times out)."""
        return self._value[0] if self._seq is None and self._value is not None else self._seq


def _post_trade(call, rank: int, size: int) -> list:
    """Post the signature trade of a checked call: an empty signed message to and from every peer."""
    if call.signature is None:
        return []
    transport, tag = call.transport, call.tag
    peers = [p for p in range(size) if p != rank]
    trade = [(transport.irecv(_EMPTY, p, tag), p, True) for p in peers]
    return trade + [(transport.isend(_EMPTY, p, tag), p, False) for p in peers]
