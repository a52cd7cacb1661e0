"""Collective calls on data whose exact result is known: the all-reduce sweep's ``#wrong`` check.

Rank r holds ``f((i + r) % m)`` at index i, for small integers f and a period m chosen so that
every partial result is exact in the dtype (float16 sums: up to 1024 ranks); the reduced
vector is then known exactly, whatever order a backend adds in. :func:`kernel` returns a
timed call on reused buffers and a checked call on fresh data that counts wrong elements.
All-reduce buffers come from ``comm.empty`` when the backend offers it (``shm``, ``hier``,
``auto`` on one node): shared memory, the way DDP allocates its gradient buckets.
"""

from __future__ import annotations

import numpy as np

from npddp import comm as npcomm

_EXACT_LIMIT = {"float16": 2**11, "float32": 2**24, "float64": 2**53, "int32": 2**31 - 1, "int64": 2**63 - 1}
_PERIOD = 1021  # a prime, so block-size shifts of the data are almost never invisible


def data_table(op: str, dtype: str, n: int) -> np.ndarray:
    """Values f(0..m-1) held by the ranks; shape (m,), int64, every reduction exact in ``dtype``."""
    if op == "prod":  # m >= n: each residue meets an index at most once, so products are in {±1, ±2}
        f = np.ones(max(_PERIOD, n), dtype=np.int64)
        f[0], f[1] = -1, 2
        return f
    m = _PERIOD if op in ("max", "min", "none") else max(1, min(_PERIOD, _EXACT_LIMIT[dtype] // n))
    return np.arange(m, dtype=np.int64)


def periodic(table: np.ndarray, start: int, length: int, dtype) -> np.ndarray:
    """``table[(start + i) % m]`` for i < length, as ``dtype``; shape (length,)."""
    m = table.size
    return np.resize(table[(start + np.arange(m)) % m].astype(dtype), length)


def reduced_table(f: np.ndarray, op: str, n: int) -> np.ndarray:
    """R[h] = op over ranks r < n of f[(h + r) % m]; shape (m,), int64."""
    m = f.size
    held = f[(np.arange(m)[:, None] + np.arange(n)[None, :]) % m]  # (m, n)
    return npcomm.OPS[op].reduce(held, axis=1)


def block(count: int, n: int, rank: int) -> tuple[int, int]:
    """[lo, hi) of ``rank``'s block of ``np.array_split(range(count), n)``."""
    q, r = divmod(count, n)
    lo = rank * q + min(rank, r)
    return lo, lo + q + (rank < r)


def _sentinel(dtype) -> float | int:
    """A value no exact result can take: NaN for floats, the minimum for ints."""
    dt = np.dtype(dtype)
    return np.nan if dt.kind == "f" else np.iinfo(dt).min


def _mismatches(got: np.ndarray, expected: np.ndarray) -> int:
    """Elements of ``got`` that differ from ``expected`` (all of them if the shapes differ)."""
    if got.shape != expected.shape:
        return max(got.size, expected.size)
    return int(np.count_nonzero(got != expected))


def _buffer(comm, data: np.ndarray, shared: bool = True) -> np.ndarray:
    """``data`` in an all-reduce buffer: from ``comm.empty`` (shared memory) when the backend offers it, as DDP
    does, and ``shared``; else an ordinary array."""
    empty = getattr(comm, "empty", None)
    if empty is None or not shared:
        return data
    buf = empty(data.shape, data.dtype)
    buf[...] = data
    return buf


def kernel(comm, collective: str, place: str, count: int, dtype: str, op: str, shared: bool = True):
    """(run, check): ``run()`` does one call on reused buffers; ``check()`` one on fresh data -> #wrong.

    ``shared``: all-reduce buffers from ``comm.empty``; else ordinary NumPy arrays.
    """
    n, rank = comm.size, comm.rank
    f = data_table(op, dtype, n)

    def own(length):
        """This rank's fresh check data."""
        return periodic(f, rank, length, dtype)

    if collective == "allgather":
        blk = count // n
        src = own(blk)
        return (lambda: comm.allgather(src),
                lambda: _mismatches(comm.allgather(own(blk)),
                                    np.stack([periodic(f, r, blk, dtype) for r in range(n)])))
    if collective == "alltoall":   # row p of rank s's input goes to rank p: it starts at f[s * n + p]
        blk = count // n

        def sent():
            """This rank's fresh input, shape (n, blk)."""
            return np.stack([periodic(f, rank * n + p, blk, dtype) for p in range(n)])
        src = sent()

        def check():
            fresh = sent()
            expected = np.stack([periodic(f, p * n + rank, blk, dtype) for p in range(n)])  # row p from rank p
            return _mismatches(comm.alltoall(fresh), expected) + _mismatches(fresh, src)
        return (lambda: comm.alltoall(src)), check
    if collective == "broadcast":
        buf = own(count)

        def check():
            buf[...] = periodic(f, 0, count, dtype) if rank == 0 else _sentinel(dtype)
            comm.broadcast(buf, 0)
            return _mismatches(buf, periodic(f, 0, count, dtype))
        return (lambda: comm.broadcast(buf, 0)), check
    total = reduced_table(f, op, n)
    if collective == "reduce_scatter":
        src = own(count)
        lo, hi = block(count, n, rank)
        return (lambda: comm.reduce_scatter(src, op),
                lambda: _mismatches(comm.reduce_scatter(own(count), op), periodic(total, lo, hi - lo, dtype)))
    buf = _buffer(comm, own(count), shared)
    if place == "inplace":
        def check():
            buf[...] = own(count)
            comm.allreduce(buf, op)
            return _mismatches(buf, periodic(total, 0, count, dtype))
        return (lambda: comm.allreduce(buf, op)), check
    out = _buffer(comm, np.empty_like(buf), shared)

    def check():
        buf[...] = own(count)
        out.fill(_sentinel(dtype))
        comm.allreduce(buf, op, out=out)
        return _mismatches(out, periodic(total, 0, count, dtype)) + _mismatches(buf, own(count))
    return (lambda: comm.allreduce(buf, op, out=out)), check
