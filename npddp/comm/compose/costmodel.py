"""Prices of the all-reduce algorithms by name under the one cost model (:mod:`npddp.comm.engine.cost`):
on one node, across nodes (a network), and hier's composition; the table ``auto`` picks from.

MPI's own all-reduce (:data:`~npddp.comm.algorithms.registry.LIBRARY`, a candidate over the MPI transport) is priced by a
rule. Its default selection runs schedules npddp has too (MPICH: recursive doubling for short vectors,
reduce-scatter then all-gather, i.e. Rabenseifner's, for long ones), moving the same bytes in the same steps,
so it costs the cheaper of those two at the same constants: a tie, which the hand-written algorithm keeps
(the tuner measures the difference). Where every rank shares one node the other candidate is ``shm``, and
there the libraries differ more than any model of their messages says (how each spins, copies and
reduces through its own shared memory): MPI's own goes first up to a size measured per library
(:data:`LIBRARY_NODE_BYTES`, keyed by :attr:`npddp.util.mpilibs.MPILibrary.name`), ``shm`` beyond."""

from __future__ import annotations

from npddp.comm.engine.call import CHUNK_BYTES
from npddp.comm.engine.cost import MODEL, NETWORK, Cost
from npddp.comm.algorithms.registry import LIBRARY, algorithm, names

#: Built-in algorithms ``auto`` chooses among: those registered with ``auto=True`` (naive, the baseline to beat,
#: is not); when every rank shares one node, ``shm`` instead (:func:`node_table`), and over MPI, MPI's own too.
CANDIDATES = names(builtin=True, auto=True)
#: Algorithms whose large messages go out as pipelined chunks, sending and receiving at once.
PIPELINED = ("ring",)
#: The schedules MPI's default selection chooses between (its price: the cheaper one).
LIBRARY_SCHEDULES = ("rd", "rabenseifner")
#: On one node, MPI's own all-reduce goes first up to this many bytes, ``shm`` beyond, per MPI library (its
#: :attr:`~npddp.util.mpilibs.MPILibrary.name`; another library: 0): where, at N = 2 on ordinary arrays,
#: ``auto``'s path to MPI's own (a node barrier, then MPI's blocking call) stops beating ``shm``; 0 for each, as
#: measured so far (docs/results/2026-12-02-auto-and-mpi.md).
LIBRARY_NODE_BYTES = {"MPICH": 0, "Open MPI": 0, "Intel MPI": 0}


def candidates() -> tuple:
    """:data:`CANDIDATES` and the registered algorithms ``auto`` may pick (those that declare a cost, by default)."""
    return names(auto=True)


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


def library_time(nbytes: float, size: int, price) -> float:
    """Seconds of MPI's own all-reduce by the rule above: the cheaper of its schedules by ``price(name, nbytes)``."""
    return min(price(a, nbytes) for a in LIBRARY_SCHEDULES)


def node_table(size: int, library: str | None = None) -> list:
    """``[[max_bytes, algorithm], ...]`` when every rank shares one node: ``shm``, after MPI's own all-reduce up to
    :data:`LIBRARY_NODE_BYTES` of ``library`` (the MPI library's name, where the transport is MPI; None: none)."""
    bound = LIBRARY_NODE_BYTES.get(library, 0) if library and size > 1 else 0
    return [[bound, LIBRARY], [None, "shm"]] if bound > 0 else [[None, "shm"]]


def _cheapest(names, price) -> list:
    """``[[max_bytes, algorithm], ...]``: the first of ``names`` cheapest by ``price(name, nbytes)`` at each size."""
    steps: list = []
    for nbytes in _SIZES:
        best = min(names, key=lambda a: price(a, nbytes))
        if steps and steps[-1][1] == best:
            steps[-1][0] = nbytes
        else:
            steps.append([nbytes, best])
    steps[-1][0] = None
    return steps


def model_table(transport: str, size: int, chunk_bytes: int = CHUNK_BYTES, across_nodes: bool = False,
                per_node: int = 1, library: bool = False) -> list:
    """``[[max_bytes, algorithm], ...]`` from the cost model: the cheapest candidate at each size.

    ``across_nodes``: the ranks span nodes, so :func:`network_time` prices every candidate, whatever the transport;
    ``per_node`` > 1 (as many ranks on every node): ``hier`` is a candidate too, and flat algorithms other than the
    ring have a node's ranks cross its link at once. ``library``: MPI's own all-reduce is a candidate (listed last,
    so a tie goes to the hand-written algorithm).
    """
    alpha, beta, gamma = MODEL.get(transport, MODEL["mpi"])

    def price(a: str, nbytes: int) -> float:
        if a == "hier":
            return hier_time(nbytes, size, per_node, chunk_bytes)
        if a == LIBRARY:
            return library_time(nbytes, size, price)
        if across_nodes:
            shared = per_node if a not in PIPELINED else 1  # ranks of one node sharing its link in the same round
            return network_time(a, nbytes * shared, size, chunk_bytes)
        return predict(a, nbytes, size, alpha, beta, gamma, chunk_bytes)

    names = (*candidates(), *(("hier",) if across_nodes and per_node > 1 else ()), *((LIBRARY,) if library else ()))
    return _cheapest(names, price)
