"""The shared segments of one node's ranks: control lines, staging areas, shared arrays; where data lies.

Where each rank's data lies. A buffer made by :meth:`NodeSegments.empty` already lives in shared
memory, so peers read it in place (DDP allocates its gradient buckets this way, so gradients
are born where the others can read them). Any other buffer is first copied into the rank's slot
of a shared staging area. Each call, a rank publishes in its control line where its input lies
and where its result will lie (:mod:`npddp.comm.node.memory`).
"""

from __future__ import annotations

import numpy as np

from npddp.comm.node.memory import LINE, NodeSync, create_segment

_ALIGN = 4096
INPUT, RESULT = (1, 2), (3, 4)  # control-line words: (segment index, byte offset) of a rank's input, result
#: Segment indices in those words that are no segment: the buffer is staged (placement only, never
#: published), or private and reached by single-copy transfers (the second word: its address).
STAGED, PRIVATE = -1, -2


def aligned(nbytes: int) -> int:
    return -(-max(nbytes, 1) // _ALIGN) * _ALIGN


class NodeSegments:
    """The shared memory of this node's ranks within a communicator: control lines, staging slots, shared arrays.

    A staging area holds, per rank, two small slots of ``small_bytes`` (set by the subclass) and one large one."""

    def __init__(self, comm, local: list[int], call):
        self.comm, self.local = comm, local
        self.li, self.n = local.index(comm.rank), len(local)
        ctrl = create_segment(comm, local, self.n * LINE * 8, call)
        self.sync = NodeSync(ctrl.array.view(np.int64), self.li, local)
        self.segments = [ctrl]   # every segment, by the index published in control lines; never reordered
        self.arrays: list[int] = []  # indices of the segments made by empty()
        self.slots: dict[int, int] = {}  # staging segment index -> bytes per rank
        self._views: dict = {}
        self.staging_index, self.big = -1, 0
        self._make_staging(call, 0)

    def _make_staging(self, call, big: int) -> None:
        """Make a staging area: per rank two small slots and ``big`` bytes for one large vector.

        A new area gets a new index: calls made before it keep using (and publishing) the old one.
        """
        self.big = aligned(big) if big else 0
        slot = 2 * self.small_bytes + self.big
        self.segments.append(create_segment(self.comm, self.local, slot * self.n, call))
        self.staging_index = len(self.segments) - 1
        self.slots[self.staging_index] = slot

    def ensure_staging(self, call, nbytes: int) -> None:
        """Grow the staging area to hold ``nbytes`` per rank (every rank of the node grows at the same call).

        Growing is an exchange among the node's ranks that waits for all of them, so the calls
        still in flight are finished first: a peer waiting on one of them needs this rank's part.
        """
        if nbytes > self.big:
            for work in tuple(call.owner._active):
                work.wait()
            self._make_staging(call, max(nbytes, 2 * self.big))

    def empty(self, call, shape, dtype) -> np.ndarray:
        """This rank's part of a new segment holding one such array per rank of the node."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        each = aligned(nbytes)
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

    def view(self, index: int, offset: int, dtype, count: int) -> np.ndarray:
        """``count`` elements of ``dtype`` at ``offset`` of segment ``index``."""
        return self.segments[index].array[offset:offset + count * dtype.itemsize].view(dtype)

    def published(self, local: int, words: tuple[int, int], dtype, count: int) -> np.ndarray:
        """Local rank ``local``'s published input (``INPUT``) or result (``RESULT``): ``count`` elements."""
        word = self.sync.word
        return self.view(word(local, words[0]), word(local, words[1]), dtype, count)

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

    def small_slot(self, staging: int, local: int, parity: int) -> int:
        """Byte offset of small slot ``parity`` of local rank ``local`` in staging segment ``staging``."""
        return local * self.slots[staging] + parity * self.small_bytes

    def big_slot(self, staging: int, local: int) -> int:
        """Byte offset of the large staging area of local rank ``local`` in staging segment ``staging``."""
        return local * self.slots[staging] + 2 * self.small_bytes
