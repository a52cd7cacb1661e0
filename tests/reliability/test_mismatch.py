"""Debug mode: ranks that call different collectives get a CollectiveMismatchError on every rank, not a hang.

Serial tests cover the fingerprint (encode, describe, compare, the message) and how debug mode
is switched on; MPI tests make the last rank call something else than the others, for every
backend and every kind of difference, and check the error, its agreement across ranks, and
that the communicator still works afterwards.
"""

import numpy as np
import pytest

from npddp.comm import BACKENDS, CollectiveMismatchError, create
from npddp.comm.engine.signed import SMALL_BYTES
from npddp.comm.wrappers.debug import FINGERPRINT_LENGTH, DebugCommunicator, describe, encode, mismatch

from tests.helpers.ranks import RUN_BACKENDS, TCP_MODE

#: watches the whole machine or times a job's end: never beside another test (run_all.sh: serial-alone)
pytestmark = pytest.mark.alone


def fp(sequence, operation, buf=None, op=None, root=None):
    return encode(np.empty(FINGERPRINT_LENGTH, dtype=np.int64), sequence, operation, buf, op, root)


f32 = np.zeros(10, dtype=np.float32)


@pytest.mark.parametrize("operation, buf, op, root, text", [
    ("barrier", None, None, None, "barrier()"),
    ("allreduce", f32, "sum", None, "allreduce(op=sum, float32, shape (10,))"),
    ("iallreduce", np.zeros((2, 3), np.int64), "max", None, "iallreduce(op=max, int64, shape (2, 3))"),
    ("broadcast", np.zeros((), np.float16), None, 3, "broadcast(root=3, float16, shape ())"),
    ("reduce_scatter", np.zeros(0, np.int32), "prod", None, "reduce_scatter(op=prod, int32, shape (0,))"),
    ("scatter", np.zeros((4, 1, 2), np.float64), None, 0, "scatter(root=0, float64, shape (4, 1, 2))"),
    ("gather", np.zeros((1,) * 8, np.float32), None, 1, f"gather(root=1, float32, shape {(1,) * 8})"),
    ("allgather", np.zeros((1,) * 9, np.float32), None, None, "allgather(float32, 9-d shape of 1 elements)"),
])
def test_a_fingerprint_describes_the_call_it_encodes(operation, buf, op, root, text):
    row = fp(7, operation, buf, op, root)
    assert row.shape == (FINGERPRINT_LENGTH,) and row.dtype == np.int64
    assert describe(row) == text


def test_the_example_mismatch_names_the_ranks_the_calls_and_the_fields():
    table = np.stack([fp(12, "allreduce", f32, op="sum"), fp(12, "broadcast", f32, root=1)])
    assert mismatch(table) == ("collective #12 mismatch: rank 1 called broadcast(root=1, float32, shape (10,)) "
                               "but rank 0 called allreduce(op=sum, float32, shape (10,)); differing fields: "
                               "operation, op, root")


# rows of a 4-rank table, the fields the message must list (None: no mismatch), text it must contain
TABLES = [
    ([fp(3, "allreduce", f32, "sum")] * 4, None, ""),
    ([fp(3, "allreduce", f32, "sum")] * 3 + [fp(3, "allreduce", f32.reshape(2, 5), "sum")], None, ""),
    ([fp(3, "allgather", f32)] * 3 + [fp(3, "allgather", f32.reshape(2, 5))], ["shape"], "rank 3 called allgather"),
    ([fp(3, "allreduce", f32, "sum")] * 2 + [fp(3, "allreduce", f32, "max")] * 2, ["op"],
     "ranks 2, 3 called allreduce(op=max"),
    ([fp(3, "allreduce", f32, "sum"), fp(3, "allreduce", f32.astype(np.float64), "sum"),
      fp(3, "allreduce", f32[:9], "sum"), fp(3, "allreduce", f32, "sum")], ["dtype", "count"],
     ("rank 1 called allreduce(op=sum, float64, shape (10,)), rank 2 called allreduce(op=sum, float32, shape (9,)) "
      "but ranks 0, 3 called")),
    ([fp(5, "barrier")] * 3 + [fp(6, "barrier")], ["sequence"],
     "rank 3 called #6 barrier() but ranks 0, 1, 2 called #5 barrier()"),
    ([fp(5, "gather", f32, root=0), fp(5, "gather", f32, root=2)], ["root"], "rank 1 called gather(root=2"),
    ([fp(5, "barrier"), fp(5, "allreduce", f32, "sum")], ["operation", "dtype", "count", "op", "shape"],
     "rank 1 called allreduce(op=sum, float32, shape (10,)) but rank 0 called barrier()"),
]


@pytest.mark.parametrize("rows, fields, text", TABLES)
def test_mismatch_lists_exactly_the_fields_that_differ_and_who_called_what(rows, fields, text):
    message = mismatch(np.stack(rows))
    if fields is None:
        assert message is None
        return
    assert message.startswith(f"collective #{rows[0][0]} mismatch: ") and text in message, message
    assert message.endswith("; differing fields: " + ", ".join(fields)), message


def test_debug_is_on_with_the_argument_or_the_environment_and_forwards_attributes(monkeypatch):
    from mpi4py import MPI
    monkeypatch.delenv("NPDDP_DEBUG", raising=False)
    for backend in BACKENDS:
        assert not isinstance(create(backend, MPI.COMM_SELF), DebugCommunicator)
        wrapped = create(backend, MPI.COMM_SELF, debug=True)
        assert isinstance(wrapped, DebugCommunicator) and wrapped.name == backend
        assert (wrapped.rank, wrapped.size) == (0, 1)
    for value, on in (("1", True), ("yes", True), ("ON", True), ("0", False), ("", False), ("off", False)):
        monkeypatch.setenv("NPDDP_DEBUG", value)
        assert isinstance(create("ring", MPI.COMM_SELF), DebugCommunicator) == on, value
    monkeypatch.setenv("NPDDP_DEBUG", "1")
    ring = create("ring", MPI.COMM_SELF)
    ring.chunk_bytes = 64                                   # reaches the wrapped backend
    assert ring.inner.chunk_bytes == 64 and ring.chunk_bytes == 64 and ring.timeout == ring.inner.timeout


def test_a_wrapped_backend_gives_the_same_results_and_checks_arguments_before_any_exchange():
    from mpi4py import MPI
    for backend in BACKENDS:
        comm = create(backend, MPI.COMM_SELF, debug=True)
        x = np.arange(6, dtype=np.float64)
        assert comm.allreduce(x.copy(), "max").tolist() == x.tolist()
        assert comm.iallreduce(x.copy()).wait().tolist() == x.tolist()
        assert comm.allgather(x).shape == (1, 6) and comm.scatter(x.reshape(1, 6)).tolist() == x.tolist()
        assert comm.collectives == 4
        for bad in (lambda c=comm, x=x: c.allreduce(x, "mean"), lambda c=comm, x=x: c.broadcast(x, root=1),
                    lambda c=comm: c.allgather([1.0]), lambda c=comm, x=x: c.scatter(x)):
            with pytest.raises((TypeError, ValueError)):
                bad()
        assert comm.collectives == 4, backend                # no fingerprint was exchanged for a bad call


# ----------------------------------------------------------------------------- across ranks

def _calls(comm, odd):
    """(name, call made by ranks 0..size-2, call made by the last rank, fields the error must list)."""
    k = comm.size
    x32, x64 = np.ones(10, np.float32), np.ones(10, np.float64)
    return [
        ("operation and root", lambda: comm.allreduce(x32), lambda: comm.broadcast(x32, root=odd),
         ["operation", "op", "root"]),
        ("dtype", lambda: comm.allreduce(x32), lambda: comm.allreduce(x64), ["dtype"]),
        ("count", lambda: comm.allreduce(x32), lambda: comm.allreduce(x32[:7].copy()), ["count"]),
        ("op", lambda: comm.allreduce(x32, "sum"), lambda: comm.allreduce(x32, "min"), ["op"]),
        ("root", lambda: comm.broadcast(x64, root=0), lambda: comm.broadcast(x64, root=odd), ["root"]),
        ("shape", lambda: comm.allgather(np.ones((2, 3))), lambda: comm.allgather(np.ones((3, 2))), ["shape"]),
        ("blocking or not", lambda: comm.allreduce(x32), lambda: comm.iallreduce(x32).wait(), ["operation"]),
        ("gather vs scatter", lambda: comm.gather(x64), lambda: comm.scatter(np.ones((k, 10))),
         ["operation", "count", "shape"]),
        ("barrier", lambda: comm.barrier(), lambda: comm.reduce_scatter(x32), ["operation", "dtype", "count", "op",
                                                                             "shape"]),
    ]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("backend", RUN_BACKENDS, ids=lambda b: f"{b}-backend")
def test_a_mismatched_collective_raises_the_same_error_on_every_rank(backend, world, assert_all_ranks,
                                                                     assert_ranks_agree):
    comm = create(backend, world.raw, debug=True)
    odd = comm.size - 1
    problems = []
    for name, usual, other, fields in _calls(comm, odd):
        try:
            (other if comm.rank == odd else usual)()
            got = "no error"
        except CollectiveMismatchError as err:
            got = str(err)
        msg = np.frombuffer(got.encode()[:400].ljust(400), dtype=np.uint8)
        assert_ranks_agree(msg, world)                               # the same message everywhere
        others = "rank 0" if odd == 1 else f"ranks {', '.join(map(str, range(odd)))}"
        if not (got.startswith(f"collective #{comm.collectives} mismatch: rank {odd} called ")
                and f" but {others} called " in got and got.endswith("differing fields: " + ", ".join(fields))):
            problems.append(f"{name}: {got}")
        y = np.full(5, comm.rank + 1.0)                              # the communicator still works
        comm.allreduce(y)
        if not np.array_equal(y, np.full(5, comm.size * (comm.size + 1) / 2)):
            problems.append(f"{name}: the all-reduce after the mismatch is wrong: {y}")
    assert_all_ranks(not problems, "; ".join(problems), world)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("backend", RUN_BACKENDS, ids=lambda b: f"{b}-backend")
def test_matching_collectives_pass_through_unchanged(backend, world, assert_all_ranks, assert_ranks_agree):
    dup = world.fresh()                      # a communicator of its own, so the two never share a tag
    comm, raw = create(backend, world.raw, debug=True), create(backend, dup)
    k, rank = comm.size, comm.rank
    x = np.arange(1001, dtype=np.float64) * (rank + 1)
    results = []
    for c in (comm, raw):
        work = c.iallreduce(x.copy(), "sum")
        results.append([work.wait(), c.allreduce(x, "max", out=np.empty_like(x)), c.reduce_scatter(x, "min"),
                        c.allgather(x[:7]), c.broadcast(x.copy(), root=k - 1), c.scatter(np.tile(x[:3], (k, 1)), 0)])
        c.barrier()
    works = comm.iallreduce(x.copy()), raw.iallreduce(x.copy())
    unwrapped = type(works[0]) is type(works[1])
    for work in works:
        work.wait()
    same = all(np.array_equal(a, b) for a, b in zip(*results))
    assert_ranks_agree(results[0][0], world)
    assert_all_ranks(same and unwrapped, "debug changed a result or wrapped the Work handle", world)


# ----------------------------------------------------------------------------- the default check (no debug mode)

#: Mismatches the default check must catch: name -> (the field that differs, how the last rank changes
#: (buffer, op) from the others').
KINDS = {
    "dtype": ("dtype", lambda buf, op: (buf.view(np.int32), op)),          # the same bytes, another dtype
    "count": ("count", lambda buf, op: (buf[:-3].copy(), op)),
    "op": ("op", lambda buf, op: (buf, "max")),
}
#: Count mismatches across the ways a first message goes (run on fewer collectives: each case needs a
#: communicator of its own, and MPI has a few thousand): the hand-written backends send a first message of
#: up to SMALL_BYTES with the signature in it, a larger one behind a signature of its own, and an empty call
#: trades signatures with every peer.
COUNT_KINDS = {
    "count, small against large": ("count", lambda buf, op: (np.ones(4 * SMALL_BYTES, dtype=buf.dtype), op)),
    "count, empty against not": ("count", lambda buf, op: (buf[:0], op)),
}
#: Collective -> how to call it with (comm, buf, op); the reductions take every kind, the others no op.
COLLECTIVES = {
    "allreduce": lambda comm, buf, op: comm.allreduce(buf, op),
    "iallreduce": lambda comm, buf, op: comm.iallreduce(buf, op).wait(),
    "reduce_scatter": lambda comm, buf, op: comm.reduce_scatter(buf, op),
    "allgather": lambda comm, buf, op: comm.allgather(buf),
    "broadcast": lambda comm, buf, op: comm.broadcast(buf, root=0),
}
#: Collectives where a rank may finish its part before the mismatch is found (it raises at its next call).
_ROOTED = {"broadcast"}


def _mismatch_cases():
    for name in COLLECTIVES:
        for kind in KINDS:
            if kind == "op" and name in ("allgather", "broadcast"):
                continue
            yield name, kind
    for name in ("allreduce", "broadcast"):
        for kind in COUNT_KINDS:
            yield name, kind


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("known", [False, True], ids=["new-shapes", "known-shapes"])
@pytest.mark.parametrize("backend", RUN_BACKENDS, ids=lambda b: f"{b}-backend")
def test_by_default_every_rank_raises_on_a_mismatch_naming_the_field_and_the_communicator_closes(
        backend, known, world, assert_all_ranks, monkeypatch):
    """``known``: every rank first makes both calls alike, so the hand-written backends' mismatched call goes
    plain under its signature's index in the tag (npddp.comm.engine.signed.Signer) instead of signed in full."""
    monkeypatch.delenv("NPDDP_CHECK_ARGS", raising=False)
    monkeypatch.delenv("NPDDP_DEBUG", raising=False)
    problems = []
    for name, kind in _mismatch_cases():
        comm = create(backend, world.fresh(), timeout=30)
        odd = comm.rank == comm.size - 1
        field, change = {**KINDS, **COUNT_KINDS}[kind]
        buf, op = np.arange(1, 41, dtype=np.float32), "sum"
        if known:
            for b, o in ((buf, op), change(buf, op)):
                COLLECTIVES[name](comm, b.copy(), o)
        if odd:
            buf, op = change(buf, op)
        error = None
        try:
            COLLECTIVES[name](comm, buf, op)
            if name in _ROOTED:
                comm.barrier()     # a rank whose part was done before the mismatch was found learns it here
        except CollectiveMismatchError as exc:
            error = str(exc)
        if error is None:
            problems.append(f"{name}/{kind}: no CollectiveMismatchError on rank {comm.rank}")
            continue
        if f"differing fields: {field}" not in error or f"rank {world.size - 1} called" not in error:
            problems.append(f"{name}/{kind}: the error does not name the field or the rank: {error}")
        try:
            comm.allreduce(np.ones(3))
            problems.append(f"{name}/{kind}: the communicator still ran a call after the mismatch")
        except RuntimeError as exc:
            if "closed" not in str(exc) and "unusable" not in str(exc):
                problems.append(f"{name}/{kind}: unclear error after the mismatch: {exc}")
    assert_all_ranks(not problems, "; ".join(problems[:4]), world)


#: Rooted calls and empty buffers, where a rank may receive from no peer: name -> (the field that differs, the call
#: as rank ``who`` makes it). Every rank makes its own rank's call; "every rank its own root": all differ.
ROOTED = {
    "broadcast, every rank its own root": ("root", lambda comm, who: comm.broadcast(np.ones(3, np.float32), root=who)),
    "broadcast, the last rank another root": (
        "root", lambda comm, who: comm.broadcast(np.ones(3, np.float32), root=int(who == comm.size - 1))),
    "scatter, every rank its own root": ("root", lambda comm, who: comm.scatter(np.ones((comm.size, 2), np.float32),
                                                                                  root=who)),
    "gather, every rank its own root": ("root", lambda comm, who: comm.gather(np.ones(2, np.float32), root=who)),
    "gather, the root's buffer empty": ("count", lambda comm, who: comm.gather(np.ones(3 * (who > 0), np.float32))),
    "gather, a non-root's buffer empty": (
        "count", lambda comm, who: comm.gather(np.ones(3 * (who < comm.size - 1), np.float32))),
    "scatter, the root's blocks empty": (
        "count", lambda comm, who: comm.scatter(np.ones((comm.size, 3 * (who > 0)), np.float32))),
    "scatter, a non-root's blocks empty": (
        "count", lambda comm, who: comm.scatter(np.ones((comm.size, 3 * (who < comm.size - 1)), np.float32))),
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("known", [False, True], ids=["new-shapes", "known-shapes"])
@pytest.mark.parametrize("backend", RUN_BACKENDS, ids=lambda b: f"{b}-backend")
def test_a_differing_root_or_empty_buffer_raises_on_every_rank_in_that_call(backend, known, world, assert_all_ranks,
                                                                            monkeypatch):
    """A rank that believes it is the root, or has nothing to move, still compares its signature with every peer's:
    each rank raises in the call itself, naming the field, within seconds (``known``: every rank first makes every
    rank's call, so the mismatched one goes plain under its signature's index)."""
    import time
    monkeypatch.delenv("NPDDP_CHECK_ARGS", raising=False)
    monkeypatch.delenv("NPDDP_DEBUG", raising=False)
    problems = []
    for name, (field, call) in ROOTED.items():
        comm = create(backend, world.fresh(), timeout=30)
        if known:
            for who in range(comm.size):
                call(comm, who)
        started, error = time.monotonic(), None
        try:
            call(comm, comm.rank)
        except CollectiveMismatchError as exc:
            error = str(exc)
        took = time.monotonic() - started
        if error is None:
            problems.append(f"{name}: no CollectiveMismatchError on rank {comm.rank}")
        elif f"differing fields: {field}" not in error or took > 10:
            problems.append(f"{name}: after {took:.1f} s, an error that does not name {field}: {error}")
    assert_all_ranks(not problems, "; ".join(problems[:4]), world)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("backend", ["ring", "auto"])
def test_a_groups_error_names_the_rank_in_the_group_and_in_the_world(backend, world, assert_all_ranks):
    """A split in reverse order numbers its ranks apart from the world's: its errors say which is which."""
    comm = create(backend, world.fresh(), timeout=30)
    child = comm.split(0, key=-comm.rank)                   # child rank = size - 1 - world rank
    error = ""
    try:
        child.allreduce(np.ones(5 + (comm.rank == 0), dtype=np.float32))
    except CollectiveMismatchError as exc:
        error = str(exc)
    label = (f"[rank {world.rank}] " if child.rank == world.rank   # the middle rank of an odd size: one number
             else f"[rank {child.rank} of the group (world rank {world.rank})] ")
    assert_all_ranks(error.startswith(label), f"expected {label!r}, got {error!r}", world)


def test_a_rank_is_named_in_its_group_and_in_the_world_only_where_they_differ():
    from types import SimpleNamespace

    from npddp.comm.engine.call import rank_label
    world = SimpleNamespace(rank=3, size=4, world_rank=3, world_size=4)
    group = SimpleNamespace(rank=1, size=2, world_rank=3, world_size=4)
    view = SimpleNamespace(rank=0, size=2, inner=group)     # a reordered view of the group
    bare = SimpleNamespace(rank=2, size=3)                  # a user's transport that names no world
    assert [rank_label(t) for t in (world, group, view, bare)] == [
        "rank 3", "rank 1 of the group (world rank 3)", "rank 0 of the group (world rank 3)", "rank 2"]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("backend", RUN_BACKENDS, ids=lambda b: f"{b}-backend")
def test_with_the_check_off_matching_calls_give_the_same_results(backend, world, assert_all_ranks):
    on, off = create(backend, world.fresh(), check_args=True), create(backend, world.fresh(), check_args=False)
    assert on.check_args and not off.check_args
    x = np.arange(1001, dtype=np.float64) * (world.rank + 1)
    got = [[c.allreduce(x.copy()), c.iallreduce(x.copy(), "max").wait(), c.reduce_scatter(x, "min"),
            c.allgather(x[:5]), c.broadcast(x.copy(), root=world.size - 1)] for c in (on, off)]
    same = all(np.array_equal(a, b) for a, b in zip(*got))
    assert_all_ranks(same, "the check changed a result", world)


def test_check_args_comes_from_the_environment_and_is_validated(monkeypatch):
    from npddp.comm.checks import check_args_from_env
    assert check_args_from_env({}) is True
    for value, on in (("0", False), ("off", False), ("1", True), ("", True)):
        assert check_args_from_env({"NPDDP_CHECK_ARGS": value}) is on
    with pytest.raises(ValueError, match="NPDDP_CHECK_ARGS='maybe'"):
        check_args_from_env({"NPDDP_CHECK_ARGS": "maybe"})
    with pytest.raises(TypeError, match="check_args"):
        create("ring", check_args="yes")


@pytest.mark.mpi(min_size=2)
@pytest.mark.skipif(TCP_MODE, reason="the mpi backend runs under an MPI launcher only")
def test_the_mpi_backends_checked_iallreduce_returns_before_its_peers_have_called(world, assert_all_ranks):
    import time
    comm = create("mpi", world.fresh(), check_args=True)
    world.raw.Barrier()
    x = np.full(1000, world.rank + 1.0)
    if world.rank:
        time.sleep(0.5)
    started = time.monotonic()
    work = comm.iallreduce(x)
    returned = time.monotonic() - started
    work.wait()
    ok = returned < 0.1 and np.array_equal(x, np.full(1000, world.size * (world.size + 1) / 2))
    assert_all_ranks(ok or world.rank, f"rank 0's iallreduce took {returned:.3f} s to return (or a wrong sum)", world)


@pytest.mark.mpi(min_size=2)
@pytest.mark.skipif(TCP_MODE, reason="the mpi backend runs under an MPI launcher only")
@pytest.mark.parametrize("extra", [-3, 5, 40000], ids=lambda n: f"count{n:+d}")
def test_the_mpi_backends_non_blocking_mismatch_raises_on_every_rank_and_never_runs_the_mismatched_data(
        extra, world, assert_all_ranks):
    """MPICH's all-reduce of mismatched counts corrupts the heap (the job then dies at exit): the data must not start."""
    comm = create("mpi", world.fresh(), timeout=30, check_args=True)
    n = 1000 + (extra if world.rank == world.size - 1 else 0)
    error = ""
    try:
        works = [comm.iallreduce(np.ones(n)), comm.iallreduce(np.ones(10))]   # a second call behind it
        works[0].wait()
    except CollectiveMismatchError as exc:
        error = str(exc)
    ok = "differing fields: count" in error and f"rank {world.size - 1} called" in error
    assert_all_ranks(ok, f"no count mismatch error: {error!r}", world)
