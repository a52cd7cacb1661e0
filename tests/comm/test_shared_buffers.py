"""All-reduce on buffers from ``comm.empty`` (shared memory): every placement of input and output.

The shared-memory backends read a shared input in place and push reduced blocks straight into a
shared output, and stage whatever is private or move it by single-copy transfers between the
processes; these tests mix the placements every way, at sizes on both sides of the one-barrier
path's limit, with the large path cut into many pieces, over both ways of moving private buffers.
"""

import os

import numpy as np
import pytest

from npddp.comm import DTYPES, OPS, create
from tests.helpers.collectives import PATHS, PLACEMENTS
from tests.helpers.marks import marked_backend

#: Backends that offer ``empty`` on one node (auto: when every rank shares the node).
SHARED = ("shm", "hier", "auto")


@pytest.fixture(params=[marked_backend(name, f"{name}-backend-{path}", (name, path)) for name in SHARED for path in PATHS])
def shared_comm(request, world, assert_all_ranks):
    """A backend over the world with shared buffers, its large path pushing in 4 KiB pieces.

    None where pretended nodes rule shared memory out (shm: checked to refuse; auto: checked to offer none).
    """
    name, path = request.param
    comm = _shared_comm(name, world, assert_all_ranks)
    if comm is not None:
        if path == "staged":
            comm.node.single_copy_bytes = None
        else:  # this machine must allow it (same user); a kernel that forbids it says why
            assert_all_ranks(comm.node.single_copy, f"single copy is off: {comm.node.single_copy_off}", world)
            comm.node.single_copy_bytes, comm.node.single_copy_piece_bytes = 1, 4096
    return comm


def _shared_comm(name, world, assert_all_ranks):
    per_node = os.environ.get("NPDDP_RANKS_PER_NODE", "")
    if name == "shm" and per_node and int(per_node) < world.size:  # pretended nodes: shm must refuse
        with pytest.raises(ValueError, match="use backend 'hier'"):
            create("shm", world.fresh())
        return None
    comm = create(name, world.fresh())
    if not comm.shared_memory:
        why_not = os.environ.get("NPDDP_AUTO_SHM") == "0" or bool(os.environ.get("NPDDP_RANKS_PER_NODE"))
        assert_all_ranks(name == "auto" and why_not, f"{name} on one node offers no empty()", world)
        return None
    comm.node.push_bytes = 4096
    return comm


def _sizes(comm) -> list[int]:
    """Element counts: tiny, around the one-barrier limit (for 4-byte types), and several pushed pieces per block."""
    limit = comm.node.small_bytes // 4
    return [1, comm.size + 1, limit, limit + 1, 5 * 4096 * comm.size + 7]


def _place(comm, kind: str, like: np.ndarray) -> np.ndarray:
    """A buffer shaped like ``like``: from ``comm.empty`` or plain NumPy, holding ``like``'s values."""
    buf = comm.empty(like.shape, like.dtype) if kind == "shared" else np.empty_like(like)
    buf[...] = like
    return buf


@pytest.mark.mpi(min_size=2)
def test_every_placement_size_dtype_and_op_is_exact(shared_comm, world, values, assert_all_ranks,
                                                      assert_ranks_agree_on_all):
    comm = shared_comm
    if comm is None:
        return
    problems, results = [], []
    longest = max(_sizes(comm))
    arenas = {dtype: (comm.empty((longest,), dtype), comm.empty((longest,), dtype)) for dtype in DTYPES}
    ops = list(OPS)
    for i, (n, dtype) in enumerate((n, dtype) for n in _sizes(comm) for dtype in DTYPES):
        in_shared, out_shared = (a[:n] for a in arenas[dtype])  # the start of a shared array is shared too
        for j, (src_kind, dst_kind) in enumerate(PLACEMENTS):
            op = ops[(i + j) % len(ops)]  # each op meets every placement, every size and every dtype
            mine, expected = values.rank(n, comm.rank, dtype, op), values.expected(n, comm.size, dtype, op)
            src = in_shared if src_kind == "shared" else np.empty_like(mine)
            src[...] = mine
            case = f"n={n} {dtype} {op} {src_kind}->{dst_kind or 'in place'}"
            if dst_kind is None:
                got = comm.allreduce(src, op)
            else:
                dst = out_shared if dst_kind == "shared" else np.empty_like(mine)
                dst.fill(-7)
                got = comm.allreduce(src, op, out=dst)
                if got is not dst:
                    problems.append(f"{case}: did not return out")
                if not np.array_equal(src, mine):
                    problems.append(f"{case}: input changed")
            if not np.array_equal(got, expected):
                problems.append(f"{case}: got {got[:4]}, expected {expected[:4]}")
            results.append(got.copy())
    assert_ranks_agree_on_all(results, world)
    assert_all_ranks(not problems, "; ".join(problems[:4]), world)


@pytest.mark.mpi(min_size=2)
def test_overlapping_iallreduces_on_shared_buffers(shared_comm, world, values, assert_all_ranks):
    """Large and small calls in flight together, waited newest first on odd ranks: every result exact."""
    comm = shared_comm
    if comm is None:
        return
    specs = [(3 * 4096 * comm.size + 5, "float32", "sum"), (9, "int64", "max"),
             (2 * 4096 * comm.size, "float64", "prod"), (comm.node.small_bytes // 8 + 3, "int64", "min")]
    bufs = [_place(comm, "shared" if i % 2 == 0 else "private", values.rank(n, comm.rank, dtype, op))
            for i, (n, dtype, op) in enumerate(specs)]
    works = [comm.iallreduce(b, op) for b, (_, _, op) in zip(bufs, specs)]
    blocking = comm.allreduce(_place(comm, "shared", values.rank(70001, comm.rank, "float32", "sum")), "sum")
    for w in (works[::-1] if comm.rank % 2 else works):
        w.wait()
    bad = [(n, dtype, op) for (n, dtype, op), b in zip(specs, bufs)
           if not np.array_equal(b, values.expected(n, comm.size, dtype, op))]
    if not np.array_equal(blocking, values.expected(70001, comm.size, "float32", "sum")):
        bad.append("the blocking call between them")
    assert_all_ranks(not bad, f"wrong results for {bad}", world)


@pytest.mark.mpi(min_size=2)
def test_rounded_float_sums_agree_bitwise_on_shared_buffers(shared_comm, world, assert_all_ranks,
                                                             assert_ranks_agree_on_all):
    """Sums that round differently in different orders still hold the same bits on every rank."""
    comm = shared_comm
    if comm is None:
        return
    rng = np.random.default_rng(comm.rank)
    results = []
    for n in (1000, 300_001):
        data = (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)).astype(np.float32)
        buf = _place(comm, "shared", data)
        out = comm.empty((n,), np.float32)
        results += [comm.allreduce(buf, out=out).copy(), comm.allreduce(buf).copy()]
        results.append(comm.allreduce(data.copy()))  # the staged path reduces in the same order
    assert_ranks_agree_on_all(results, world)
    assert_all_ranks(all(np.array_equal(results[i], results[i + 1]) and np.array_equal(results[i], results[i + 2])
                         for i in (0, 3)), "placements disagree on the rounded sum", world)


@pytest.mark.mpi(min_size=2)
@pytest.mark.across_nodes
def test_hier_between_nodes_sends_messages_only(world, assert_all_ranks):
    """hier's group across nodes never takes shared memory, even where nodes are pretended on one machine."""
    comm = create("hier", world.fresh())
    across = comm.inter
    ok = (across is not None) == (comm.nodes > 1) and getattr(across, "node", None) is None
    assert_all_ranks(ok, f"{comm.nodes} nodes, group across them: {type(across).__name__} with node "
                         f"{getattr(across, 'node', None)}", world)
