"""A communicator's calls from opening to giving up: tags, the argument check, the requests in flight.

:class:`CallLifecycle` is the base of :class:`~npddp.comm.communicators.p2p.P2PCommunicator` (and so of
every hand-written backend): it opens each call under a fresh collective tag (or the user's tag), signed
with the call's arguments while ``check_args`` is on, keeps the Work handles still in flight, and turns
a timeout, a broken connection or a peer's differing arguments into the error to raise.

Failure. A call still waiting ``timeout`` seconds after its first long wait raises
TimeoutError naming the operation, its number and the ranks it waits for; a peer whose
connection breaks raises ConnectionError. Either way every outstanding request is abandoned
(its buffers kept alive, since the transport may still touch them) and the communicator refuses
any further call, because its peers now stand at different points of the call sequence.
"""

from __future__ import annotations

import weakref

import numpy as np

from npddp.comm import checks as c
from npddp.comm import signature as sg
from npddp.comm.base import Backend
from npddp.comm.engine.call import Call, TagSequence, rank_label
from npddp.comm.engine.deadline import Overdue
from npddp.comm.engine.abort import AbortWatch
from npddp.comm.engine.signed import Signer
from npddp.comm.engine.work import P2PWork


class CallLifecycle(Backend):
    """Opens calls on ``transport``, tracks those in flight, and gives up on them all after a failure."""

    def __init__(self, transport, name: str, timeout: float = c.DEFAULT_TIMEOUT):
        self.transport = transport
        self.signer: Signer | None = None         # signs every collective's messages while check_args is on
        self.watch: AbortWatch | None = None      # the peers' aborts, while check_args is on
        self._rank, self._size = transport.rank, transport.size
        self.name = name
        self.timeout = timeout
        self._tags = TagSequence()
        self._active: list[P2PWork] = []
        self._failure: str | None = None   # why this communicator is unusable
        self._stranded: list = []           # buffers and handles abandoned requests may still touch
        self._empty = np.empty(0, dtype=np.uint8)
        #: hier's group across nodes: (a weak reference to the hier communicator, its rank of each of this one's
        #: ranks); its aborts are this one's too, both ways, so a rank waiting on either hears one found on the other
        self.parent: tuple | None = None
        self._who = rank_label(transport)

    @property
    def check_args(self) -> bool:
        """Whether every collective checks that all ranks passed the same kind, dtype, count, op and root
        (:mod:`npddp.comm.engine.signed`); ``create`` turns it on unless ``NPDDP_CHECK_ARGS=0``."""
        return self.signer is not None

    @check_args.setter
    def check_args(self, on: bool) -> None:
        if bool(on) == self.check_args:
            return
        if self._active:
            raise RuntimeError("check_args cannot change while non-blocking calls are in flight; wait for them first")
        if on and self.watch is None and self._size > 1:
            self.watch = AbortWatch(self.transport)
            weakref.finalize(self, self.watch.withdraw)   # its receives go with this communicator, or at exit
        self.signer = Signer(self.transport) if on else None
        if not on:
            self._stranded.append(self.watch)   # its receives stay posted: a peer may still send to them
            self.watch = None
        for sub in self._sub_communicators():
            sub.check_args = on

    def _sub_communicators(self) -> tuple:
        """Communicators this one runs calls on (hier's across nodes), which check as it does."""
        return ()

    # --- calls, waits and giving up --------------------------------------------------
    def _begin(self, operation: str, user_tag: int | None = None, buf=None, op=None, root=None) -> Call:
        """Open a call (after its arguments were checked): a fresh collective tag, or the user's tag.

        With ``check_args``, a collective is a :class:`~npddp.comm.engine.signed.SignedCall`, whose first
        message each way between two ranks carries the call's signature (``buf``'s dtype and count,
        ``op``, ``root``)."""
        if self._failure is not None:
            raise self.unusable()
        if user_tag is not None:
            return Call(self, operation, None, user_tag)
        tag = self._tags.next()
        signer = self.signer
        if signer is not None:   # the shape's key (dtype number: hashed faster than the dtype), looked up here once
            key = (operation, -1, -1, op, root) if buf is None else (operation, buf.dtype.num, buf.size, op, root)
            shape = signer.shapes.get(key)
            if shape is not None and shape.bits:   # signed in full before: plain under its index (Signer.open's path)
                return Call(self, operation, self._tags.count, tag | shape.bits, shape.sig)
            return signer.open(self, operation, self._tags.count, tag, key, buf, op, root)
        return Call(self, operation, self._tags.count, tag)

    def who(self) -> str:
        """This rank as its errors name it: ``rank 3``, or ``rank 1 of the group (world rank 3)`` in a group."""
        return self._who

    def mismatch(self, number: int, peer: int, mine, theirs) -> sg.CollectiveMismatchError:
        """After ``peer``'s signature differed from this rank's: tell every rank, close; return the error to raise."""
        text = sg.message(number, self._rank, mine, peer, theirs)
        self.abort(text, np.concatenate(([self._rank, peer], mine, theirs)).astype(np.int64))
        return sg.CollectiveMismatchError(f"[{self.who()}] {text}; this communicator is now closed")

    def abort(self, text: str, found: np.ndarray) -> None:
        """Tell every rank of abort ``found`` (finder, peer, both signatures; this communicator's ranks), and those
        of a parent (hier's, its ranks named as there); close this communicator (and the parent) with ``text``."""
        if self.watch is not None:
            self.watch.tell_all(found, min(self._timeout, 5.0))
        self._abandon_all(text, [], found)
        parent = self.parent[0]() if self.parent is not None else None
        if parent is not None:
            ranks = self.parent[1]
            if parent._failure is None:
                row = found.copy()
                row[:2] = ranks[int(found[0])], ranks[int(found[1])]
                mine, theirs = row[2:2 + sg.WORDS], row[2 + sg.WORDS:]
                parent.abort(sg.message(int(mine[1]), int(row[0]), mine, int(row[1]), theirs, found_by=int(row[0])),
                             row)

    def heard_abort(self) -> None:
        """CollectiveMismatchError (and close) if a peer (or a parent's) has told this rank of a mismatch; the
        abort is passed on to every rank, so a rank waiting on this one hears it even if the first copy was lost."""
        text = self.watch.heard()
        if text is not None and self._failure is None:
            self.abort(text, self.watch.found)
            raise sg.CollectiveMismatchError(f"[{self.who()}] {text}; this communicator is now closed")
        parent = self.parent[0]() if self.parent is not None and self._failure is None else None
        if parent is not None and parent.watch is not None:   # a wait across nodes: the node's aborts too
            try:
                parent.heard_abort()
            except sg.CollectiveMismatchError as exc:
                self._abandon_all(str(exc), [], None)
                raise

    def stray_message(self, call, silent: bool = False, still=None) -> None:
        """CollectiveMismatchError (and close) if a peer's message for ``call``, which has waited long, came under
        another signature's index (:meth:`~npddp.comm.engine.signed.Signer.stray`; ``silent``: under any tag, for a
        call that moves no message; ``still()``, if given, says whether one found still counts)."""
        signer = self.signer
        if signer is None or not signer.limit or self._failure is not None:
            return
        found = signer.stray(call, self.transport, silent)
        if found is not None and (still is None or still()):
            peer, theirs = found
            mine = (call.signature[0], call.number, *call.signature[2:])
            if theirs != sg.UNKNOWN:
                theirs = (theirs[0], call.number, *theirs[2:])
            raise self.mismatch(call.number, peer, mine, theirs)

    def _signed_empty(self, call) -> None:
        """Trade this call's signature with every peer (while ``check_args`` is on): a signed collective with
        nothing to move on this rank, so a rank that passed a non-empty buffer meets a mismatch instead of waiting
        for messages that never come, and every rooted one (``broadcast``, ``gather``, ``scatter``) before its data,
        since a rank that believes it is the root (or sends only) would otherwise compare with no peer. Under a
        signature's index the messages are empty and a peer that passed other arguments sends under another tag
        (found by :meth:`stray_message`); either way every rank compares with every peer and raises.

        Every receive is tested in turn: the peers that passed a buffer send only where their schedule
        goes, and the first such message must be checked whichever peer it comes from."""
        if call.signature is None or self._size == 1:
            return
        transport, tag, empty = call.transport, call.tag, self._empty
        peers = [p for p in range(self._size) if p != self._rank]
        recvs, sends = [], []
        try:
            recvs += [(transport.irecv(empty, p, tag), p) for p in peers]
            sends += [(transport.isend(empty, p, tag), p) for p in peers]
            call.wait_all([request for request, _ in recvs + sends])
        except Overdue:
            raise self.give_up(call, recvs, sends) from None
        except ConnectionError as exc:
            raise self.fail(call, exc, recvs, sends) from None
        except Exception:   # a mismatch found while waiting
            self.strand(recvs + sends, None)
            raise

    def _setup_done(self) -> None:
        """Number the user's collectives from 1, whatever the constructor exchanged before them."""
        self._tags.count = 0

    def unusable(self) -> RuntimeError:
        """The error of any call after a failure."""
        return RuntimeError(f"this {self.name} communicator is unusable after an earlier failure: {self._failure}")

    def give_up(self, call: Call, recvs: list, sends: list, keep=None) -> TimeoutError:
        """After ``call`` timed out: abandon every request in flight; return the TimeoutError to raise."""
        recv_from = [peer for request, peer in recvs if not request.test()]
        send_to = [peer for request, peer in sends if not request.test()]
        node = getattr(self, "node", None)  # shared-memory backends: who has not reached the node barrier
        late = node.late(self._active) if node is not None and not recvs and not sends else ()
        error = call.timeout_error(recv_from, send_to, late)
        self._abandon_all(str(error), recvs + sends, keep)
        return error

    def fail(self, call: Call, exc: Exception, recvs=(), sends=(), keep=None) -> ConnectionError:
        """After a peer's connection broke during ``call``: abandon everything; return the error to raise."""
        error = ConnectionError(f"[{self.who()}] {call.describe()}: {exc}; this communicator is now unusable")
        self._abandon_all(str(error), [*recvs, *sends], keep)
        return error

    def strand(self, requests: list, keep) -> None:
        """Cancel ``[(request, peer)]`` left behind by an error, and keep them and the buffers ``keep`` alive:
        the transport may still write into a receive's buffer (MPI, when its message had already matched)."""
        self._stranded.append((requests, keep))
        for request, _ in requests:
            try:
                request.cancel()
            except ConnectionError:
                pass

    def _abandon_all(self, why: str, requests: list, keep) -> None:
        """Cancel ``[(request, peer)]`` and every outstanding handle's requests; refuse later calls."""
        self._failure = why
        self._stranded.append(keep)
        for work in tuple(self._active):
            requests += sum(work._requests(), [])
            work._abandoned = True
            self._stranded.append(work)
        self._active.clear()
        for request, _ in requests:
            try:
                request.cancel()
            except ConnectionError:
                pass

