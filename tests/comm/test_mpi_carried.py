"""The ``mpi`` backend's carried check (npddp.comm.mpi_carried): a later call of an already-checked signature that
differs on one rank still raises CollectiveMismatchError on every rank; calls that move away from the forecast
alike still give the right result."""

import numpy as np
import pytest

from npddp.comm import CollectiveMismatchError, create
from npddp.comm.mpi_carried import CARRY_BYTES, Forecast

from tests.helpers.ranks import TCP_MODE

#: How the last rank's call differs from the forecast all-reduce of ``x`` (float32, op sum), and the field named.
DEVIATIONS = {
    "count": (lambda c, x: c.allreduce(x[:-3].copy()), "count"),
    "dtype": (lambda c, x: c.allreduce(x.view(np.int32)), "dtype"),
    "op": (lambda c, x: c.allreduce(x, "max"), "op"),
    "avg": (lambda c, x: c.allreduce(x, "avg"), "op"),
    "out of place, count": (lambda c, x: c.allreduce(x[:5].copy(), out=np.empty(5, np.float32)), "count"),
    "empty": (lambda c, x: c.allreduce(x[:0]), "count"),
    "larger": (lambda c, x: c.allreduce(np.ones(x.size + CARRY_BYTES, np.float32)), "count"),
    "broadcast": (lambda c, x: c.broadcast(x), "kind"),
    "allgather": (lambda c, x: c.allgather(x), "kind"),
    "barrier": (lambda c, x: c.barrier(), "kind"),
    "iallreduce, count": (lambda c, x: c.iallreduce(x[:7].copy()).wait(), "count"),
}


def test_the_forecast_is_the_call_that_followed_the_last_one_and_only_blocking_all_reduces_are_carried():
    f = Forecast(2)
    a, b, big = ("allreduce", "f", 10, "sum", None), ("allreduce", "d", 3, "max", None), ("broadcast", "f", 10, None, 0)
    assert f.step(a) is None and f.step(b) is None and f.step(a) is None
    assert f.step(b) == b and f.step(a) == a     # a, b, a, b: each forecast from the one before
    assert f.step(big) == b                      # b follows a: a broadcast there runs b's all-reduce first
    assert f.step(a) is None
    assert f.step(big) is None                   # a broadcast is never carried
    i = ("iallreduce", "f", 10, "sum", None)
    f.step(i)
    assert f.step(big) is None and f.step(i) is None   # nor a non-blocking all-reduce
    send, receive, sent, received, count, agree, disagree, expected, op = f.arrays(b)
    assert send.shape == (4,) and sent.base is send and (agree, disagree, expected, op) == (0, 1, 0, "max")
    assert f.arrays(("allreduce", "e", 1, "avg", None))[5:] == (1, 0, 2, "sum")
    large = ("allreduce", "f", CARRY_BYTES // 4 + 1, "sum", None)
    assert f.arrays(large)[0].shape == (1,) and f.spare(large)[0].shape == (CARRY_BYTES // 4 + 1,)


@pytest.mark.mpi(min_size=2)
@pytest.mark.skipif(TCP_MODE, reason="the mpi backend runs under an MPI launcher only")
@pytest.mark.parametrize("count", [40, CARRY_BYTES // 4 + 10], ids=["small", "large"])
@pytest.mark.parametrize("place", ["inplace", "outofplace"])
def test_a_later_call_that_leaves_an_already_checked_signature_on_one_rank_raises_on_every_rank(
        place, count, world, assert_all_ranks, monkeypatch):
    monkeypatch.delenv("NPDDP_CHECK_ARGS", raising=False)
    problems = []
    odd = world.rank == world.size - 1
    for name, (deviate, field) in DEVIATIONS.items():
        comm = create("mpi", world.fresh(), timeout=30)
        x = np.arange(1, count + 1, dtype=np.float32)
        for _ in range(3):   # checked in full once, then carried: the forecast is this all-reduce
            y = comm.allreduce(x.copy()) if place == "inplace" else comm.allreduce(x, out=np.empty_like(x))
        if not np.array_equal(y, x * world.size):
            problems.append(f"{name}: wrong sum {y[:3]}")
        error = ""
        try:
            if odd:
                deviate(comm, x.copy())
            else:
                comm.allreduce(x.copy()) if place == "inplace" else comm.allreduce(x, out=np.empty_like(x))
            if name == "broadcast":
                comm.barrier()
        except CollectiveMismatchError as exc:
            error = str(exc)
        if f"differing fields: {field}" not in error or f"rank {world.size - 1} called" not in error:
            problems.append(f"{name}: no mismatch naming {field} and the rank: {error!r}")
        with pytest.raises(RuntimeError, match="closed|unusable"):
            comm.allreduce(np.ones(3))
    assert_all_ranks(not problems, "; ".join(problems[:3]), world)


@pytest.mark.mpi(min_size=2)
@pytest.mark.skipif(TCP_MODE, reason="the mpi backend runs under an MPI launcher only")
def test_every_rank_leaving_the_forecast_alike_gives_the_right_results(world, assert_all_ranks):
    comm = create("mpi", world.fresh(), timeout=30, check_args=True)
    n, r = world.size, world.rank
    got = []
    for step in range(12):   # a cycle of three, then others in its place, then back
        size = (5, 9, 1000)[step % 3] if step < 7 or step > 9 else 17 + step
        x = np.full(size, r + 1.0)
        got.append(np.array_equal(comm.allreduce(x), np.full(size, n * (n + 1) / 2.0)))
        w = comm.iallreduce(np.full(3, r + 1, np.int64), "max") if step == 8 else None
        got.append(w is None or np.array_equal(w.wait(), np.full(3, n)))
    got.append(np.array_equal(comm.allreduce(np.full(4, r + 1.0, np.float16), "prod"),
                              np.full(4, np.prod(np.arange(1.0, n + 1)), np.float16)))
    assert_all_ranks(all(got), f"wrong results at {[i for i, g in enumerate(got) if not g]}", world)
