"""Every registered broadcast algorithm, chosen by name on a hand-written backend: root's bits on every rank."""

import numpy as np
import pytest

from npddp.comm import DTYPES, create
from npddp.comm.algorithms import registry
from npddp.comm.engine.cost import MODEL
from tests.helpers.groups import one_rank_group


@pytest.mark.parametrize("algorithm", [*registry.names("broadcast", builtin=True), "auto"])
def test_every_broadcast_algorithm_gives_the_roots_buffer_to_every_rank(algorithm, group, assert_all_ranks,
                                                                          assert_ranks_agree_on_all):
    """Every root, sizes from 0 to several chunks (64-byte chunks: the chain pipelines), every dtype, 2-d buffers."""
    comm = create("ring", group)
    comm.broadcast_algorithm, comm.chunk_bytes = algorithm, 64
    k, problems, results = comm.size, [], []
    for root in range(k):
        for shape in [(0,), (1,), (k + 1,), (3, 7), (1009,)]:
            for dtype in DTYPES:
                expected = ((np.arange(int(np.prod(shape))) * 3 + 17 * root) % 500).astype(dtype).reshape(shape)
                buf = expected.copy() if comm.rank == root else np.full(shape, -1, dtype=dtype)
                got = comm.broadcast(buf, root=root)
                if got is not buf or not np.array_equal(buf, expected):
                    problems.append(f"root={root} shape={shape} {dtype}")
                results.append(buf.ravel()[:1].astype(np.float64))
    child = comm.split(0)
    if child.broadcast_algorithm != algorithm:
        problems.append(f"the split child runs {child.broadcast_algorithm}")
    assert_ranks_agree_on_all(results, group)
    assert_all_ranks(not problems, f"{algorithm}: " + "; ".join(problems[:4]), group)


def test_an_unknown_broadcast_algorithm_is_refused_naming_the_valid_ones():
    comm = create("ring", one_rank_group())
    with pytest.raises(ValueError, match="binomial"):
        comm.broadcast_algorithm = "nope"
    assert comm.broadcast_algorithm == "auto"


def test_the_costs_rank_binomial_for_small_buffers_and_scatter_allgather_for_large_ones():
    """At N = 8: a binomial tree's 3 steps win at 1 KiB; at 64 MiB its 3 whole copies lose to 2n (N-1)/N."""
    alpha, beta, gamma = MODEL["mpi"]

    def price(name, nbytes):
        return registry.algorithm(name, "broadcast").cost(nbytes, 8, 1 << 20).time(alpha, beta, gamma)
    assert price("binomial", 1024) < min(price("chain", 1024), price("scatter_allgather", 1024))
    assert price("scatter_allgather", 64 << 20) < price("binomial", 64 << 20)
