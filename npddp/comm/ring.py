"""Backend whose collectives are built by hand from MPI point-to-point calls, in ring and tree patterns.

All-reduce is a ring reduce-scatter followed by a ring all-gather over the blocks of
``np.array_split(buf.ravel(), size)``: each block is reduced at one place and then only
copied, so every rank ends with bit-identical results. Each ring step's block is cut into
segments, and a few receives stay in flight, so receiving the next segment overlaps reducing
this one; blocking ``allreduce`` is ``iallreduce`` followed by ``wait``.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from . import _common as c
from .calls import Overdue
from .p2p import P2PCommunicator, P2PWork

_PLAN_CACHE_SIZE = 64


class RingPlan:
    """Per-unit slices of a ring all-reduce on one rank; unit ``u`` is segment ``u % nseg`` of step ``u // nseg``.

    Step s sends block ``rank - s`` and receives block ``rank - s - 1`` (mod size), in both
    halves; ``scratch[u]`` is where reduce-scatter unit u lands: slot ``u % window``.
    """

    __slots__ = ("nseg", "nunits", "rs_units", "window", "send", "recv", "scratch", "scratch_elems")

    def __init__(self, n: int, size: int, rank: int, seg_elems: int, window: int):
        bounds = c.block_bounds(n, size).tolist()
        self.nseg = nseg = max(1, -(-(bounds[1] - bounds[0]) // seg_elems))  # block 0 is the largest
        self.rs_units = (size - 1) * nseg
        self.nunits = 2 * self.rs_units
        self.window = window = max(1, min(window, self.rs_units))
        self.send = [_segment(bounds, (rank - u // nseg) % size, u % nseg, nseg) for u in range(self.nunits)]
        self.recv = [_segment(bounds, (rank - u // nseg - 1) % size, u % nseg, nseg) for u in range(self.nunits)]
        slot = max(r.stop - r.start for r in self.recv)
        self.scratch = [slice((u % window) * slot, (u % window) * slot + r.stop - r.start)
                        for u, r in enumerate(self.recv[:self.rs_units])]
        self.scratch_elems = window * slot


def _segment(bounds: list[int], block: int, j: int, nseg: int) -> slice:
    """Slice of segment ``j`` of ``nseg`` of block ``block``."""
    lo, length = bounds[block], bounds[block + 1] - bounds[block]
    return slice(lo + length * j // nseg, lo + length * (j + 1) // nseg)


class RingAllreduce(P2PWork):
    """Ring all-reduce as a non-blocking state machine over Isend/Irecv.

    Unit u sends ``plan.send[u]`` to the right and receives ``plan.recv[u]`` from the left.
    Its send may start once unit ``u - nseg`` has been received (and, in the reduce-scatter
    half, reduced): that is the segment it forwards. At most ``window`` receives are in flight;
    reduce-scatter receives land in scratch and are reduced into ``dst``; all-gather receives
    land in ``dst`` directly, once the send that read that region has completed.
    """

    __slots__ = ("_comm", "_tag", "_left", "_right", "_src", "_dst", "_ufunc", "_plan", "_pool", "_raw",
                 "_scratch", "_nsent", "_nsent_done", "_nposted", "_ndone", "_sends", "_recvs")

    def __init__(self, call, rank, size, src, dst, ufunc, plan, pool, result):
        super().__init__(call, result)
        self._comm, self._tag = call.owner.comm, call.tag
        self._left, self._right = (rank - 1) % size, (rank + 1) % size
        self._src, self._dst, self._ufunc, self._plan, self._pool = src, dst, ufunc, plan, pool
        self._raw = pool.acquire(plan.scratch_elems * src.itemsize)
        self._scratch = np.frombuffer(self._raw, dtype=src.dtype, count=plan.scratch_elems)  # (window * slot,)
        self._nsent = self._nsent_done = self._nposted = self._ndone = 0
        self._sends: deque = deque()
        self._recvs: deque = deque()
        if self._advance(False):
            self._complete()

    def _sends_complete(self, k: int, block: bool) -> bool:
        """True once the first ``k`` sends have completed."""
        sends = self._sends
        while self._nsent_done < k:
            if block:
                self._call.wait(sends[0])
            elif not sends[0].Test():
                return False
            sends.popleft()
            self._nsent_done += 1
        return True

    def _advance(self, block):
        plan, comm, tag, src, dst = self._plan, self._comm, self._tag, self._src, self._dst
        nseg, nunits, rs_units, window = plan.nseg, plan.nunits, plan.rs_units, plan.window
        sends, recvs = self._sends, self._recvs
        nsent, nposted, ndone = self._nsent, self._nposted, self._ndone
        while True:
            stop = min(ndone + nseg, nunits)
            while nsent < stop:
                sends.append(comm.Isend((src if nsent < nseg else dst)[plan.send[nsent]], self._right, tag))
                nsent += 1
            stop = min(ndone + window, nunits)
            while nposted < stop:
                if nposted < rs_units:
                    target = self._scratch[plan.scratch[nposted]]
                else:  # overwrites what the reduce-scatter send of unit nposted - rs_units read
                    v = nposted - rs_units
                    if v >= nsent or not self._sends_complete(v + 1, block):
                        break
                    target = dst[plan.recv[nposted]]
                recvs.append(comm.Irecv(target, self._left, tag))
                nposted += 1
            self._nsent, self._nposted, self._ndone = nsent, nposted, ndone
            if ndone == nunits:
                return self._sends_complete(nunits, block)
            if not recvs:
                return False
            if block:
                self._call.wait(recvs[0])
            elif not recvs[0].Test():
                return False
            recvs.popleft()
            if ndone < rs_units:
                region = dst[plan.recv[ndone]]
                self._ufunc(region if src is dst else src[plan.recv[ndone]],
                            self._scratch[plan.scratch[ndone]], out=region)
            ndone += 1

    def _requests(self):
        return [(r, self._left) for r in self._recvs], [(r, self._right) for r in self._sends]

    def _release(self):
        self._scratch = None
        self._pool.release(self._raw)
        self._raw = None


class RingCommunicator(P2PCommunicator):
    """Collectives over MPI point-to-point calls: ring all-reduce, tree/chain broadcast, dissemination barrier."""

    name = "ring"
    #: All-reduce ring steps (and chain broadcasts) are cut into segments of at most this many bytes.
    segment_bytes = 1 << 20
    #: All-reduce receives kept in flight (scratch slots of one segment each).
    window = 2
    #: Broadcasts of at least this many bytes use a pipelined chain instead of a binomial tree.
    chain_bytes = 1 << 20

    def __init__(self, mpi_comm=None, timeout: float = c.DEFAULT_TIMEOUT):
        super().__init__(mpi_comm, timeout)
        self._plans: dict[tuple[int, int, int], RingPlan] = {}
        self._empty = np.empty(0, dtype=np.uint8)

    def _plan(self, n: int, itemsize: int) -> RingPlan:
        """The (cached) ring plan for ``n`` elements of ``itemsize`` bytes."""
        key = (n, max(1, self.segment_bytes // itemsize), self.window)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= _PLAN_CACHE_SIZE:
                del self._plans[next(iter(self._plans))]
            plan = self._plans[key] = RingPlan(n, self._size, self._rank, *key[1:])
        return plan

    def barrier(self) -> None:
        """Dissemination barrier: in round k, signal rank + 2**k and hear from rank - 2**k."""
        call = self._begin("barrier")
        empty, dist, size = self._empty, 1, self._size
        while dist < size:
            self._transfer(call, [(empty, (self._rank - dist) % size)], [(empty, (self._rank + dist) % size)])
            dist <<= 1

    def broadcast(self, buf, root=0):
        """Binomial tree from root; a pipelined chain of segments for buffers of ``chain_bytes`` or more."""
        c.check_buffer(buf)
        root = c.check_rank(root, self._size)
        call = self._begin("broadcast")
        if buf.size == 0 or self._size == 1:
            return buf
        if buf.nbytes >= self.chain_bytes and self._size > 2:
            self._chain_broadcast(call, buf.reshape(-1), root)
        else:
            self._tree_broadcast(call, buf, root)
        return buf

    def _tree_broadcast(self, call, buf, root):
        """Receive from the parent (clear lowest set bit of the relative rank), then send to children."""
        size, vrank = self._size, (self._rank - root) % self._size
        mask = 1
        while mask < size:
            if vrank & mask:
                self._transfer(call, recvs=[(buf, (vrank - mask + root) % size)])
                break
            mask <<= 1
        children = []
        mask >>= 1
        while mask:
            if vrank + mask < size:
                children.append((buf, (vrank + mask + root) % size))
            mask >>= 1
        if children:
            self._transfer(call, sends=children)

    def _chain_broadcast(self, call, flat, root):
        """Root -> root+1 -> ...: each rank forwards a segment as soon as it has arrived."""
        size, vrank, tag = self._size, (self._rank - root) % self._size, call.tag
        seg = max(1, self.segment_bytes // flat.itemsize)
        parts = [flat[i:i + seg] for i in range(0, flat.size, seg)]
        left, right = (self._rank - 1) % size, (self._rank + 1) % size
        if vrank == 0:
            self._transfer(call, sends=[(p, right) for p in parts])
            return
        recvs = [(self.comm.Irecv(p, left, tag), left) for p in parts]
        sends = []
        try:
            for p, (req, _) in zip(parts, recvs):
                call.wait(req)
                if vrank < size - 1:
                    sends.append((self.comm.Isend(p, right, tag), right))
            for req, _ in sends:
                call.wait(req)
        except Overdue:
            raise self.give_up(call, recvs, sends, parts) from None

    def _allreduce_work(self, call, src, dst, ufunc, result):
        """Start the ring all-reduce state machine."""
        plan = self._plan(src.size, src.itemsize)
        return RingAllreduce(call, self._rank, self._size, src, dst, ufunc, plan, self.scratch, result)

    def reduce_scatter(self, buf, op="sum"):
        """Ring reduce-scatter: step s forwards the partial of block rank-s-1, so rank r ends with block r."""
        ufunc = c.check_op(op)
        c.check_buffer(buf, writable=False)
        call = self._begin("reduce_scatter")
        flat = buf.reshape(-1)
        size, rank = self._size, self._rank
        bounds = c.block_bounds(flat.size, size).tolist()
        out = np.empty(bounds[rank + 1] - bounds[rank], dtype=buf.dtype)
        if size == 1:
            np.copyto(out, flat)
            return out
        if flat.size == 0:
            return out
        left, right = (rank - 1) % size, (rank + 1) % size
        slot = bounds[1] - bounds[0]
        raw = self.scratch.acquire(2 * slot * flat.itemsize)
        scratch = np.frombuffer(raw, dtype=buf.dtype, count=2 * slot).reshape(2, slot)  # (2, largest block)
        sending = flat[bounds[(rank - 1) % size]:bounds[(rank - 1) % size + 1]]
        for step in range(size - 1):
            b = (rank - step - 2) % size
            local = flat[bounds[b]:bounds[b + 1]]
            got = scratch[step % 2, :local.size]
            self._transfer(call, [(got, left)], [(sending, right)])
            sending = ufunc(local, got, out=out if step == size - 2 else got)
        self.scratch.release(raw)
        return out

    def allgather(self, buf):
        """Ring all-gather: step s forwards block rank-s and receives block rank-s-1."""
        c.check_buffer(buf, writable=False)
        call = self._begin("allgather")
        size, rank = self._size, self._rank
        out = np.empty((size, *buf.shape), dtype=buf.dtype)
        rows = out.reshape(size, -1)  # (size, buf.size)
        rows[rank] = buf.reshape(-1)
        if buf.size:
            left, right = (rank - 1) % size, (rank + 1) % size
            for step in range(size - 1):
                self._transfer(call, [(rows[(rank - step - 1) % size], left)], [(rows[(rank - step) % size], right)])
        return out
