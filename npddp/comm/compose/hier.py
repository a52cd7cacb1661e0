"""``hier``: the all-reduce for many nodes: shared memory on each node, messages between nodes.

1. On each node, a shared-memory reduce-scatter (:mod:`npddp.comm.node.shm`): local rank i holds
   block i of its node's sum.
2. Between nodes, local rank i of every node all-reduces its block with the others of the same
   local index, over the transport, with the communicator ``inter`` builds (``auto`` as
   :mod:`npddp.comm.backends` builds it: recursive doubling for small blocks, the ring or
   Rabenseifner's for large ones).
3. On each node, local rank i writes the block into every peer's result (shared memory).

Only ``1/L`` of the vector crosses the network per rank (``L`` ranks per node), and on the node
nothing is copied through a network stack. Every node needs the same number of ranks.
``NPDDP_RANKS_PER_NODE=K`` pretends that one machine is several nodes of ``K`` ranks, which is how
the tests exercise the path between nodes on one machine.
"""

from __future__ import annotations

import weakref

from npddp.comm import checks as c
from npddp.comm.communicators.p2p import P2PCommunicator
from npddp.comm.node.shm import ShmCommunicator, ShmWork


def even_nodes(nodes: list) -> bool:
    """True when every node holds the same number of ranks (``nodes``: each rank's node id)."""
    return len({nodes.count(n) for n in set(nodes)}) == 1


def across_nodes(parent, nodes: list, inter):
    """The communicator joining local rank i of every node (collective): ``inter(split of parent's transport)``.

    It and ``parent`` share their aborts (``parent`` on the child): a mismatch one node's ranks find
    at their node barrier reaches the ranks of the other nodes, which wait across nodes, and one found
    across nodes reaches the node's ranks waiting at its barrier."""
    index = [sum(1 for q in range(r) if nodes[q] == nodes[r]) for r in range(len(nodes))]  # local index
    child = inter(parent.transport.split(index))
    # child rank -> parent's; a weak reference, so no cycle keeps either alive past its last use (their shared
    # memory and contexts go when their users drop them, on every rank alike)
    child.parent = (weakref.ref(parent), [r for r in range(len(nodes)) if index[r] == index[parent.rank]])
    return child


class Hier:
    """hier's all-reduce as an algorithm (``start``): ``node``'s shared memory, each block across nodes by ``inter``."""

    def __init__(self, node, inter):
        self.node, self.inter = node, inter

    def start(self, call, src, dst, ufunc, result):
        """The all-reduce in progress (a ShmWork whose blocks cross nodes)."""
        inter = None
        if self.inter is not None:
            op = next(name for name, f in c.OPS.items() if f is ufunc)
            inter = lambda block: self.inter.iallreduce(block, op)  # noqa: E731
        return ShmWork(call, self.node, src, dst, ufunc, result, inter)


class HierCommunicator(ShmCommunicator):
    """Shared memory within nodes, the ``inter`` algorithm across them."""

    def __init__(self, transport, inter, timeout: float = c.DEFAULT_TIMEOUT):
        """``inter(transport)``: the communicator across nodes over the transport joining local rank i of every node."""
        super().__init__(transport, timeout, "hier")
        self.nodes = len(set(self._nodes))
        self.inter = across_nodes(self, self._nodes, inter) if self.nodes > 1 else None
        self.path = Hier(self.node, self.inter)
        self._inter = inter

    def _child(self, transport):
        """``hier`` over a split's group, its node layout re-derived (ValueError, on every member, unless even)."""
        return HierCommunicator(transport, self._inter, self._timeout)

    def _node_ranks(self, nodes: list) -> list[int]:
        """The ranks on this rank's node; ValueError unless every node has as many ranks."""
        if not even_nodes(nodes):
            counts = sorted({nodes.count(n) for n in set(nodes)})
            raise ValueError(f"backend 'hier' needs the same number of ranks on every node; nodes have "
                             f"{', '.join(map(str, counts))} ranks (ranks per node: {[nodes.count(n) for n in sorted(set(nodes))]})")
        self._nodes = nodes
        return [r for r in range(self._size) if nodes[r] == nodes[self._rank]]

    def _sub_communicators(self) -> tuple:
        """The communicator across nodes, which checks its calls as this one does."""
        return () if self.inter is None else (self.inter,)

    def _allreduce_work(self, call, src, dst, ufunc, result):
        return self.path.start(call, src, dst, ufunc, result)

    def _blocking_path(self, src):
        """One node only takes the blocking shared-memory paths (across nodes every block also crosses the network)."""
        return super()._blocking_path(src) if self.inter is None else None

    def barrier(self) -> None:
        """Dissemination barrier over the transport."""
        for work in tuple(self._active):
            work.wait()
        P2PCommunicator.barrier(self)
