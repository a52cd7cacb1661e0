"""``shm``: all-reduce among the ranks of one node through shared memory, with no message on the data path.

The algorithm is described in :mod:`npddp.comm.node.allreduce` and where data lies in
:mod:`npddp.comm.node.segments`; this module runs its steps for calls that overlap (``iallreduce``)
and offers it as a communicator.

Calls complete in the order they started (``iallreduce`` handles are progressed oldest first),
which is what lets the barriers of overlapping calls count up one sequence.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from npddp.comm import checks as c
from npddp.comm.communicators.p2p import P2PCommunicator
from npddp.comm.engine.work import P2PWork
from npddp.comm.node.allreduce import NodeGroup
from npddp.comm.node.memory import node_ids
from npddp.comm.node.segments import STAGED

__all__ = ["Shm", "ShmCommunicator", "ShmWork", "node_group"]


class ShmWork(P2PWork):
    """One shared-memory all-reduce in progress; ``inter`` (hier) all-reduces each node's block across nodes."""

    __slots__ = ("_node", "_src", "_dst", "_ufunc", "_inter", "_inner", "_seq", "_state", "_small", "_parity",
                 "_bounds", "_staging", "_at_src", "_at_dst", "_block", "_word", "_scale")

    def __init__(self, call, node: NodeGroup, src, dst, ufunc, result, inter=None):
        self._small = inter is None and src.nbytes <= node.small_bytes
        if not self._small:  # (may finish the calls in flight: before this one joins them)
            self._at_src, self._at_dst = node.places(call, src, dst)
        super().__init__(call, result)
        self._node, self._src, self._dst, self._ufunc, self._inter = node, src, dst, ufunc, inter
        self._inner = self._block = None
        self._staging = node.staging_index  # this call's staging, even if a later call grows a new one
        self._seq = node.reserve(1 if self._small else 2)
        self._parity = node.next_parity() if self._small else -1
        self._bounds = node.bounds(src.size)
        self._word = node.size_word()
        self._state = 0
        # op avg on the large path: each reduced piece is scaled before it is pushed (across nodes:
        # the block, once the nodes have summed it); the small path scales its result at completion
        self._scale = 0.0 if self._small else call.take_scale()
        self._start()

    def _advance(self, block):
        node, sync = self._node, self._node.sync
        if self._state == 0:
            if self._active[0] is not self:  # an earlier call on this node comes first
                return False
            if self._small:
                node.stage_small(self._staging, self._parity, self._src)
            else:
                node.publish(self._src, self._at_src, self._at_dst, self._staging, self._bounds)
            node.publish_size(self._word, node.size_value(self._call, self._src.nbytes))
            sync.arrive(self._seq)
            self._state = 1
        if self._state == 1:
            if not self._arrived(self._seq, block):
                return False
            node.check_sizes(self._call, self._word, node.size_value(self._call, self._src.nbytes))
            if self._small:
                node.reduce_small(self._staging, self._parity, self._dst, self._ufunc)
                return True
            self._block = node.reduce_block(self._src, self._ufunc, self._bounds, push=self._inter is None,
                                            scale=self._scale if self._inter is None else 0.0, dst=self._dst)
            if self._inter is not None and self._block.size:
                self._inner = self._inter(self._block)
            self._state = 2
        if self._state == 2:
            if self._inner is not None:  # hier: push the block once the nodes have all-reduced it
                if block:
                    self._inner.wait()
                elif not self._inner.test():
                    return False
                if self._scale:
                    np.multiply(self._block, self._scale, out=self._block)
                node.push_block(self._block, self._bounds[node.li], self._src.size)
            sync.arrive(self._seq + 1)
            self._state = 3
        if not self._arrived(self._seq + 1, block):
            return False
        if self._at_dst[0] == STAGED:  # the result was staged
            node.finish(self._dst, self._bounds)
        return True

    def _arrived(self, seq: int, block: bool) -> bool:
        if block:
            self._node.sync.wait(seq, self._call, partial(self._node.watch, self._call, seq))
            return True
        return self._node.sync.poll(seq)   # a dead peer is named even when only tested (progress thread)

    def _requests(self):
        return [], []

    def target(self) -> int:
        """The node barrier this call waits for now."""
        return self._seq + (self._state == 3)


class Shm:
    """The shared-memory all-reduce as an algorithm of a communicator that has a node group (``auto``)."""

    def __init__(self, ctx):
        if ctx.node is None:
            raise ValueError("the shm algorithm needs a communicator whose ranks share one node")
        self.node = ctx.node

    def start(self, call, src, dst, ufunc, result):
        return ShmWork(call, self.node, src, dst, ufunc, result)

    def run(self, call, src, dst, ufunc) -> None:
        """Blocking: the one-barrier path for small vectors, else the two-barrier one."""
        self.node.allreduce(call, src, dst, ufunc)


class ShmCommunicator(P2PCommunicator):
    """All-reduce and barrier through shared memory among ranks that all share one node."""

    def __init__(self, transport, timeout: float = c.DEFAULT_TIMEOUT, name: str = "shm", algorithms=None):
        super().__init__(transport, None, name, timeout, algorithms)
        self.node = self.context.node = NodeGroup(self, self._node_ranks(node_ids(self)), self._begin("setup"))
        self._setup_done()

    def _child(self, transport):
        """``shm`` over a split's group (ValueError, on every member, unless they share one node)."""
        return ShmCommunicator(transport, self._timeout, algorithms=self.choice.chosen)

    def _node_ranks(self, nodes: list) -> list[int]:
        """The ranks sharing this rank's node (here: all, else ValueError), given every rank's node id."""
        if len(set(nodes)) > 1:
            raise ValueError(f"backend 'shm' needs every rank on one node, but the {self._size} ranks span "
                             f"{len(set(nodes))} nodes; use backend 'hier' (shared memory on each node, "
                             "messages between nodes)")
        return list(range(self._size))

    shared_memory = True

    def empty(self, shape, dtype=np.float32) -> np.ndarray:
        """A new array that the other ranks of this node can read in place (collective: same shape and dtype)."""
        return self.node.empty(self._begin("empty"), shape, dtype)

    def _allreduce_work(self, call, src, dst, ufunc, result):
        return ShmWork(call, self.node, src, dst, ufunc, result)

    def _blocking_path(self, src):
        """Run a blocking call start to finish."""
        return self.node.allreduce

    def barrier(self) -> None:
        """Every rank announces its arrival (and the barrier's size word) in its control line, then waits for all the
        others' and compares their words."""
        for work in tuple(self._active):  # node barriers count up in call order: finish earlier calls first
            work.wait()
        self.node.agree_on_size(self._begin("barrier"), 0)   # a size word of its own: a peer in an all-reduce raises


def node_group(comm, call) -> NodeGroup | None:
    """Shared memory among all of ``comm``'s ranks, or None when they do not share one node."""
    if comm.size < 2 or len(set(node_ids(comm))) > 1:
        return None
    return NodeGroup(comm, list(range(comm.size)), call)
