"""``comm.split(color, key)`` and ``isend``/``irecv`` on every backend, over the transport of this run.

Under ``mpirun`` the hand-written backends run over the MPI transport, under ``python -m npddp.run`` over
TCP; each test loops over colorings of the world and checks the child against MPI_Comm_split's rule.
"""

from __future__ import annotations

import numpy as np
import pytest

from npddp.comm import create

from tests.helpers.marks import marked_backend
from tests.helpers.ranks import RUN_BACKENDS, as_group, check_all_ranks

pytestmark = pytest.mark.mpi(min_size=2)

#: name -> (color, key) of parent rank r of n.
COLORINGS = {
    "same": lambda r, n: (0, 0),
    "different": lambda r, n: (r, 0),
    "even_odd": lambda r, n: (r % 2, 0),
    "keys_reversed": lambda r, n: (r % 2 * 2**40, -r),
    "last_undefined": lambda r, n: (None if r == n - 1 else 7, 0),
    "first_negative": lambda r, n: (-3 if r == 0 else 1, n - r),
}


def expected_members(coloring, rank: int, size: int) -> list[int] | None:
    """MPI's rule: the parent ranks of ``rank``'s group ordered by key, then rank; None when undefined."""
    picks = [coloring(r, size) for r in range(size)]
    color = picks[rank][0]
    if color is None or color < 0:
        return None
    return sorted((r for r in range(size) if picks[r][0] == color), key=lambda r: (picks[r][1], r))


def parent_of(backend: str):
    """A fresh ``backend`` over the world, or a skip where it cannot run here (shm over pretended nodes)."""
    try:
        return create(backend, timeout=60.0)
    except ValueError as exc:
        if "node" not in str(exc):
            raise
        pytest.skip(f"{backend} cannot run on this layout: {exc}")


def split_or_layout_error(comm, color, key):
    """``comm.split``; a shm/hier child whose group has no layout it can run on gives its ValueError instead."""
    try:
        return comm.split(color, key)
    except ValueError as exc:
        if comm.name not in ("shm", "hier") or "node" not in str(exc):
            raise
        return exc


@pytest.fixture(params=[marked_backend(name, f"{name}-backend") for name in RUN_BACKENDS])
def backend(request):
    return request.param


def test_split_ranks_sums_and_bits_follow_mpi(backend):
    comm, world = parent_of(backend), as_group()
    rank, size = comm.rank, comm.size
    problems = []
    for name, coloring in COLORINGS.items():
        color, key = coloring(rank, size)
        child, members = split_or_layout_error(comm, color, key), expected_members(coloring, rank, size)
        noise = np.random.default_rng(1000 + rank).standard_normal(257)
        if isinstance(child, ValueError) or child is None or members is None:
            if (child is None) != (members is None) and not isinstance(child, ValueError):
                problems.append(f"{name}: child {child!r}, expected members {members}")
            got_noise = np.full(257, np.nan)
        else:
            if (child.rank, child.size, child.name) != (members.index(rank), len(members), comm.name):
                problems.append(f"{name}: rank/size/name {(child.rank, child.size, child.name)}, members {members}")
            order = child.allgather(np.array([rank], dtype=np.int64))[:, 0].tolist()
            if order != members:
                problems.append(f"{name}: child ranks are parent ranks {order}, expected {members}")
            total = child.allreduce(np.full(5, float(rank + 1)))
            if not np.array_equal(total, np.full(5, float(sum(m + 1 for m in members)))):
                problems.append(f"{name}: allreduce gave {total}, members {members}")
            got_noise = child.allreduce(noise.copy())
        everyone = world.allgather(got_noise)   # each rank's child result, to compare bits within groups
        if members is not None and not isinstance(child, ValueError):
            differ = [m for m in members if everyone[m].tobytes() != got_noise.tobytes()]
            if differ:
                problems.append(f"{name}: members {differ} hold different bits")
    check_all_ranks(not problems, "; ".join(problems))


def test_sibling_groups_and_parent_in_flight_at_once_do_not_mix(backend):
    comm = parent_of(backend)
    rank, size = comm.rank, comm.size
    child = comm.split(rank % 2, 0)
    members = [r for r in range(size) if r % 2 == rank % 2]
    mine, parents = np.full(4096, float(10 ** (rank % 2) * (rank + 1))), np.full(4096, float(rank + 1))
    works = [child.iallreduce(mine), comm.iallreduce(parents)]
    for work in reversed(works):
        work.wait()
    expect_child = sum(10 ** (m % 2) * (m + 1) for m in members)
    # the same user tag on parent and child between the same two ranks: each message lands in its own group
    out_parent, out_child = np.zeros(3), np.zeros(3)
    if len(members) > 1 and child.rank < 2:
        peer_child, peer_parent = 1 - child.rank, members[1 - child.rank]
        if child.rank == 0:
            comm.send(np.full(3, 100.0), peer_parent, tag=5)
            child.send(np.full(3, 200.0), peer_child, tag=5)
        else:
            child.recv(out_child, peer_child, tag=5)
            comm.recv(out_parent, peer_parent, tag=5)
    receiver = len(members) > 1 and child.rank == 1
    ok = (np.all(mine == expect_child) and np.all(parents == size * (size + 1) / 2)
          and (not receiver or (np.all(out_parent == 100.0) and np.all(out_child == 200.0))))
    check_all_ranks(ok, f"child {mine[0]} (expected {expect_child}), parent {parents[0]}, "
                        f"tag 5 parent {out_parent[0]} child {out_child[0]}")


def test_split_of_split_then_parent_split_again(backend):
    comm = parent_of(backend)
    rank, size = comm.rank, comm.size
    child = split_or_layout_error(comm, rank % 2, 0)
    problems = []
    if rank % 2 == 0 and not isinstance(child, ValueError):   # only one group splits again, twice
        for _ in range(2):
            grandchild = split_or_layout_error(child, 0, -child.rank)
            if isinstance(grandchild, ValueError):
                continue
            total = grandchild.allreduce(np.array([float(rank)]))
            if total[0] != sum(r for r in range(0, size, 2)) or grandchild.rank != grandchild.size - 1 - child.rank:
                problems.append(f"grandchild rank {grandchild.rank} sum {total[0]}")
    again = split_or_layout_error(comm, 0, 0)   # contexts stay fresh on every rank whatever groups made before
    if not isinstance(again, ValueError):
        total = again.allreduce(np.array([float(rank)]))
        if total[0] != size * (size - 1) / 2:
            problems.append(f"parent split again: sum {total[0]}")
    check_all_ranks(not problems, "; ".join(problems))


@pytest.mark.parametrize("color, key, error", [("a", 0, TypeError), (1.5, 0, TypeError), (True, 0, TypeError),
                                               (0, "x", TypeError), (0, None, TypeError), (2**63, 0, ValueError)])
def test_bad_color_or_key_raises_before_any_message(backend, color, key, error):
    comm = parent_of(backend)
    with pytest.raises(error, match="split: (color|key)"):
        comm.split(color, key)
    total = comm.allreduce(np.array([1.0]))   # nothing was sent: the next collective is undisturbed
    check_all_ranks(total[0] == comm.size, f"allreduce after the refused split gave {total[0]}")


def test_isend_irecv_several_in_flight_waited_out_of_order(backend):
    comm = parent_of(backend)
    rank, size = comm.rank, comm.size
    peers = [p for p in range(size) if p != rank]
    got = {(p, t): np.zeros(64) for p in peers for t in (1, 2, 3)}
    recvs = [comm.irecv(got[p, t], p, tag=t) for p in peers for t in (3, 1, 2)]
    sends = [comm.isend(np.full(64, 1000.0 * rank + 10 * p + t), p, tag=t) for p in peers for t in (1, 2, 3)]
    while not sends[-1].test():
        pass
    returned = [work.wait() for work in reversed(recvs)]
    for work in sends:
        work.wait()
    ok = all(np.all(got[p, t] == 1000.0 * p + 10 * rank + t) for p in peers for t in (1, 2, 3))
    ok = ok and all(any(r is g for g in got.values()) for r in returned)
    check_all_ranks(ok, f"received {[(k, v[0]) for k, v in got.items()]}")


@pytest.mark.parametrize("tag, error", [(-1, ValueError), (16384, ValueError), ("x", TypeError)])
def test_isend_irecv_bad_tag_raises_before_sending(backend, tag, error):
    comm = parent_of(backend)
    peer = (comm.rank + 1) % comm.size
    with pytest.raises(error, match="tag"):
        comm.isend(np.ones(3), peer, tag=tag)
    with pytest.raises(error, match="tag"):
        comm.irecv(np.ones(3), peer, tag=tag)
    with pytest.raises(ValueError, match="dest"):
        comm.isend(np.ones(3), comm.size, tag=0)
    total = comm.allreduce(np.array([1.0]))
    check_all_ranks(total[0] == comm.size, f"allreduce after the refused sends gave {total[0]}")


def test_debug_parent_gives_a_debug_child():
    comm = create("ring", debug=True, timeout=60.0)
    child = comm.split(comm.rank % 2, 0)
    total = child.allreduce(np.array([1.0]))
    ok = type(child).__name__ == "DebugCommunicator" and total[0] == child.size
    check_all_ranks(ok, f"child {type(child).__name__}, sum {total[0]}")
