"""``hier`` (and ``auto`` composing it) when ranks pass different arguments: the abort reaches every node.

A mismatch found at one node's barrier must reach the ranks of the other nodes, which by then wait
across nodes, and one found across nodes must reach the node's ranks waiting at their barrier; every
rank raises CollectiveMismatchError within seconds, not at the timeout. Run across pretended nodes
(``NPDDP_RANKS_PER_NODE=2``, 4 ranks, as tests/run_all.sh does); on one node the same calls run on
shared memory alone.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from npddp.comm import CollectiveMismatchError, create
from npddp.comm.compose.tuning import FORMAT, VERSION

#: runs again across pretended nodes (tests/run_all.sh: hier-mpi-4, hier-tcp-4)
pytestmark = pytest.mark.across_nodes

#: Who passes another count: name -> the count rank ``rank`` of ``size`` passes (the others: 40).
CASES = {
    "the last rank (found at its node's barrier)": lambda rank, size, per_node: 37 if rank == size - 1 else 40,
    "every rank of the last node (found across nodes)": lambda rank, size, per_node: 39 if rank >= size - per_node
    else 40,
}


def _hier_comm(backend: str, world, tmp_path):
    """``hier``, or ``auto`` told by a tuning file to run hier's composition at every size where it can."""
    if backend == "hier":
        return create("hier", world.fresh(), timeout=60)
    path = tmp_path / f"t{world.rank}.json"
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION, "transport": "tcp" if world.tcp else "mpi",
                                "world_size": world.size, "table": {"*": [[None, "hier"]]}}))
    try:
        return create("auto", world.fresh(), timeout=60, tuning=str(path))
    except ValueError:   # one node: hier's composition is no candidate there
        return create("auto", world.fresh(), timeout=60)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", ["hier", "auto"])
def test_a_hier_mismatch_raises_on_every_rank_of_every_node_within_seconds(backend, case, world, tmp_path,
                                                                          assert_all_ranks, monkeypatch):
    import os
    monkeypatch.delenv("NPDDP_CHECK_ARGS", raising=False)
    per_node = int(os.environ.get("NPDDP_RANKS_PER_NODE") or world.size)
    if per_node >= world.size and "node" in case.split("(")[0]:
        pytest.skip("one node: every rank would pass the same count")
    comm = _hier_comm(backend, world, tmp_path)
    x = np.ones(CASES[case](world.rank, world.size, per_node), dtype=np.float32)
    started, error = time.monotonic(), None
    try:
        comm.allreduce(x)
    except CollectiveMismatchError as exc:
        error = str(exc)
    except TimeoutError as exc:
        error = f"TimeoutError: {exc}"
    took = time.monotonic() - started
    ok = error is not None and not error.startswith("TimeoutError") and took < 15 and "count" in error
    assert_all_ranks(ok, f"rank {world.rank} after {took:.1f} s: {error or 'no error'}", world)
