"""Bad arguments: every backend raises a clear TypeError/ValueError naming the bad value, before any message."""

import numpy as np

from npddp.comm import create
from npddp.comm.checks import USER_TAG_LIMIT


def bad_calls(comm):
    """(what, call, exception type, text the message must contain) for every kind of bad argument."""
    k = comm.size
    x = np.zeros(6, dtype=np.float32)
    ro = np.zeros(6, dtype=np.float32)
    ro.flags.writeable = False
    strided = np.zeros(12, dtype=np.float32)[::2]
    wide = np.zeros(12, dtype=np.float32)
    cases = [
        ("allreduce strided", lambda: comm.allreduce(strided), ValueError, "C-contiguous"),
        ("allreduce read-only in place", lambda: comm.allreduce(ro), ValueError, "read-only"),
        ("allreduce list", lambda: comm.allreduce([1.0, 2.0]), TypeError, "list"),
        ("allreduce op", lambda: comm.allreduce(x, "mean"), ValueError, "'mean'"),
        ("allreduce op None", lambda: comm.allreduce(x, None), ValueError, "None"),
        ("allreduce output as op", lambda: comm.allreduce(x, np.zeros(6, np.float32)), ValueError, "out="),
        ("allreduce out shape", lambda: comm.allreduce(x, out=np.zeros(7, np.float32)), ValueError, "(7,)"),
        ("allreduce out dtype", lambda: comm.allreduce(x, out=np.zeros(6, np.float64)), ValueError, "float64"),
        ("allreduce out read-only", lambda: comm.allreduce(x, out=ro), ValueError, "read-only"),
        ("allreduce out strided", lambda: comm.allreduce(x, out=strided), ValueError, "C-contiguous"),
        ("allreduce out overlaps", lambda: comm.allreduce(wide[:6], out=wide[3:9]), ValueError, "overlaps"),
        ("iallreduce read-only", lambda: comm.iallreduce(ro), ValueError, "read-only"),
        ("iallreduce strided", lambda: comm.iallreduce(strided), ValueError, "C-contiguous"),
        ("iallreduce op", lambda: comm.iallreduce(x, "average"), ValueError, "'average'"),
        ("broadcast root too big", lambda: comm.broadcast(x, root=k), ValueError, f"root={k}"),
        ("broadcast root negative", lambda: comm.broadcast(x, root=-1), ValueError, "root=-1"),
        ("broadcast root float", lambda: comm.broadcast(x, root=0.0), TypeError, "float"),
        ("broadcast read-only", lambda: comm.broadcast(ro), ValueError, "read-only"),
        ("reduce_scatter op", lambda: comm.reduce_scatter(x, "median"), ValueError, "'median'"),
        ("reduce_scatter strided", lambda: comm.reduce_scatter(strided), ValueError, "C-contiguous"),
        ("allgather strided", lambda: comm.allgather(strided), ValueError, "C-contiguous"),
        ("gather root", lambda: comm.gather(x, root=k), ValueError, f"root={k}"),
        ("scatter root", lambda: comm.scatter(np.zeros((k, 2)), root=k + 2), ValueError, f"root={k + 2}"),
        ("scatter leading dim", lambda: comm.scatter(np.zeros((k + 1, 2))), ValueError, f"({k + 1}, 2)"),
        ("scatter 0-d", lambda: comm.scatter(np.zeros(())), ValueError, "()"),
        ("send dest", lambda: comm.send(x, dest=k), ValueError, f"dest={k}"),
        ("send tag negative", lambda: comm.send(x, dest=0, tag=-1), ValueError, "tag=-1"),
        ("send tag reserved", lambda: comm.send(x, dest=0, tag=USER_TAG_LIMIT), ValueError, f"tag={USER_TAG_LIMIT}"),
        ("send tag str", lambda: comm.send(x, dest=0, tag="1"), TypeError, "str"),
        ("send strided", lambda: comm.send(strided, dest=0), ValueError, "C-contiguous"),
        ("recv source", lambda: comm.recv(x, source=-2), ValueError, "source=-2"),
        ("recv tag", lambda: comm.recv(x, source=0, tag=USER_TAG_LIMIT + 5), ValueError, f"tag={USER_TAG_LIMIT + 5}"),
        ("recv read-only", lambda: comm.recv(ro, source=0), ValueError, "read-only"),
    ]
    for dtype in ("complex64", "bool", "uint8"):
        bad = np.zeros(4, dtype=dtype)
        cases += [
            (f"allreduce {dtype}", lambda b=bad: comm.allreduce(b), TypeError, dtype),
            (f"allreduce {dtype} out=", lambda b=bad: comm.allreduce(b, out=np.zeros_like(b)), TypeError, dtype),
            (f"iallreduce {dtype}", lambda b=bad: comm.iallreduce(b), TypeError, dtype),
            (f"broadcast {dtype}", lambda b=bad: comm.broadcast(b), TypeError, dtype),
            (f"reduce_scatter {dtype}", lambda b=bad: comm.reduce_scatter(b), TypeError, dtype),
            (f"allgather {dtype}", lambda b=bad: comm.allgather(b), TypeError, dtype),
            (f"gather {dtype}", lambda b=bad: comm.gather(b), TypeError, dtype),
            (f"scatter {dtype}", lambda d=dtype: comm.scatter(np.zeros((k, 2), dtype=d)), TypeError, dtype),
            (f"send {dtype}", lambda b=bad: comm.send(b, dest=0), TypeError, dtype),
            (f"recv {dtype}", lambda b=bad: comm.recv(b, source=0), TypeError, dtype),
        ]
    return cases


def test_bad_arguments_raise_before_any_message(backend, group, counting, values, assert_all_ranks,
                                                assert_ranks_agree):
    raw = group if backend == "mpi" else counting(group)
    comm = create(backend, raw)
    before = 0 if backend == "mpi" else raw.messages()  # setup (shm, hier, auto) may exchange messages
    problems = []
    for what, call, kind, text in bad_calls(comm):
        try:
            call()
            problems.append(f"{what}: no error")
        except (TypeError, ValueError) as err:
            if type(err) is not kind or text not in str(err):
                problems.append(f"{what}: {type(err).__name__}({err}), expected {kind.__name__} naming {text!r}")
    if backend != "mpi" and raw.messages() != before:
        problems.append(f"bad calls sent messages: {dict(raw.calls)}")
    x = values.rank(1009, comm.rank, "float64", "sum")
    comm.allreduce(x, "sum")  # the next valid collective works on every rank
    if not np.array_equal(x, values.expected(1009, comm.size, "float64", "sum")):
        problems.append("the valid all-reduce after the bad calls is wrong")
    assert_ranks_agree(x, group)
    assert_all_ranks(not problems, "; ".join(problems[:6]), group)
