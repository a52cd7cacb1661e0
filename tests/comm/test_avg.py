"""``op="avg"`` on every backend: the sum scaled by 1/N, bit-identical on every rank, floats only.

Inputs are small integers, so the sum is exact in any order and the average is one rounding of
it: ``sum * (1/N)`` in the buffer's dtype, whatever the algorithm. Integer dtypes are refused
before any message is sent.
"""

import numpy as np
import pytest

from npddp.comm import create
from npddp.comm.checks import AVG_DTYPES, REDUCTIONS

from tests.helpers.collectives import PATHS, PLACEMENTS
from tests.helpers.marks import marked_backend


def _sizes(size: int) -> list[int]:
    """Tiny, around the rank count, past the one-barrier limit, and several ring chunks / pushed pieces."""
    return [1, size - 1, size, size + 1, 1009, 20000, 70001]


def _expected(values, n: int, size: int, dtype) -> np.ndarray:
    total = values.expected(n, size, dtype, "sum")
    return np.multiply(total, 1.0 / size) if size > 1 else total


def test_avg_exact_on_every_size_and_float_dtype(comm, group, values, assert_all_ranks, assert_ranks_agree_on_all):
    if hasattr(comm, "chunk_bytes"):
        comm.chunk_bytes = 4096  # many chunks per ring step
    if getattr(comm, "node", None) is not None:
        comm.node.push_bytes = 4096
    problems, results = [], []
    for n in _sizes(comm.size):
        for dtype in AVG_DTYPES:
            want = _expected(values, n, comm.size, dtype)
            for how in ("in place", "out=", "iallreduce"):
                x = values.rank(n, comm.rank, dtype, "sum")
                if how == "in place":
                    got = comm.allreduce(x, "avg")
                elif how == "out=":
                    got = comm.allreduce(x, "avg", out=np.full_like(x, -7))
                else:
                    got = comm.iallreduce(x, "avg").wait()
                if not np.array_equal(got, want):
                    problems.append(f"n={n} {dtype} {how}: got {got[:4]}, expected {want[:4]}")
                results.append(got)
    assert_ranks_agree_on_all(results, group)
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


def test_avg_overlapping_calls(comm, group, values, assert_all_ranks):
    """Several average calls in flight at once, waited in reverse order."""
    n = 5000
    xs = [values.rank(n + k, comm.rank, "float64", "sum") for k in range(3)]
    works = [comm.iallreduce(x, "avg") for x in xs]
    got = [w.wait() for w in reversed(works)][::-1]
    ok = all(np.array_equal(g, _expected(values, n + k, comm.size, "float64")) for k, g in enumerate(got))
    assert_all_ranks(ok, "overlapping avg calls gave wrong values", group)


def test_reduce_scatter_avg(comm, group, values, assert_all_ranks):
    n = 1009
    x = values.rank(n, comm.rank, "float32", "sum")
    got = comm.reduce_scatter(x, "avg")
    want = np.array_split(_expected(values, n, comm.size, "float32"), comm.size)[comm.rank]
    assert_all_ranks(np.array_equal(got, want), f"reduce_scatter avg: got {got[:4]}, expected {want[:4]}", group)


def test_ireduce_scatter_avg_equals_the_blocking_call(comm, group, values, assert_all_ranks):
    """The non-blocking reduce-scatter averages too (not a silent sum), with the blocking call's bits."""
    problems = []
    for n in (1, comm.size + 1, 1009):
        for dtype in ("float16", "float32", "float64"):
            x = values.rank(n, comm.rank, dtype, "sum")
            want = comm.reduce_scatter(x, "avg")
            out = np.empty_like(want)
            got = comm.ireduce_scatter(x, "avg", out=out).wait()
            if not (got is out and np.array_equal(out, want)):
                problems.append(f"n={n} {dtype}: {out[:3]} against {want[:3]}")
    assert_all_ranks(not problems, "; ".join(problems), group)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_avg_refuses_integers_before_sending(comm, dtype):
    x = np.ones(4, dtype=dtype)
    for call in (lambda: comm.allreduce(x, "avg"), lambda: comm.iallreduce(x, "avg"),
                 lambda: comm.allreduce(x, "avg", out=np.empty_like(x)), lambda: comm.reduce_scatter(x, "avg"),
                 lambda: comm.ireduce_scatter(x, "avg")):
        with pytest.raises(TypeError, match=f"avg.*{dtype}.*float16, float32, float64"):
            call()
    # nothing was sent: the communicator still works (a one-rank or all-rank call follows)
    assert comm.allreduce(np.ones(3), "avg").shape == (3,)


def test_unknown_op_names_avg():
    from npddp.comm.checks import check_op
    with pytest.raises(ValueError) as err:
        check_op("mean")
    assert all(op in str(err.value) for op in REDUCTIONS)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", [marked_backend("shm"), marked_backend("auto")])
def test_avg_every_placement(name, path, world, values, assert_all_ranks, assert_ranks_agree_on_all):
    """Shared and private inputs and outputs, on both sides of the one-barrier limit, staged or single-copy."""
    comm = create(name, world.fresh()) if name == "auto" or not _pretended_nodes(world) else None
    if comm is None or not comm.shared_memory:
        return
    comm.node.push_bytes = comm.node.single_copy_piece_bytes = 4096
    comm.node.single_copy_bytes = None if path == "staged" else 1
    problems, results = [], []
    sizes = (comm.size + 1, comm.node.small_bytes // 4 + 1, 5 * 4096 * comm.size + 7)
    arenas = {dtype: (comm.empty((sizes[-1],), dtype), comm.empty((sizes[-1],), dtype)) for dtype in AVG_DTYPES}
    for n in sizes:
        for dtype in AVG_DTYPES:
            want = _expected(values, n, comm.size, dtype)
            for src_kind, dst_kind in PLACEMENTS:
                mine = values.rank(n, comm.rank, dtype, "sum")
                src = arenas[dtype][0][:n] if src_kind == "shared" else np.empty_like(mine)
                src[...] = mine
                if dst_kind is None:
                    got = comm.allreduce(src, "avg")
                else:
                    dst = arenas[dtype][1][:n] if dst_kind == "shared" else np.empty_like(mine)
                    got = comm.allreduce(src, "avg", out=dst)
                if not np.array_equal(got, want):
                    problems.append(f"n={n} {dtype} {src_kind}->{dst_kind}: got {got[:4]}, expected {want[:4]}")
                results.append(got.copy())
    assert_ranks_agree_on_all(results, world)
    assert_all_ranks(not problems, "; ".join(problems[:4]), world)


def _pretended_nodes(world) -> bool:
    import os
    per_node = os.environ.get("NPDDP_RANKS_PER_NODE", "")
    return bool(per_node) and int(per_node) < world.size
