"""Broadcast, reduce_scatter, allgather, gather, scatter, barrier, send/recv on every backend."""

import time

import numpy as np
import pytest

from npddp.comm import DTYPES, OPS, create
from npddp.comm.checks import USER_TAG_LIMIT
from npddp.comm.transports.base import is_transport

from tests.helpers.ranks import as_group


def rank_array(rank: int, shape, dtype) -> np.ndarray:
    """Values that say which rank made them: rank * 1000 + index (exact in every dtype for small shapes)."""
    n = int(np.prod(shape))
    return ((np.arange(n) % 500) + 1000 * rank).astype(dtype).reshape(shape)


def test_broadcast_from_every_root(comm, group, assert_all_ranks, assert_ranks_agree_on_all):
    problems, results = [], []
    for root in range(comm.size):
        for shape in [(0,), (1,), (5,), (1009,), (3, 4)]:
            for dtype in DTYPES:
                expected = rank_array(root + 1, shape, dtype)
                buf = expected.copy() if comm.rank == root else np.full(shape, -1, dtype=dtype)
                got = comm.broadcast(buf, root=root)
                if got is not buf or not np.array_equal(buf, expected):
                    problems.append(f"root={root} shape={shape} {dtype}")
                results.append(buf)
    assert_ranks_agree_on_all(results, group)
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


def test_ring_broadcast_tree_and_chain(group, assert_all_ranks, assert_ranks_agree_on_all):
    """Large broadcasts go down a pipelined chain of segments; small ones down a binomial tree."""
    comm = create("ring", group)
    problems, results = [], []
    for chain_bytes, chunk_bytes in ((1 << 30, 1 << 20), (0, 64), (0, 1 << 20)):
        comm.chain_bytes, comm.chunk_bytes = chain_bytes, chunk_bytes
        for root in range(comm.size):
            # 64-byte segments: 1009 floats make 64 of them (18,751 for 300,001 floats took seconds for nothing more)
            for n in (1, 1009) if chunk_bytes == 64 else (1, 1009, 300_001):
                expected = rank_array(root, (n,), "float32")
                buf = expected.copy() if comm.rank == root else np.zeros(n, dtype=np.float32)
                comm.broadcast(buf, root=root)
                if not np.array_equal(buf, expected):
                    problems.append(f"chain_bytes={chain_bytes} chunk_bytes={chunk_bytes} root={root} n={n}")
                results.append(buf)
    assert_ranks_agree_on_all(results, group)
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


def test_reduce_scatter_exact_blocks(comm, group, values, assert_all_ranks):
    k = comm.size
    problems = []
    for n in sorted({0, 1, k - 1, k + 1, 2 * k + 1, 1009}):
        for dtype in DTYPES:
            for op in OPS:
                x = values.rank(n, comm.rank, dtype, op).reshape(1, n)
                x.flags.writeable = False  # reduce_scatter only reads its input
                got = comm.reduce_scatter(x, op)
                want = np.array_split(values.expected(n, k, dtype, op), k)[comm.rank]
                if got.dtype != want.dtype or not np.array_equal(got, want):
                    problems.append(f"n={n} {dtype} {op}: got {got[:4]}, expected {want[:4]}")
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


def test_allgather_uneven_shapes(comm, group, assert_all_ranks, assert_ranks_agree_on_all):
    problems, results = [], []
    for shape in [(), (0,), (1,), (comm.size + 1,), (1009,), (2, 3)]:
        for dtype in DTYPES:
            got = comm.allgather(rank_array(comm.rank, shape, dtype))
            want = np.stack([rank_array(r, shape, dtype) for r in range(comm.size)])
            if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
                problems.append(f"shape={shape} {dtype}")
            results.append(got)
    assert_ranks_agree_on_all(results, group)
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


def test_gather_every_root(comm, group, assert_all_ranks):
    problems = []
    for root in range(comm.size):
        for shape in [(0,), (1,), (7,), (2, 5)]:
            for dtype in ("float16", "int64"):
                got = comm.gather(rank_array(comm.rank, shape, dtype), root=root)
                if comm.rank != root:
                    if got is not None:
                        problems.append(f"root={root}: non-root got {type(got)}")
                elif not np.array_equal(got, np.stack([rank_array(r, shape, dtype) for r in range(comm.size)])):
                    problems.append(f"root={root} shape={shape} {dtype}")
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


def test_scatter_every_root(comm, group, assert_all_ranks):
    problems = []
    for root in range(comm.size):
        for block in [(0,), (1,), (7,), (2, 5)]:
            for dtype in ("float32", "int32"):
                stacked = np.stack([rank_array(root * 10 + r, block, dtype) for r in range(comm.size)])
                mine = stacked if comm.rank == root else np.full_like(stacked, -1)
                if comm.rank == root:
                    mine.flags.writeable = False  # scatter only reads root's buffer
                got = comm.scatter(mine, root=root)
                if got.shape != block or not np.array_equal(got, stacked[comm.rank]):
                    problems.append(f"root={root} block={block} {dtype}: got {got.ravel()[:3]}")
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)


def test_barrier_waits_for_the_last_rank(comm, group, assert_all_ranks):
    """Whichever rank arrives late, nobody leaves the barrier before it arrives."""
    delay = 0.12
    waited = []
    for late in range(comm.size):
        as_group(group).barrier()
        start = time.perf_counter()
        if comm.rank == late:
            time.sleep(delay)
        comm.barrier()
        waited.append(time.perf_counter() - start)
    for _ in range(3):
        comm.barrier()
    early = [late for late, w in enumerate(waited) if w < 0.5 * delay]  # margin for skew leaving Barrier
    assert_all_ranks(not early, f"left the barrier before late rank(s) {early} arrived", group)


@pytest.mark.mpi(min_size=2)
def test_send_recv_user_tags_beside_collectives(backend, world, values, assert_all_ranks):
    """User messages in flight while collectives run are not confused with collective traffic."""
    comm = create(backend, world.raw)
    k, right, left = comm.size, (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    problems = []
    for tag in (0, 7, USER_TAG_LIMIT - 1):
        for dtype in DTYPES:
            msg = rank_array(comm.rank, (5,), dtype)
            got = np.zeros(5, dtype=dtype)
            wait = post_recv(world.raw, got, left, tag)  # posted by the test, not the backend
            comm.send(msg, dest=right, tag=tag)
            total = comm.allreduce(values.rank(9, comm.rank, dtype, "sum"), "sum")
            wait()
            back = np.zeros(5, dtype=dtype)
            if comm.rank % 2 == 0:
                comm.send(msg, dest=left, tag=tag)
                comm.recv(back, source=right, tag=tag)
            else:
                comm.recv(back, source=right, tag=tag)
                comm.send(msg, dest=left, tag=tag)
            ok = (np.array_equal(got, rank_array(left, (5,), dtype))
                  and np.array_equal(back, rank_array(right, (5,), dtype))
                  and np.array_equal(total, values.expected(9, k, dtype, "sum")))
            if not ok:
                problems.append(f"tag={tag} {dtype}")
    assert_all_ranks(not problems, "; ".join(problems[:4]), world)


def post_recv(raw, buf, source, tag):
    """Post a receive straight on the group's transport (mpi4py or TCP); return its wait()."""
    if not is_transport(raw):
        return raw.Irecv(buf, source=source, tag=tag).Wait
    request = raw.irecv(buf, source, tag)

    def wait():
        deadline = time.monotonic() + 60
        while not request.test():
            assert time.monotonic() < deadline, "the test's own receive never completed"
    return wait


@pytest.mark.parametrize("name", ["ring", "rd", "rabenseifner", "tree"])
def test_every_p2p_backend_shares_the_rings_reduce_scatter_and_allgather(name, group, assert_all_ranks):
    """One ring schedule: reduce_scatter gives block r of the ring all-reduce bit for bit, at any chunk and window."""
    comm, ring = create(name, group), create("ring", group)
    rng = np.random.default_rng(7 + comm.rank)
    problems = []
    for chunk_bytes, window in ((1 << 20, 2), (12, 1), (40, 3)):
        comm.chunk_bytes, comm.window = ring.chunk_bytes, ring.window = chunk_bytes, window
        for n in (1, comm.size - 1, comm.size + 1, 1009):
            x = rng.standard_normal(n).astype(np.float32)  # rounded sums: the order of addition shows in the bits
            block = comm.reduce_scatter(x)
            whole = ring.allreduce(x, out=np.empty_like(x))
            lo, hi = (np.array_split(np.arange(n), comm.size)[comm.rank][[0, -1]] + [0, 1]
                      if block.size else (0, 0))
            if block.tobytes() != whole[lo:hi].tobytes():
                problems.append(f"{name} chunk={chunk_bytes} window={window} n={n}: block differs from the ring's")
            table = comm.allgather(block.reshape(1, -1)[:, :1] if block.size else np.zeros((1, 1), np.float32))
            if table.shape != (comm.size, 1, 1):
                problems.append(f"{name} n={n}: allgather shape {table.shape}")
    assert_all_ranks(not problems, "; ".join(problems[:4]), group)
