"""One collective in progress: the context algorithms see, its tag, its deadline, its blocking transfers.

* :class:`Context` is what an algorithm sees of the communicator it runs in: its rank and size,
  the transport, the scratch pool and its tunables.
* :class:`TagSequence` gives each collective its own tag, the same on every rank, above the
  user tags; :class:`Call` is one collective in progress: its name, number and tag, the deadline
  of its waits, and blocking transfers under its tag (:meth:`Call.transfer`, :meth:`Call.exchange`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from npddp.comm import checks as c
from npddp.comm.engine.deadline import SPIN_ROUNDS, Deadline, Overdue, timeout_text, wait_until, world_members

#: Bytes of one chunk of the pipelined algorithms (ring steps, tree, chain broadcast), unless a communicator sets its own.
CHUNK_BYTES = 1 << 20


class Context:
    """What an all-reduce algorithm sees of the communicator it runs in.

    ``chunk_bytes``: pipelined algorithms (ring steps, tree, chain broadcast) cut messages into
    chunks of at most this many bytes; ``window``: ring receives kept in flight; ``node``: the
    node's shared-memory group, when the communicator has one (else None).
    """

    __slots__ = ("rank", "size", "transport", "scratch", "chunk_bytes", "window", "node")

    def __init__(self, transport, scratch, chunk_bytes: int, window: int):
        self.rank, self.size, self.transport, self.scratch = transport.rank, transport.size, transport, scratch
        self.chunk_bytes, self.window, self.node = chunk_bytes, window, None


class TagSequence:
    """Tags for collectives: ``USER_TAG_LIMIT + (sequence % (COLLECTIVE_TAG_SPAN - 1))``, same order on all ranks.

    The last tag of the span is kept for aborts (:data:`npddp.comm.engine.abort.CONTROL_TAG`)."""

    __slots__ = ("_seq", "count")

    def __init__(self):
        self._seq = 0
        self.count = 0  # tags handed out so far

    def next(self) -> int:
        """Tag of the next collective."""
        tag = c.USER_TAG_LIMIT + self._seq
        self._seq = (self._seq + 1) % (c.COLLECTIVE_TAG_SPAN - 1)
        self.count += 1
        return tag


class Call(Deadline):
    """One collective (or send/recv) in progress: what to name in errors, its tag, and the deadline of its waits.

    ``owner`` is the communicator: it turns an overdue wait or a broken connection into the error
    to raise (``give_up``, ``fail``) and refuses later calls. ``transport`` is what the call's
    messages go through: the owner's transport, or a signed call's (:mod:`npddp.comm.engine.signed`)
    while the argument check is on; each clock read asks the owner's ``watch`` (None when off)
    whether a peer has aborted.
    """

    __slots__ = ("owner", "transport", "operation", "number", "tag", "scale", "signature")

    def __init__(self, owner, operation: str, number: int | None, tag: int, signature: tuple | None = None):
        self.owner, self.transport = owner, owner.transport
        self.operation, self.number, self.tag = operation, number, tag
        self.expires = 0.0  # set at the first clock read
        self.rounds = 0     # clock reads so far
        self.scale = 0.0    # op avg: the factor (1/N) still to apply to the result; 0.0: none
        self.signature = signature  # with the argument check on: what every rank must pass alike (signature.WORDS)

    def take_scale(self) -> float:
        """The average's factor (0.0: none), which the caller now applies itself, fused into its reduction."""
        scale, self.scale = self.scale, 0.0
        return scale

    def apply_scale(self, result: np.ndarray) -> None:
        """Apply what is left of the average's factor to the whole ``result`` (algorithms that do not fuse it)."""
        scale = self.take_scale()
        if scale:
            np.multiply(result, scale, out=result)

    def overdue(self) -> bool:
        """Read the clock (the first read starts the deadline; a heard abort raises, and once the wait naps, a
        peer's message for this call under another shape's tag); True past the deadline."""
        owner = self.owner
        if owner.watch is not None:
            owner.heard_abort()
            if self.rounds >= SPIN_ROUNDS and self.signature is not None:
                owner.stray_message(self)
        return self.past(owner.timeout)

    def needs(self) -> list[int]:
        """World ranks whose leaving ends this call's waits: a collective's communicator's members (a user's send or
        receive names no peer here, so it waits for its timeout)."""
        return world_members(self.owner.transport) if self.number is not None else []

    def wait(self, request) -> None:
        """Complete ``request``, yielding the CPU between polls; Overdue past the deadline."""
        wait_until(request.test, self.overdue)

    def wait_all(self, requests) -> None:
        """Complete every request, testing them all in turn (so any one may raise first); Overdue past the deadline."""
        pending = list(requests)

        def done() -> bool:
            pending[:] = [r for r in pending if not r.test()]
            return not pending
        wait_until(done, self.overdue)

    def transfer(self, recvs=(), sends=()) -> None:
        """Post receives ``[(array, source)]`` and sends ``[(array, dest)]`` under this call's tag; wait for all."""
        transport, tag = self.transport, self.tag
        rreqs, sreqs = [], []
        try:
            rreqs += [(transport.irecv(a, source, tag), source) for a, source in recvs]
            sreqs += [(transport.isend(a, dest, tag), dest) for a, dest in sends]
            for request, _ in rreqs:
                self.wait(request)
            for request, _ in sreqs:
                self.wait(request)
        except Overdue:
            raise self.owner.give_up(self, rreqs, sreqs, (recvs, sends)) from None
        except ConnectionError as exc:
            raise self.owner.fail(self, exc, rreqs, sreqs, (recvs, sends)) from None
        except Exception:   # a mismatch found while waiting: the transport may still write the other buffers
            self.owner.strand(rreqs + sreqs, (recvs, sends))
            raise

    def exchange(self, got, send, peer: int, dest: int | None = None) -> None:
        """Receive ``got`` from ``peer`` and send ``send`` to ``dest`` (default: ``peer``) under this call's tag; wait
        for both."""
        transport, tag = self.transport, self.tag
        if dest is None:
            dest = peer
        recv = transport.irecv(got, peer, tag)
        sent = transport.isend(send, dest, tag)
        try:   # a request already complete (a short message often is) costs one test, no wait loop
            if not recv.test():
                self.wait(recv)
            if not sent.test():
                self.wait(sent)
        except Overdue:
            raise self.owner.give_up(self, [(recv, peer)], [(sent, dest)], (got, send)) from None
        except ConnectionError as exc:
            raise self.owner.fail(self, exc, [(recv, peer)], [(sent, dest)], (got, send)) from None
        except Exception:   # a mismatch found while waiting
            self.owner.strand([(recv, peer), (sent, dest)], (got, send))
            raise

    def describe(self) -> str:
        """E.g. ``ring allreduce (collective #12, tag 16395)``."""
        what = f"collective #{self.number}, " if self.number is not None else ""
        return f"{self.owner.name} {self.operation} ({what}tag {self.tag})"

    def timeout_error(self, recv_from: Sequence[int], send_to: Sequence[int] = (),
                      arrive: Sequence[int] = ()) -> TimeoutError:
        """The error of this call, still waiting on messages from and to the given ranks (or for them to arrive)."""
        waits = []
        if recv_from:
            waits.append("to receive from " + _ranks(recv_from))
        if send_to:
            waits.append("to send to " + _ranks(send_to))
        if arrive:
            waits.append("for " + _ranks(arrive) + " to arrive")
        return TimeoutError(timeout_text(f"[{self.owner.who()}] {self.describe()}", self.owner.timeout,
                                         " and ".join(waits) or "for its peers"))


def rank_label(transport) -> str:
    """This rank as errors name it: ``rank 3`` in the job's world (or where the group's number is the world's),
    ``rank 1 of the group (world rank 3)`` in a group (a split, hier's group across nodes) numbered apart from it."""
    base = transport
    while getattr(base, "inner", None) is not None:   # a reordered view of a group
        base = base.inner
    world_rank, world_size = getattr(base, "world_rank", transport.rank), getattr(base, "world_size", transport.size)
    if world_rank == transport.rank and world_size == transport.size:
        return f"rank {transport.rank}"
    return f"rank {transport.rank} of the group (world rank {world_rank})"


def _ranks(ranks: Sequence[int]) -> str:
    """``rank 3`` or ``ranks 1, 3``."""
    ranks = sorted(set(ranks))
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))

