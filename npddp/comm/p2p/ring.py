"""Ring all-reduce: a ring reduce-scatter, then a ring all-gather, as a non-blocking state machine.

The vector is cut into ``size`` blocks as ``np.array_split`` cuts it. In step s of the
reduce-scatter, rank r sends its partial sum of block ``r - s`` to its right neighbour and
receives the partial of block ``r - s - 1`` from its left, which it adds to its own. After
``size - 1`` steps rank r holds block ``r + 1`` fully reduced. The all-gather then passes the
reduced blocks around the ring, each rank copying what it receives: every element is reduced
at exactly one place and only copied afterwards, so every rank ends with the same bits.
Bandwidth-optimal (each rank sends ``2 (N-1)/N`` of the vector) but ``2 (N-1)`` steps long.

The state machine. Each step's block is cut into ``nseg`` segments; a *unit* is one segment of
one step, numbered ``u = step * nseg + segment`` over both halves (``2 (N-1) nseg`` units).
Four counters describe the whole state:

* ``nsent``: sends posted. Unit u's send forwards what unit ``u - nseg`` received (reduced,
  in the first half), so it may start once ``ndone > u - nseg``.
* ``nposted``: receives posted, at most ``window`` ahead of ``ndone``. Reduce-scatter receives
  land in a scratch slot; all-gather receives land in the result directly, but only once the
  send that read that region has completed.
* ``ndone``: receives completed (and, in the first half, reduced into the result).
* ``nsent_done``: sends completed, in order.

``_advance`` posts everything the counters allow, then completes the oldest receive, and
repeats; non-blocking, it returns as soon as that receive has not arrived yet.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from npddp.comm import checks as c
from npddp.comm.p2p.engine import P2PWork

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


class Ring:
    """The ring all-reduce algorithm of one communicator: cached plans, one state machine per call."""

    def __init__(self, comm):
        self.comm = comm
        self._plans: dict[tuple[int, int, int], RingPlan] = {}

    def plan(self, n: int, itemsize: int) -> RingPlan:
        """The (cached) plan for ``n`` elements of ``itemsize`` bytes at the communicator's segment and window."""
        comm = self.comm
        key = (n, max(1, comm.segment_bytes // itemsize), comm.window)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= _PLAN_CACHE_SIZE:
                del self._plans[next(iter(self._plans))]
            plan = self._plans[key] = RingPlan(n, comm.size, comm.rank, *key[1:])
        return plan

    def start(self, call, src, dst, ufunc, result):
        """Start the state machine for flat ``src`` -> flat ``dst``."""
        return RingWork(call, src, dst, ufunc, self.plan(src.size, src.itemsize), result)


class RingWork(P2PWork):
    """One ring all-reduce in progress (see the module docstring for its four counters)."""

    __slots__ = ("_transport", "_tag", "_left", "_right", "_src", "_dst", "_ufunc", "_plan", "_pool", "_raw",
                 "_scratch", "_nsent", "_nsent_done", "_nposted", "_ndone", "_sends", "_recvs")

    def __init__(self, call, src, dst, ufunc, plan, result):
        super().__init__(call, result)
        comm = call.owner
        self._transport, self._tag = comm.transport, call.tag
        self._left, self._right = (comm.rank - 1) % comm.size, (comm.rank + 1) % comm.size
        self._src, self._dst, self._ufunc, self._plan, self._pool = src, dst, ufunc, plan, comm.scratch
        self._raw = self._pool.acquire(plan.scratch_elems * src.itemsize)
        self._scratch = np.frombuffer(self._raw, dtype=src.dtype, count=plan.scratch_elems)  # (window * slot,)
        self._nsent = self._nsent_done = self._nposted = self._ndone = 0
        self._sends: deque = deque()
        self._recvs: deque = deque()
        self._start()

    def _sends_complete(self, k: int, block: bool) -> bool:
        """True once the first ``k`` sends have completed."""
        sends = self._sends
        while self._nsent_done < k:
            if block:
                self._call.wait(sends[0])
            elif not sends[0].test():
                return False
            sends.popleft()
            self._nsent_done += 1
        return True

    def _advance(self, block):
        plan, transport, tag, src, dst = self._plan, self._transport, self._tag, self._src, self._dst
        nseg, nunits, rs_units, window = plan.nseg, plan.nunits, plan.rs_units, plan.window
        sends, recvs = self._sends, self._recvs
        nsent, nposted, ndone = self._nsent, self._nposted, self._ndone
        while True:
            stop = min(ndone + nseg, nunits)
            while nsent < stop:  # forward what has arrived (the first nseg units send our own data)
                sends.append(transport.isend((src if nsent < nseg else dst)[plan.send[nsent]], self._right, tag))
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
                recvs.append(transport.irecv(target, self._left, tag))
                nposted += 1
            self._nsent, self._nposted, self._ndone = nsent, nposted, ndone
            if ndone == nunits:
                return self._sends_complete(nunits, block)
            if not recvs:
                return False
            if block:
                self._call.wait(recvs[0])
            elif not recvs[0].test():
                return False
            recvs.popleft()
            if ndone < rs_units:  # reduce the arrived partial into our block
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
