"""Prices of the all-reduce algorithms by name under the one cost model (:mod:`npddp.comm.engine.cost`):
on one node, across nodes (a network), and hier's composition; the table ``auto`` picks from."""

from __future__ import annotations

from npddp.comm.engine.call import CHUNK_BYTES
from npddp.comm.engine.cost import MODEL, NETWORK, Cost
from npddp.comm.registry import algorithm, costed

#: Algorithms ``auto`` chooses among (naive is the baseline to beat, never the best); when every
#: rank shares one node, ``shm`` too, and the model then takes it at every size.
CANDIDATES = ("rd", "rabenseifner", "ring", "tree")
#: Algorithms whose large messages go out as pipelined chunks, sending and receiving at once.
PIPELINED = ("ring",)


def candidates() -> tuple:
    """:data:`CANDIDATES` and the registered algorithms that declare a cost."""
    return (*CANDIDATES, *costed())


_SIZES = [1 << k for k in range(41)]  # sizes the model is evaluated at to cut its table


def predict(name: str, nbytes: float, size: int, alpha: float, beta: float, gamma: float,
            chunk_bytes: int = CHUNK_BYTES) -> float:
    """Seconds an all-reduce of ``nbytes`` on ``size`` ranks takes by the algorithm's own cost description."""
    if size == 1:
        return 0.0
    return algorithm(name).cost(nbytes, size, chunk_bytes).time(alpha, beta, gamma)


def network_time(name: str, nbytes: float, size: int, chunk_bytes: int = CHUNK_BYTES) -> float:
    """Seconds across nodes by :data:`NETWORK`: a non-pipelined algorithm's bytes count twice beyond one chunk."""
    if size == 1:
        return 0.0
    cost = algorithm(name).cost(nbytes, size, chunk_bytes)
    duplex = 1 if name in PIPELINED or nbytes <= chunk_bytes else 2
    return cost._replace(sent=duplex * cost.sent).time(*NETWORK)


def hier_time(nbytes: float, size: int, per_node: int, chunk_bytes: int = CHUNK_BYTES) -> float:
    """Seconds of hier's composition across nodes: a node's ranks send their blocks at once, so the best
    algorithm across the ``size / per_node`` nodes moves the whole vector through each node's link, plus the
    node's shared-memory reduce-scatter and all-gather (two barriers, the vector reduced and copied once)."""
    nodes = size // per_node
    node = Cost(steps=2, sent=nbytes, reduced=nbytes).time(*MODEL["mpi"])
    return min(network_time(a, nbytes, nodes, chunk_bytes) for a in CANDIDATES) + node


def model_table(transport: str, size: int, chunk_bytes: int = CHUNK_BYTES, across_nodes: bool = False,
                per_node: int = 1) -> list:
    """``[[max_bytes, algorithm], ...]`` from the cost model: the cheapest candidate at each size.

    ``across_nodes``: the ranks span nodes, so :func:`network_time` prices every candidate, whatever the transport;
    ``per_node`` > 1 (as many ranks on every node): ``hier`` is a candidate too, and flat algorithms other than the
    ring have a node's ranks cross its link at once.
    """
    alpha, beta, gamma = MODEL.get(transport, MODEL["mpi"])

    def price(a: str, nbytes: int) -> float:
        if a == "hier":
            return hier_time(nbytes, size, per_node, chunk_bytes)
        if across_nodes:
            shared = per_node if a not in PIPELINED else 1  # ranks of one node sharing its link in the same round
            return network_time(a, nbytes * shared, size, chunk_bytes)
        return predict(a, nbytes, size, alpha, beta, gamma, chunk_bytes)

    names = (*candidates(), "hier") if across_nodes and per_node > 1 else candidates()
    steps: list = []
    for nbytes in _SIZES:
        best = min(names, key=lambda a: price(a, nbytes))
        if steps and steps[-1][1] == best:
            steps[-1][0] = nbytes
        else:
            steps.append([nbytes, best])
    steps[-1][0] = None
    return steps
