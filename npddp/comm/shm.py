"""``shm``: all-reduce among the ranks of one node through shared memory, with no message on the data path.

Where each rank's data lies. A buffer made by :meth:`ShmCommunicator.empty` already lives in
shared memory, so peers read it in place (DDP allocates its gradient buckets this way, so
gradients are born where the others can read them). Any other buffer is first copied into the
rank's slot of a shared staging area. Each call, a rank publishes in its control line where
its input lies and where its reduced block will lie (:mod:`npddp.comm.shmem`).

Large vectors, three node barriers:

1. every rank publishes and arrives; **reduce-scatter**: rank i reduces block i (blocks as
   ``np.array_split``) from every rank's input, reading the peers' memory directly, and writes
   the result where it said it would; it arrives at the second barrier;
2. **all-gather**: every rank copies each other block from its owner's result into its own
   output; arrives at the third barrier;
3. once all have arrived, no one reads anyone's memory any more: the call is complete, and the
   buffers may be written again.

Each element is reduced once, at one place, and copied everywhere else: every rank holds the
same bits. Small vectors (``small_bytes`` and below) take a one-barrier path: every rank copies
its input into one of two staging slots (alternating per call), arrives, and reduces all of them
itself in rank order, the same order on every rank, so again the bits agree.

Calls complete in the order they started (``iallreduce`` handles are progressed oldest first),
which is what lets the barriers of overlapping calls count up one sequence.
"""

from __future__ import annotations

import numpy as np

from . import _common as c
from .engine import Overdue, P2PWork
from .p2p import P2PCommunicator
from .shmem import LINE, NodeSync, create_segment, node_ids

_ALIGN = 4096


def _aligned(nbytes: int) -> int:
    return -(-max(nbytes, 1) // _ALIGN) * _ALIGN


class NodeGroup:
    """This node's ranks within a communicator: their control lines, staging slots and shared arrays."""

    #: Vectors of at most this many bytes take the one-barrier path (measured at N = 2: it takes
    #: a third of the three-barrier path's time at 64 KiB, and loses from about 256 KiB).
    small_bytes = 64 << 10

    def __init__(self, comm, local: list[int], call):
        self.comm, self.local = comm, local
        self.li, self.n = local.index(comm.rank), len(local)
        ctrl = create_segment(comm, local, self.n * LINE * 8, call)
        self.sync = NodeSync(ctrl.array.view(np.int64), self.li, local)
        self.segments = [ctrl]   # every segment, by the index published in control lines; never reordered
        self.arrays: list[int] = []  # indices of the segments made by empty()
        self.slots: dict[int, int] = {}  # staging segment index -> bytes per rank
        self._views: dict = {}
        self._bounds: dict = {}
        self.staging_index, self.big = -1, 0
        self._make_staging(call, 0)
        self.seq = 0             # node barriers reserved so far: the same count on every rank of the node
        self.small_calls = 0

    def _make_staging(self, call, big: int) -> None:
        """Make a staging area: per rank two small slots and ``big`` bytes for one large vector.

        A new area gets a new index: calls made before it keep using (and publishing) the old one.
        """
        self.big = _aligned(big) if big else 0
        slot = 2 * self.small_bytes + self.big
        self.segments.append(create_segment(self.comm, self.local, slot * self.n, call))
        self.staging_index = len(self.segments) - 1
        self.slots[self.staging_index] = slot

    def ensure_staging(self, call, nbytes: int) -> None:
        """Grow the staging area to hold ``nbytes`` per rank (every rank of the node grows at the same call)."""
        if nbytes > self.big:
            self._make_staging(call, max(nbytes, 2 * self.big))

    def reserve(self, barriers: int) -> int:
        """Number the next ``barriers`` node barriers; return the first."""
        first = self.seq + 1
        self.seq += barriers
        return first

    def empty(self, call, shape, dtype) -> np.ndarray:
        """This rank's part of a new segment holding one such array per rank of the node."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        each = _aligned(nbytes)
        segment = create_segment(self.comm, self.local, each * self.n, call)
        self.segments.append(segment)
        self.arrays.append(len(self.segments) - 1)
        return segment.array[self.li * each:self.li * each + nbytes].view(dtype).reshape(shape)

    def locate(self, buf: np.ndarray) -> tuple[int, int]:
        """``(segment index, byte offset)`` of ``buf`` in an array from :meth:`empty`, or ``(-1, -1)``."""
        if self.arrays:
            start = buf.ctypes.data
            for index in self.arrays:
                segment = self.segments[index]
                offset = start - segment.address
                if 0 <= offset and offset + buf.nbytes <= segment.nbytes:
                    return index, offset
        return -1, -1

    def bounds(self, n: int) -> list[int]:
        """Block offsets of ``n`` elements among the node's ranks (cached)."""
        bounds = self._bounds.get(n)
        if bounds is None:
            if len(self._bounds) >= 256:
                self._bounds.clear()
            bounds = self._bounds[n] = c.block_bounds(n, self.n).tolist()
        return bounds

    def view(self, index: int, offset: int, dtype, count: int) -> np.ndarray:
        """``count`` elements of ``dtype`` at ``offset`` of segment ``index``."""
        return self.segments[index].array[offset:offset + count * dtype.itemsize].view(dtype)

    def small_views(self, staging: int, parity: int, dtype, count: int) -> list[np.ndarray]:
        """Every local rank's small slot ``parity`` as ``count`` elements of ``dtype`` (cached)."""
        key = (staging, parity, dtype, count)
        views = self._views.get(key)
        if views is None:
            if len(self._views) >= 64:
                self._views.clear()
            views = self._views[key] = [self.view(staging, self.small_slot(staging, i, parity), dtype, count)
                                        for i in range(self.n)]
        return views

    def wait(self, call, seq: int) -> None:
        """Wait for node barrier ``seq``; the communicator's TimeoutError (naming who is late) or ConnectionError."""
        try:
            self.sync.wait(seq, call)
        except Overdue:
            raise self.comm.give_up(call, [], []) from None
        except ConnectionError as exc:
            raise self.comm.fail(call, exc) from None

    def late(self, active) -> list[int]:
        """Ranks that have not reached the barrier the oldest call in ``active`` waits for."""
        works = [w for w in active if isinstance(w, ShmWork)]
        return self.sync.late(works[0].target() if works else self.seq)

    def small_allreduce(self, call, src, dst, ufunc) -> None:
        """The one-barrier path, run to completion (a blocking call's short path; see ShmWork for the rules)."""
        parity = self.small_calls % 2
        self.small_calls += 1
        seq = self.reserve(1)
        views = self.small_views(self.staging_index, parity, src.dtype, src.size)
        np.copyto(views[self.li], src)
        self.sync.arrive(seq)
        self.wait(call, seq)
        ufunc(views[0], views[1], out=dst)
        for v in views[2:]:
            ufunc(dst, v, out=dst)

    def small_slot(self, staging: int, local: int, parity: int) -> int:
        """Byte offset of small slot ``parity`` of local rank ``local`` in staging segment ``staging``."""
        return local * self.slots[staging] + parity * self.small_bytes

    def big_slot(self, staging: int, local: int) -> int:
        """Byte offset of the large staging area of local rank ``local`` in staging segment ``staging``."""
        return local * self.slots[staging] + 2 * self.small_bytes


class ShmWork(P2PWork):
    """One shared-memory all-reduce in progress; ``inter`` (hier) all-reduces each node's block across nodes."""

    __slots__ = ("_node", "_src", "_dst", "_ufunc", "_inter", "_inner", "_seq", "_state", "_small", "_parity",
                 "_bounds", "_res", "_res_is_dst", "_staging", "_at_src", "_at_dst")

    def __init__(self, call, node: NodeGroup, src, dst, ufunc, result, inter=None):
        super().__init__(call, result)
        self._node, self._src, self._dst, self._ufunc, self._inter = node, src, dst, ufunc, inter
        self._inner = None
        self._small = inter is None and src.nbytes <= node.small_bytes
        if not self._small:  # where input and output lie, if in shared arrays ((-1, -1): not)
            self._at_src, self._at_dst = node.locate(src), node.locate(dst)
            if self._at_src[0] < 0 or self._at_dst[0] < 0:
                node.ensure_staging(call, src.nbytes)
        self._staging = node.staging_index  # this call's staging, even if a later call grows a new one
        self._seq = node.reserve(1 if self._small else 3)
        self._parity = -1
        if self._small:
            self._parity = node.small_calls % 2
            node.small_calls += 1
        self._bounds = node.bounds(src.size)
        self._state = 0
        self._start()

    def _advance(self, block):
        node, sync, call = self._node, self._node.sync, self._call
        if self._state == 0:
            if self._active[0] is not self:  # an earlier call on this node comes first
                return False
            self._publish()
            sync.arrive(self._seq)
            self._state = 1
        if self._state == 1:
            if not self._arrived(self._seq, block):
                return False
            if self._small:
                self._reduce_all()
                return True
            self._reduce_block()
            self._state = 2
        if self._state == 2:
            if self._inner is not None:
                if block:
                    self._inner.wait()
                elif not self._inner.test():
                    return False
            sync.arrive(self._seq + 1)
            self._state = 3
        if self._state == 3:
            if not self._arrived(self._seq + 1, block):
                return False
            self._gather()
            sync.arrive(self._seq + 2)
            self._state = 4
        return self._arrived(self._seq + 2, block)

    def _arrived(self, seq: int, block: bool) -> bool:
        sync = self._node.sync
        if block:
            sync.wait(seq, self._call)
            return True
        return sync.arrived(seq)

    def _publish(self) -> None:
        """Stage the input if it is not shared; write where input and reduced block lie."""
        node, src, dst = self._node, self._src, self._dst
        staging = self._staging
        if self._small:
            np.copyto(node.view(staging, node.small_slot(staging, node.li, self._parity), src.dtype, src.size), src)
            return
        inp = self._at_src
        if inp[0] < 0:  # stage what the peers read: every block but this rank's own, which it reads from src
            inp = (staging, node.big_slot(staging, node.li))
            view, lo, hi = node.view(*inp, src.dtype, src.size), *self._bounds[node.li:node.li + 2]
            np.copyto(view[:lo], src[:lo])
            np.copyto(view[hi:], src[hi:])
        res = self._at_dst
        self._res_is_dst = res[0] >= 0
        if not self._res_is_dst:
            res = inp if inp[0] == staging else (staging, node.big_slot(staging, node.li))
        self._res = res
        node.sync.publish(*inp, *res)

    def _reduce_all(self) -> None:
        """Small path: reduce every rank's staged input into ``dst``, in rank order (the same on every rank)."""
        node, dst, ufunc = self._node, self._dst, self._ufunc
        views = node.small_views(self._staging, self._parity, dst.dtype, dst.size)
        ufunc(views[0], views[1], out=dst)
        for v in views[2:]:
            ufunc(dst, v, out=dst)

    def _peer(self, local: int, words: tuple[int, int], count: int) -> np.ndarray:
        """Local rank ``local``'s published array (input: words 1-2, result: 3-4)."""
        node = self._node
        return node.view(node.sync.word(local, words[0]), node.sync.word(local, words[1]), self._src.dtype, count)

    def _reduce_block(self) -> None:
        """Reduce-scatter: block li from every rank's input into this rank's result, its own input first."""
        node, ufunc, n = self._node, self._ufunc, self._src.size
        lo, hi = self._bounds[node.li], self._bounds[node.li + 1]
        out = node.view(*self._res, self._src.dtype, n)[lo:hi]
        own = self._src[lo:hi]
        others = [self._peer(i, (1, 2), n)[lo:hi] for i in range(node.n) if i != node.li]
        if others:
            ufunc(own, others[0], out=out)
        elif out.ctypes.data != own.ctypes.data:
            np.copyto(out, own)
        for v in others[1:]:
            ufunc(out, v, out=out)
        if self._inter is not None and hi > lo:
            self._inner = self._inter(out)

    def _gather(self) -> None:
        """All-gather: copy every other block from its owner's result; this rank's own, if it lies elsewhere."""
        node, dst, n = self._node, self._dst.reshape(-1), self._src.size
        b = self._bounds
        for i in range(node.n):
            if i != node.li or not self._res_is_dst:
                np.copyto(dst[b[i]:b[i + 1]], self._peer(i, (3, 4), n)[b[i]:b[i + 1]])

    def _requests(self):
        return [], []

    def target(self) -> int:
        """The node barrier this call waits for now."""
        return self._seq + {3: 1, 4: 2}.get(self._state, 0)


class Shm:
    """The shared-memory all-reduce as an algorithm of a communicator that has a node group (``auto``)."""

    def __init__(self, comm):
        self.comm = comm

    def start(self, call, src, dst, ufunc, result):
        return ShmWork(call, self.comm.node, src, dst, ufunc, result)

    def run(self, call, src, dst, ufunc) -> None:
        """Blocking: the one-barrier path for small vectors, else the three-barrier one."""
        node = self.comm.node
        if src.nbytes <= node.small_bytes:
            node.small_allreduce(call, src, dst, ufunc)
        else:
            ShmWork(call, node, src, dst, ufunc, dst).wait()


class ShmCommunicator(P2PCommunicator):
    """All-reduce and barrier through shared memory among ranks that all share one node."""

    def __init__(self, transport, timeout: float = c.DEFAULT_TIMEOUT):
        super().__init__(transport, None, "shm", timeout)
        nodes = node_ids(self)
        if len(set(nodes)) > 1:
            raise ValueError(f"backend 'shm' needs every rank on one node, but the {self._size} ranks span "
                             f"{len(set(nodes))} nodes; use backend 'hier' (shared memory on each node, "
                             "messages between nodes)")
        self.node = NodeGroup(self, list(range(self._size)), self._begin("setup"))
        self._setup_done()

    def empty(self, shape, dtype=np.float32) -> np.ndarray:
        """A new array that the other ranks of this node can read in place (collective: same shape and dtype)."""
        return self.node.empty(self._begin("empty"), shape, dtype)

    def _allreduce_work(self, call, src, dst, ufunc, result):
        return ShmWork(call, self.node, src, dst, ufunc, result)

    def _blocking_path(self, src):
        """The one-barrier path for small vectors."""
        return self.node.small_allreduce if src.nbytes <= self.node.small_bytes else None

    def barrier(self) -> None:
        """Every rank announces its arrival in its control line, then waits for all the others'."""
        for work in tuple(self._active):  # node barriers count up in call order: finish earlier calls first
            work.wait()
        call = self._begin("barrier")
        seq = self.node.reserve(1)
        self.node.sync.arrive(seq)
        self.node.wait(call, seq)
