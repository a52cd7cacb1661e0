"""The communicator contract as a library: properties any backend (built in or a user's) must have.

Each property is a function ``(comm) -> list of cases``; a case runs the same collective calls
on every rank and returns None or what this rank saw wrong. :func:`run_contract` runs them
all, agrees across ranks on the first failing case of each property (through ``allgather``,
which every hand-written backend runs with the ring's schedule, not the all-reduce under
test) and returns one :class:`Outcome` per property, the same on every rank. ``python -m
npddp.check`` prints them; the test suite asserts on them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from npddp.comm.checks import DTYPES, OPS

#: Vector lengths the contract tries: empty, one element, fewer than ranks, not divisible, larger.
SIZES = (0, 1, 2, 3, 7, 100, 4099)
_MESSAGE_CHARS = 400


class Outcome(NamedTuple):
    """One property's verdict: its name, cases run, and the first failing case (None: passed)."""

    name: str
    cases: int
    failure: str | None


def _inputs(n: int, dtype: str, op: str, rank: int) -> np.ndarray:
    """Rank ``rank``'s exact input: small integers whose reduction no dtype rounds."""
    i = np.arange(n)
    if op == "prod":
        return np.where((i + rank) % 3 == 0, 2, np.where((i + rank) % 3 == 1, -1, 1)).astype(dtype)
    return (((i * 7 + rank * 3) % 11) - 5).astype(dtype)


def _expected(n: int, dtype: str, op: str, size: int) -> np.ndarray:
    stack = np.stack([_inputs(n, dtype, op, r) for r in range(size)]).astype(np.float64)
    return {"sum": stack.sum, "prod": stack.prod, "max": stack.max, "min": stack.min}[op](axis=0).astype(dtype)


def _case(what: str, dtype, op, n, rank) -> str:
    return f"{what} dtype={dtype} op={op} size={n} rank={rank}"


def exact_results(comm) -> list:
    """allreduce gives the exact reduction for every dtype, op and size."""
    out = []
    for dtype in DTYPES:
        for op in OPS:
            for n in SIZES:
                buf = _inputs(n, dtype, op, comm.rank)
                got = comm.allreduce(buf, op=op)
                want = _expected(n, dtype, op, comm.size)
                ok = np.array_equal(got, want) and got.dtype == want.dtype and got.shape == want.shape
                out.append(None if ok else f"{_case('allreduce', dtype, op, n, comm.rank)}: got "
                           f"{np.asarray(got).ravel()[:5]}..., expected {want[:5]}...")
    return out


def bit_identical(comm) -> list:
    """Random floats: every rank ends with the same bits."""
    out = []
    for dtype in ("float16", "float32", "float64"):
        for n in SIZES:
            rng = np.random.default_rng(1000 + comm.rank)
            buf = rng.standard_normal(n).astype(dtype)
            comm.allreduce(buf)
            bits = buf.view(np.int16 if dtype == "float16" else np.int32 if dtype == "float32" else np.int64)
            every = comm.allgather(bits.astype(np.int64))  # (size, n)
            bad = [r for r in range(comm.size) if not np.array_equal(every[r], every[0])]
            out.append(None if not bad else f"{_case('allreduce', dtype, 'sum', n, bad[0])}: bits differ from rank 0's")
    return out


def nonblocking(comm) -> list:
    """Several iallreduce in flight, waited in reverse order, equal the blocking results."""
    out = []
    for dtype in ("float32", "int64"):
        bufs = [_inputs(n, dtype, "sum", comm.rank) for n in SIZES]
        works = [comm.iallreduce(b) for b in bufs]
        for n, work in reversed(list(zip(SIZES, works))):
            got, want = work.wait(), _expected(n, dtype, "sum", comm.size)
            out.append(None if np.array_equal(got, want) else
                       f"{_case('iallreduce', dtype, 'sum', n, comm.rank)}: got {got[:5]}, expected {want[:5]}")
    return out


def out_of_place(comm) -> list:
    """allreduce(buf, out=...) fills ``out`` and leaves ``buf`` unchanged."""
    out = []
    for n in SIZES:
        buf = _inputs(n, "float64", "max", comm.rank)
        keep, res = buf.copy(), np.empty_like(buf)
        comm.allreduce(buf, op="max", out=res)
        ok = np.array_equal(res, _expected(n, "float64", "max", comm.size)) and np.array_equal(buf, keep)
        out.append(None if ok else f"{_case('allreduce out=', 'float64', 'max', n, comm.rank)}: wrong out or input changed")
    return out


def bad_input(comm) -> list:
    """Bad arguments raise TypeError/ValueError naming the value, before any message (the next call works)."""
    good = np.ones(5, dtype=np.float32)
    bad = [("dtype uint8", lambda: comm.allreduce(np.zeros(3, dtype=np.uint8)), TypeError, "uint8"),
           ("op 'xor'", lambda: comm.allreduce(good.copy(), op="xor"), ValueError, "xor"),
           ("a list", lambda: comm.allreduce([1.0, 2.0]), TypeError, "list"),
           ("non-contiguous", lambda: comm.allreduce(np.ones(10, dtype=np.float32)[::2]), ValueError, "contiguous")]
    out = []
    for what, call, kind, word in bad:
        try:
            call()
            problem = "no error raised"
        except kind as exc:
            problem = None if word in str(exc) else f"the message {str(exc)!r} does not name {word!r}"
        except Exception as exc:  # noqa: BLE001 - the wrong kind is the finding
            problem = f"raised {type(exc).__name__}, expected {kind.__name__}"
        after = comm.allreduce(good.copy())  # nothing was half-sent: the next call pairs up
        if problem is None and not np.array_equal(after, good * comm.size):
            problem = "the call after it gave a wrong result"
        out.append(None if problem is None else f"bad input {what} rank={comm.rank}: {problem}")
    return out


def other_collectives(comm) -> list:
    """broadcast, reduce_scatter and allgather agree with their definitions."""
    out = []
    for n in SIZES:
        b = _inputs(n, "float32", "sum", comm.rank)
        comm.broadcast(b, root=comm.size - 1)
        if not np.array_equal(b, _inputs(n, "float32", "sum", comm.size - 1)):
            out.append(f"broadcast dtype=float32 size={n} rank={comm.rank}: not the root's data")
        full = _expected(n, "int64", "sum", comm.size)
        mine = comm.reduce_scatter(_inputs(n, "int64", "sum", comm.rank))
        if not np.array_equal(mine, np.array_split(full, comm.size)[comm.rank]):
            out.append(f"reduce_scatter dtype=int64 op=sum size={n} rank={comm.rank}: wrong block")
        every = comm.allgather(_inputs(n, "int32", "sum", comm.rank))
        if not np.array_equal(every, np.stack([_inputs(n, "int32", "sum", r) for r in range(comm.size)])):
            out.append(f"allgather dtype=int32 size={n} rank={comm.rank}: wrong rows")
        out.append(None)
    return out


def _block(source: int, dest: int, n: int, dtype: str) -> np.ndarray:
    """What rank ``source`` sends rank ``dest`` in an all-to-all: ``n`` small integers, unique per pair."""
    return ((np.arange(n) * 7 + 31 * source + 5 * dest) % 1000).astype(dtype)


def all_to_all(comm) -> list:
    """alltoall, ialltoall and alltoallv (counts with zeros, per pair) deliver every block where it belongs."""
    out, k, rank = [], comm.size, comm.rank
    for dtype in DTYPES:
        for n in SIZES:
            buf = np.stack([_block(rank, d, n, dtype) for d in range(k)])   # (size, n)
            want = np.stack([_block(s, rank, n, dtype) for s in range(k)])
            got, late = comm.alltoall(buf), comm.ialltoall(buf).wait()
            counts = (n + np.add.outer(np.arange(k), 2 * np.arange(k))) % (n + 1)   # counts[i, j]: i sends j
            vbuf = np.concatenate([_block(rank, d, int(counts[rank, d]), dtype) for d in range(k)])
            vwant = np.concatenate([_block(s, rank, int(counts[s, rank]), dtype) for s in range(k)])
            vgot = comm.alltoallv(vbuf, counts[rank], counts[:, rank])
            if not (np.array_equal(got, want) and np.array_equal(late, want) and got.dtype == want.dtype):
                out.append(f"alltoall dtype={dtype} size={n} rank={rank}: wrong blocks")
            elif not (np.array_equal(vgot, vwant) and vgot.dtype == vwant.dtype):
                out.append(f"alltoallv dtype={dtype} size={n} rank={rank}: counts {counts[rank].tolist()}: wrong "
                           "blocks")
            else:
                out.append(None)
    return out


#: Every property, in the order they run.
PROPERTIES: dict[str, Callable] = {
    "allreduce exact for every dtype, op and size": exact_results,
    "bit-identical results on every rank": bit_identical,
    "iallreduce in flight, waited out of order": nonblocking,
    "out= fills out, input unchanged": out_of_place,
    "bad input raises before any message": bad_input,
    "broadcast, reduce_scatter, allgather": other_collectives,
    "alltoall, ialltoall, alltoallv": all_to_all,
}


def _agree(comm, failure: str | None) -> str | None:
    """The first failing case over ranks (lowest rank's), the same on every rank."""
    text = np.zeros(_MESSAGE_CHARS, dtype=np.int32)
    if failure:
        raw = np.frombuffer(failure.encode()[:_MESSAGE_CHARS - 1], dtype=np.uint8)
        text[:raw.size] = raw
    every = comm.allgather(text)  # (size, chars)
    for row in every:
        if row.any():
            return bytes(row[row > 0].astype(np.uint8)).decode(errors="replace")
    return None


def run_contract(comm, properties=None) -> list[Outcome]:
    """Run ``properties`` (names of :data:`PROPERTIES`; default all) on every rank; one Outcome each."""
    outcomes = []
    for name in properties or PROPERTIES:
        cases = PROPERTIES[name](comm)
        first = next((c for c in cases if c is not None), None)
        outcomes.append(Outcome(name, len(cases), _agree(comm, first)))
    return outcomes
