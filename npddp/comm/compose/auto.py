"""``auto``: the all-reduce algorithm for each call chosen from (message bytes, world size, dtype).

The choice comes from a table of size thresholds: below the first threshold one algorithm,
then the next, and so on. The default table is the alpha-beta-gamma cost model of each
algorithm (its ``cost``, read by :func:`~npddp.comm.compose.costmodel.predict`) with constants measured on the machine these defaults were
taken on; ``python -m npddp.tune`` measures every algorithm on the running job and writes a
table for exactly that job (transport, world size), which ``auto`` loads from
``create("auto", tuning=PATH)`` or ``NPDDP_TUNING=PATH``. A missing, corrupt or mismatched
table falls back to the model with one warning. Rank 0 reads the file and broadcasts its bytes,
so every rank picks the same algorithm for the same call.

Where the ranks are: on one node ``shm`` is the candidate at every size; across nodes a network
model prices the candidates (:func:`~npddp.comm.compose.costmodel.network_time`), and when every node holds as many ranks,
more than one, hier's composition joins them (:func:`~npddp.comm.compose.costmodel.hier_time`: shared memory on the node, the
best algorithm between nodes). ``NPDDP_AUTO_SHM=0`` keeps both shared-memory paths out.

Over the MPI transport, MPI's own all-reduce (:data:`~npddp.comm.algorithms.registry.LIBRARY`, ``mpi``) is a candidate
too (:mod:`npddp.comm.compose.library`): across nodes the model prices it as a tie it does not take (the tuner
can hand it a size); on one node it goes first up to a bound measured per MPI library
(:data:`~npddp.comm.compose.costmodel.LIBRARY_NODE_BYTES`), ``shm`` beyond.

The tuning file's format: :mod:`npddp.comm.compose.tuning`; the model: :mod:`npddp.comm.compose.costmodel`.
"""

from __future__ import annotations

import json
import warnings
from functools import partial

import numpy as np

from npddp.comm import checks as c
from npddp.comm.communicators.p2p import P2PCommunicator
from npddp.comm.compose.costmodel import model_table, node_table
from npddp.comm.compose.hier import Hier, across_nodes, even_nodes
from npddp.comm.compose.tuning import check_table
from npddp.comm.node.allreduce import NodeGroup
from npddp.comm.node.memory import node_ids
from npddp.comm.node.shm import node_group
from npddp.comm.algorithms.registry import ALGORITHMS, LIBRARY, algorithm, costed
from npddp.util import variables

_CACHE_SIZE = 256


class AutoCommunicator(P2PCommunicator):
    """Hand-written collectives whose all-reduce algorithm is chosen per call from a size table."""

    def __init__(self, transport, timeout: float = c.DEFAULT_TIMEOUT, tuning=None, shared_memory: bool = True,
                 algorithms=None):
        super().__init__(transport, None, "auto", timeout, algorithms)
        self._may_share = shared_memory   # a split's child is built alike, re-deriving its node layout
        self.algorithms = {name: algorithm(name)(self.context) for name in (*ALGORITHMS, *costed())}
        nodes = node_ids(self) if shared_memory else []
        #: True when the ranks span nodes (hier's group across nodes always does): the network model applies.
        self.across_nodes = not shared_memory or len(set(nodes)) > 1
        shared_memory = shared_memory and variables.flag(variables.AUTO_SHM)
        self.node = self.context.node = None
        #: Ranks per node when they span nodes with as many (> 1) on each: hier's composition joins the candidates.
        self.per_node = 1
        if shared_memory and not self.across_nodes:  # one node: shm joins, and empty() gives shared memory
            self.node = self.context.node = node_group(self, self._begin("setup"))
            if self.node is not None:
                self.algorithms["shm"] = algorithm("shm")(self.context)
        elif shared_memory and hier_possible(nodes):
            self.per_node = nodes.count(nodes[self._rank])
            self.algorithms["hier"] = _hier_path(self, nodes, timeout)
        if transport.name == "mpi":   # MPI's own all-reduce competes too (collective: a duplicate communicator)
            from npddp.comm.compose.library import library_candidate
            library = library_candidate(self.context)
            if library is not None:
                self.algorithms[LIBRARY] = library
        self.source, self.table = self._load(tuning if tuning is not None else variables.text(variables.TUNING))
        self._setup_done()
        self._picks: dict = {}   # (nbytes, dtype) -> (name, algorithm, run)

    @property
    def shared_memory(self) -> bool:
        """True when every rank shares this node (then :meth:`empty` gives shared memory)."""
        return self.node is not None

    def empty(self, shape, dtype=np.float32) -> np.ndarray:
        """Node shared memory when every rank shares this node (collective), else an ordinary zeroed array."""
        if self.node is None:
            return super().empty(shape, dtype)
        return self.node.empty(self._begin("empty"), shape, dtype)

    def _load(self, path) -> tuple[str, dict]:
        """``(where the table came from, table)``: the tuning file's, or the model's with one warning."""
        kind, library = self.transport.name, LIBRARY in self.algorithms
        steps = node_table(self._size, self.algorithms[LIBRARY].library if library else None) if self.node is not None else model_table(
            kind, self._size, self.chunk_bytes, self.across_nodes, self.per_node, library)
        model = ("model", {"*": steps})
        if not path:
            return model
        raw, problem = b"", ""
        if self._rank == 0:
            try:
                with open(path, "rb") as f:
                    raw = f.read(1 << 20)
            except OSError as exc:
                problem = f"cannot read it: {exc.strerror or exc}"
        raw = self._share(raw, problem)
        if isinstance(raw, str):
            problem = raw
        else:
            try:
                return f"tuning file {path}", check_table(json.loads(raw), kind, self._size, self.node is not None,
                                                          self.per_node > 1, library)
            except (ValueError, TypeError, IndexError, KeyError) as exc:
                problem = str(exc)
        if self._rank == 0:
            warnings.warn(f"auto: ignoring tuning file {path}: {problem}; using the cost model instead", stacklevel=4)
        return model

    def _share(self, raw: bytes, problem: str):
        """Rank 0's file bytes (or its error text) on every rank."""
        head = np.array([len(raw), len(problem.encode())], dtype=np.int64)
        self.broadcast(head, root=0)
        total = int(head.sum())
        body = np.zeros(-(-total // 8), dtype=np.int64)  # the bytes, in whole words
        if self._rank == 0:
            body.view(np.uint8)[:total] = np.frombuffer(raw + problem.encode(), dtype=np.uint8)
        self.broadcast(body, root=0)
        data = body.view(np.uint8)[:total].tobytes()
        if head[1]:
            return data[head[0]:].decode(errors="replace")
        return data

    def algorithm_for(self, nbytes: int, dtype) -> str:
        """The algorithm ``auto`` uses for an all-reduce of ``nbytes`` bytes of ``dtype``."""
        return self._pick(nbytes, dtype)[0]

    def pin(self, name: str) -> None:
        """Run candidate ``name`` at every size (the tuner times ``auto``'s own path to an algorithm this way)."""
        if name not in self.algorithms:
            raise ValueError(f"auto has no candidate {name!r} here; valid: {', '.join(self.algorithms)}")
        self.source, self.table = f"pinned to {name}", {"*": [[None, name]]}
        self._picks.clear()

    def _pick(self, nbytes: int, dtype) -> tuple:
        """``(name, algorithm, its blocking run or None)`` for ``nbytes`` of ``dtype``, cached per size and dtype."""
        key = (nbytes, dtype)
        pick = self._picks.get(key)
        if pick is None:
            steps = self.table.get(np.dtype(dtype).name, self.table["*"])
            name = next(a for limit, a in steps if limit is None or nbytes <= limit)
            if not nbytes and self.node is not None:   # an empty call is checked at the node barrier
                name = "shm"
            if len(self._picks) >= _CACHE_SIZE:
                self._picks.clear()
            chosen = self.algorithms.get(name)
            pick = self._picks[key] = (name, chosen, getattr(chosen, "run", None))
        return pick

    def _child(self, transport):
        """``auto`` over a split's group: its own node layout and tuning, this one's timeout and shared-memory choice."""
        return AutoCommunicator(transport, self._timeout, shared_memory=self._may_share, algorithms=self.choice.chosen)

    def _default_choice(self) -> str:
        """Every other collective's algorithm is picked per call too, by the cost model."""
        return "auto"

    def _sub_communicators(self) -> tuple:
        """hier's communicator across nodes, when hier is a candidate: it checks its calls as this one does."""
        hier = self.algorithms.get("hier")
        return () if hier is None or hier.inter is None else (hier.inter,)

    def barrier(self) -> None:
        """Dissemination barrier; with hier among the candidates, after the calls in flight (node barriers count in
        call order, so a peer waiting on one of them needs this rank's part)."""
        if self.per_node > 1:
            for work in tuple(self._active):
                work.wait()
        super().barrier()

    def _allreduce_work(self, call, src, dst, ufunc, result):
        """Start the chosen algorithm."""
        return self._pick(src.nbytes, src.dtype)[1].start(call, src, dst, ufunc, result)

    def _blocking_path(self, src):
        """The chosen algorithm's blocking path, if it has one."""
        return self._pick(src.nbytes, src.dtype)[2]


def hier_possible(nodes: list) -> bool:
    """True when the ranks span nodes with the same number, more than one, on each (hier's shape)."""
    return len(set(nodes)) > 1 and len(nodes) > len(set(nodes)) and even_nodes(nodes)


def _hier_path(comm, nodes: list, timeout: float):
    """hier's node-then-network all-reduce on ``comm``'s own calls (collective: the node group and the group across)."""
    local = NodeGroup(comm, [r for r in range(comm.size) if nodes[r] == nodes[comm.rank]], comm._begin("setup"))
    return Hier(local, across_nodes(comm, nodes, partial(type(comm), timeout=timeout, shared_memory=False)))
