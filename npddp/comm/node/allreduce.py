"""The ranks of one node within a communicator: the steps of the shared-memory all-reduce.

They run over the node's shared segments and staging areas, :class:`NodeGroup`'s base
:class:`~npddp.comm.node.segments.NodeSegments`, which says where each rank's data lies
(:mod:`npddp.comm.node.segments`).

Large vectors, two node barriers:

1. every rank publishes and arrives; **reduce-scatter and push**: rank i reduces block i (blocks
   as ``np.array_split``) from every rank's input, its own first, reading the peers' memory
   directly, into its own result, and writes each reduced piece at once into every peer's result
   too (in pieces of ``push_bytes``, so what it copies is still in its cache). No one else reads
   or writes block i of anything, so nothing races. It arrives at the second barrier;
2. once all have arrived, every result is complete and no one touches anyone's memory any more:
   a rank whose result is not its output (a staging area) copies the peers' blocks over (its own
   block was reduced straight into its output), and the call is complete. Pushing needs no third barrier (a pull all-gather needs one before the buffers may be
   written again), and measured faster as well (1 MiB at N = 2: 52-59 us against 130 us).

Each element is reduced once, at one place, and copied everywhere else: every rank holds the
same bits. Small vectors (``small_bytes`` and below) take a one-barrier path: every rank copies
its input into one of two staging slots (alternating per call), arrives, and reduces all of them
itself in rank order, the same order on every rank, so again the bits agree.

The blocking paths here run a call start to finish; :class:`npddp.comm.node.shm.ShmWork` runs the
same steps as a state machine for calls that overlap.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from npddp.comm import checks as c
from npddp.comm import signature as sg
from npddp.comm.engine.deadline import Overdue
from npddp.comm.node import cma
from npddp.comm.node.memory import LINE, PID, SIZE_WORDS
from npddp.comm.node.segments import INPUT, PRIVATE, RESULT, STAGED, NodeSegments, aligned
from npddp.comm.node.single_copy import agree_on_single_copy


def _reduce_in_order(views: list, dst: np.ndarray, ufunc) -> None:
    """Reduce every rank's ``views`` into ``dst`` in rank order (the same order, so the same bits, on every rank)."""
    ufunc(views[0], views[1], out=dst)
    for v in views[2:]:
        ufunc(dst, v, out=dst)


def _abort_row(call, me: int, peer: int, word: int) -> np.ndarray:
    """The abort of a size word ``word`` of ``peer`` that differs from this call's (engine.abort.ABORT_WORDS)."""
    sig = call.signature
    nbytes, theirs = sg.unpack(word)
    dtype = theirs[2]
    theirs[1], theirs[5] = call.number, sig[5]
    theirs[3] = nbytes // np.dtype(c.DTYPES[dtype]).itemsize if 0 <= dtype < len(c.DTYPES) else -1
    return np.array([me, peer, sig[0], call.number, *sig[2:], *theirs], dtype=np.int64)


class NodeGroup(NodeSegments):
    """This node's ranks within a communicator: the all-reduce's steps over their shared segments."""

    #: Vectors of at most this many bytes take the one-barrier path (measured at N = 2: it takes
    #: a third of the large path's time at 64 KiB, and loses from about 256 KiB).
    small_bytes = 64 << 10
    #: The large path reduces and pushes in pieces of this many bytes (measured at N = 2: 256 KiB
    #: took 2.1 ms at 16 MiB against 2.6 ms for one piece, and 64 KiB pieces were slower).
    push_bytes = 256 << 10
    #: Private (not :meth:`empty`) buffers of at least this many bytes are read and written in the
    #: peers' own memory by single-copy transfers (:mod:`npddp.comm.node.cma`) instead of staged,
    #: when the kernel allows it; smaller ones are staged, which measured faster from 2 to 8 MiB at
    #: N = 2 (0.47-0.62 of MPI's time against 0.65-0.84; the kernel's per-page cost outweighs the
    #: copies saved), level at 16 MiB, and slower from 32 MiB (0.28-0.31 against 0.20-0.22).
    #: ``None``: never.
    single_copy_bytes: int | None = 16 << 20
    #: Pieces read from (and written to) a peer's private memory: each transfer is one system call,
    #: so they are larger than ``push_bytes`` (measured at N = 2: 1 MiB pieces took 0.6-0.8 of the
    #: time of 256 KiB ones from 4 MiB up).
    single_copy_piece_bytes = 1 << 20

    def __init__(self, comm, local: list[int], call):
        super().__init__(comm, local, call)
        self._bounds: dict = {}
        self.seq = 0             # node barriers reserved so far: the same count on every rank of the node
        self.waiting = 0         # the node barrier a blocking call waits for
        self.small_calls = 0
        self.sized_calls = 0   # all-reduces so far: which of the two size words the next one uses
        self._pull = np.empty(0, dtype=np.uint8)  # where pieces read from private peer inputs land
        #: Why single-copy transfers of private buffers are off ("" when they are on).
        self.single_copy_off = agree_on_single_copy(self, call)

    @property
    def single_copy(self) -> bool:
        """Whether private buffers of ``single_copy_bytes`` and more move by single-copy transfers."""
        return not self.single_copy_off and self.single_copy_bytes is not None

    def size_word(self) -> int:
        """The control-line word the next all-reduce publishes its byte count in (two, alternating:
        a rank may start the next call while a slower one still checks this one's)."""
        word = SIZE_WORDS[self.sized_calls % 2]
        self.sized_calls += 1
        return word

    def publish_size(self, word: int, value: int) -> None:
        """Announce this call's :meth:`size_value` (before arriving at its first barrier)."""
        self.sync.words[self.sync.me * LINE + word] = value

    @staticmethod
    def size_value(call, nbytes: int) -> int:
        """What a call publishes: its byte count, with kind, dtype and op folded in when the call is signed."""
        return nbytes if call.signature is None else nbytes << sg.PACK_BITS | call.signature.low

    def check_sizes(self, call, word: int, value: int) -> None:
        """After the first barrier: CollectiveMismatchError (a ValueError) on every rank when the node's ranks
        passed different sizes, dtypes or ops."""
        sync = self.sync
        words = sync.words
        for i in sync.others:
            if words[i * LINE + word] != value:
                break
        else:
            return
        signed = call.signature is not None
        theirs = {sync.ranks[i]: words[i * LINE + word] for i in sync.others if words[i * LINE + word] != value}
        me = sync.ranks[sync.me]
        nbytes, mine = sg.unpack(value) if signed else (value, None)
        parts, fields = [], set()
        for r, v in sorted(theirs.items()):
            their_bytes, sig = sg.unpack(v) if signed else (v, None)
            fields.update(f for f in (sg.differing(mine, sig) if signed else ()) if f != "count")
            fields.update(["count"] if their_bytes != nbytes else [])
            parts.append(f"rank {r} called {sg.describe(sig)} of {their_bytes} bytes" if signed
                         else f"rank {r} {their_bytes} bytes")
        text = (f"{call.describe()}: the ranks passed different sizes, dtypes or ops: "
                + ", ".join(parts) + f" but rank {me} called " + (f"{sg.describe(mine)} of " if signed else "")
                + f"{nbytes} bytes; differing fields: {', '.join(f for f in sg.FIELDS if f in fields) or 'count'}"
                + "; every rank must pass the same shape, dtype and op")
        if signed:   # every rank of the communicator hears it (hier: the other nodes, which never see this node's line)
            peer = min(theirs)
            self.comm.abort(text, _abort_row(call, me, peer, theirs[peer]))
        else:
            self.comm._abandon_all(text, [], None)
        raise sg.CollectiveMismatchError(f"[{self.comm.who()}] {text}; this communicator is now closed")

    def reserve(self, barriers: int) -> int:
        """Number the next ``barriers`` node barriers; return the first."""
        first = self.seq + 1
        self.seq += barriers
        return first

    def bounds(self, n: int) -> list[int]:
        """Block offsets of ``n`` elements among the node's ranks (cached)."""
        bounds = self._bounds.get(n)
        if bounds is None:
            if len(self._bounds) >= 256:
                self._bounds.clear()
            bounds = self._bounds[n] = c.block_bounds(n, self.n).tolist()
        return bounds

    def wait(self, call, seq: int) -> None:
        """Wait for node barrier ``seq``; the communicator's TimeoutError (naming who is late) or ConnectionError."""
        self.waiting = seq
        try:
            self.sync.wait(seq, call, partial(self.watch, call, seq))
        except Overdue:
            raise self.comm.give_up(call, [], []) from None
        except ConnectionError as exc:
            raise self.comm.fail(call, exc) from None

    def watch(self, call, seq: int) -> None:
        """While waiting at node barrier ``seq`` for ``call``: CollectiveMismatchError on a peer's message for it.

        The node's calls move no message over the transport, so a peer's message numbered as this call
        means that peer called another collective (two calls swapped, say): it waits for this rank's
        messages as this rank waits at the barrier. Unless the barrier has completed meanwhile: a peer
        past it may already send for this call's next step (a staging area's exchange)."""
        if call.signature is not None and self.comm.watch is not None:
            self.comm.stray_message(call, True, lambda: not self.sync.arrived(seq))

    def late(self, active) -> list[int]:
        """Ranks that have not reached the barrier the oldest call in ``active`` (else a blocking call) waits for."""
        targets = [w.target() for w in active if hasattr(w, "target")]
        return self.sync.late(targets[0] if targets else self.waiting)

    # --- the small path ---------------------------------------------------------------
    def next_parity(self) -> int:
        """The small slot the next small call uses (they alternate)."""
        parity = self.small_calls % 2
        self.small_calls += 1
        return parity

    def stage_small(self, staging: int, parity: int, src: np.ndarray) -> None:
        """Copy ``src`` into this rank's small slot ``parity``."""
        np.copyto(self.small_views(staging, parity, src.dtype, src.size)[self.li], src)

    def reduce_small(self, staging: int, parity: int, dst: np.ndarray, ufunc) -> None:
        """Reduce every rank's small slot into ``dst``, in rank order (the same on every rank)."""
        _reduce_in_order(self.small_views(staging, parity, dst.dtype, dst.size), dst, ufunc)

    def small_allreduce(self, call, src, dst, ufunc) -> None:
        """The one-barrier path, run to completion (a blocking call's short path; the slots looked up once)."""
        parity, seq, word = self.next_parity(), self.reserve(1), self.size_word()
        views = self.small_views(self.staging_index, parity, src.dtype, src.size)
        np.copyto(views[self.li], src)
        value = self.size_value(call, src.nbytes)
        self.publish_size(word, value)
        self.sync.arrive(seq)
        self.wait(call, seq)
        self.check_sizes(call, word, value)
        _reduce_in_order(views, dst, ufunc)

    # --- the large path ---------------------------------------------------------------
    def places(self, call, src, dst) -> tuple[tuple[int, int], tuple[int, int]]:
        """Where ``src`` and ``dst`` lie: in shared arrays, ``(PRIVATE, address)``, or ``(STAGED, -1)``.

        Private buffers of ``single_copy_bytes`` and more stay where they are when single copy is
        on; any other private buffer is staged, and the staging area grows to hold it.
        """
        at_src = self._place(src)
        at_dst = at_src if dst is src else self._place(dst)
        if (at_src[0] == STAGED or at_dst[0] == STAGED) and src.nbytes > self.big:
            for work in tuple(call.owner._active):   # node barriers count up in call order
                work.wait()
            self.agree_on_size(call, src.nbytes)
            self.ensure_staging(call, src.nbytes)
        return at_src, at_dst

    def agree_on_size(self, call, nbytes: int) -> None:
        """One node barrier comparing this call's size word: before the staging area grows (an exchange every rank
        of the node must join), where a peer that passed another count meets it at its own first barrier, and as
        shm's barrier, which a peer's all-reduce meets; both raise CollectiveMismatchError instead of waiting for
        each other or reading stale slots."""
        seq, word = self.reserve(1), self.size_word()
        value = self.size_value(call, nbytes)
        self.publish_size(word, value)
        self.sync.arrive(seq)
        self.wait(call, seq)
        self.check_sizes(call, word, value)

    def _place(self, buf) -> tuple[int, int]:
        at = self.locate(buf)
        if at[0] < 0 and self.single_copy and buf.nbytes >= self.single_copy_bytes:
            return PRIVATE, buf.ctypes.data
        return at

    def publish(self, src, at_src, at_dst, staging: int, bounds: list[int]) -> None:
        """Stage ``src`` if it is not shared; publish where input and result lie (the output itself, if shared)."""
        inp = at_src
        if inp[0] == STAGED:  # stage what the peers read: every block but this rank's own, which it reads from src
            inp = (staging, self.big_slot(staging, self.li))
            view, lo, hi = self.view(*inp, src.dtype, src.size), bounds[self.li], bounds[self.li + 1]
            np.copyto(view[:lo], src[:lo])
            np.copyto(view[hi:], src[hi:])
        res = at_dst
        if res[0] == STAGED:
            res = inp if inp[0] == staging else (staging, self.big_slot(staging, self.li))
        self.sync.publish(*inp, *res)

    def reduce_block(self, src, ufunc, bounds: list[int], push: bool, scale: float = 0.0, dst=None) -> np.ndarray:
        """Reduce this rank's block from every input into its result, pushing each piece if ``push``; the block.

        ``scale`` (op avg: 1/N) multiplies each reduced piece while it is in cache, before it is pushed.
        A peer's private input is read piece by piece into a local buffer, and a piece is written
        into a peer's private result, by single-copy transfers. ``dst``: this rank's output, which
        receives its own block directly even when its result is staged (no copy of that block
        after the call, see :meth:`finish`); None: the published result.
        """
        n, dtype, li = src.size, src.dtype, self.li
        lo, hi = bounds[li], bounds[li + 1]
        out = dst if dst is not None else self.published(li, RESULT, dtype, n)
        peers = [self.reachable(i, INPUT, dtype, n) for i in self.sync.others]
        theirs = self.results_of_peers(dtype, n) if push else []
        pulled = any(isinstance(v, tuple) for v in peers)
        piece = self.single_copy_piece_bytes if pulled else self.push_bytes
        step = max(1, piece // dtype.itemsize) if push or pulled else max(hi - lo, 1)
        pull = self._pull_buffers(len(peers), step, dtype) if pulled else None
        size = dtype.itemsize
        for a in range(lo, hi, step):
            b = min(a + step, hi)
            piece = out[a:b]
            inputs = [src[a:b]]
            for k, v in enumerate(peers):
                if isinstance(v, tuple):  # (pid, address): a private input, read into this rank's memory
                    got = pull[k][:b - a]
                    cma.read(v[0], v[1] + a * size, got)
                    inputs.append(got)
                else:
                    inputs.append(v[a:b])
            if len(inputs) > 1:
                ufunc(inputs[0], inputs[1], out=piece)
            elif piece.ctypes.data != inputs[0].ctypes.data:
                np.copyto(piece, inputs[0])
            for v in inputs[2:]:
                ufunc(piece, v, out=piece)
            if scale:
                np.multiply(piece, scale, out=piece)
            for t in theirs:
                if isinstance(t, tuple):
                    cma.write(t[0], t[1] + a * size, piece)
                else:
                    np.copyto(t[a:b], piece)
        return out[lo:hi]

    def _pull_buffers(self, count: int, step: int, dtype) -> list[np.ndarray]:
        """``count`` local buffers of ``step`` elements for pieces read from peers (grown, never shrunk)."""
        each = aligned(step * dtype.itemsize)
        if self._pull.size < count * each:
            self._pull = np.empty(count * each, dtype=np.uint8)
        return [self._pull[k * each:k * each + step * dtype.itemsize].view(dtype) for k in range(count)]

    def reachable(self, local: int, words: tuple[int, int], dtype, count: int):
        """Local rank ``local``'s published input or result: a view of shared memory, or ``(pid, address)``."""
        word = self.sync.word
        if word(local, words[0]) == PRIVATE:
            return word(local, PID), word(local, words[1])
        return self.published(local, words, dtype, count)

    def results_of_peers(self, dtype, count: int) -> list:
        """Every peer's published result (a view, or ``(pid, address)`` of a private one)."""
        return [self.reachable(i, RESULT, dtype, count) for i in self.sync.others]

    def push_block(self, block: np.ndarray, lo: int, count: int) -> None:
        """Copy this rank's reduced ``block`` (starting at element ``lo``) into every peer's result."""
        for t in self.results_of_peers(block.dtype, count):
            if isinstance(t, tuple):
                cma.write(t[0], t[1] + lo * block.itemsize, block)
            else:
                np.copyto(t[lo:lo + block.size], block)

    def finish(self, dst, bounds: list[int]) -> None:
        """Copy the peers' blocks of this rank's staged result into ``dst`` (its own block is there already)."""
        result, lo, hi = self.published(self.li, RESULT, dst.dtype, dst.size), bounds[self.li], bounds[self.li + 1]
        np.copyto(dst[:lo], result[:lo])
        np.copyto(dst[hi:], result[hi:])

    def large_allreduce(self, call, src, dst, ufunc) -> None:
        """The two-barrier path, run to completion (a blocking call's path for large vectors)."""
        at_src, at_dst = self.places(call, src, dst)
        seq, bounds, word = self.reserve(2), self.bounds(src.size), self.size_word()
        self.publish(src, at_src, at_dst, self.staging_index, bounds)
        value = self.size_value(call, src.nbytes)
        self.publish_size(word, value)
        self.sync.arrive(seq)
        self.wait(call, seq)
        self.check_sizes(call, word, value)
        try:
            self.reduce_block(src, ufunc, bounds, push=True, scale=call.take_scale(), dst=dst)
        except ConnectionError as exc:  # a peer whose memory we read or write has died
            raise self.comm.fail(call, exc) from None
        self.sync.arrive(seq + 1)
        self.wait(call, seq + 1)
        if at_dst[0] == STAGED:
            self.finish(dst, bounds)

    def allreduce(self, call, src, dst, ufunc) -> None:
        """Blocking all-reduce on the node: the one-barrier path for small vectors, else the two-barrier one."""
        if src.nbytes <= self.small_bytes:
            self.small_allreduce(call, src, dst, ufunc)
        else:
            self.large_allreduce(call, src, dst, ufunc)
