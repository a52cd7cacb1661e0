"""Each rank's inputs, derived from the program's seed, and NumPy's answer for every op.

Inputs depend only on (seed, op index, world rank, the op as that rank passes it), so any rank
computes any peer's input and the expected result without a message. ``exact`` inputs are small
integers whose sums and products are exact in every dtype, whatever the order of reduction: the
result must equal NumPy's bit for bit. ``random`` inputs (floats of every magnitude NumPy's normal
gives, integers over the whole range, wrapping) are compared with the rounding bound of a sum or
product of ``size`` terms in any order.
"""

from __future__ import annotations

import numpy as np

from npddp.comm import OPS

from tests.fuzz.program import Op, Program

#: What a receive buffer or an output holds before the call: any result that keeps it is wrong.
SENTINEL = -7


def values(seed: int, index: int, rank: int, op: Op, shape: tuple, salt: int = 0) -> np.ndarray:
    """Rank ``rank``'s input of ``shape`` for program op ``index`` (``salt`` tells several buffers of one op apart)."""
    rng = np.random.default_rng([seed & (2**63 - 1), index, rank, salt])
    dtype = np.dtype(op.dtype)
    n = int(np.prod(shape, dtype=np.int64))
    reduction = op.op if op.base in ("allreduce", "reduce_scatter") else None
    if op.values == "exact":
        if reduction == "sum":
            v = rng.integers(-3, 4, n)
        elif reduction == "prod":
            v = rng.choice(np.array([-2, -1, 1, 1, 2]), n)
        else:
            v = rng.integers(-1000, 1001, n)
        return v.astype(dtype).reshape(shape)
    if dtype.kind == "i":
        info = np.iinfo(dtype)
        span = 7 if reduction == "prod" and rng.random() < 0.5 else info.max
        return rng.integers(-span, span, n, dtype=dtype, endpoint=True).reshape(shape)
    if reduction == "prod":
        v = rng.uniform(0.5, 2.0, n) * rng.choice(np.array([-1.0, 1.0]), n)
    else:
        v = rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n)
    return v.astype(dtype).reshape(shape)


def buffer_shape(op: Op, size: int) -> tuple:
    """The shape of the buffer a rank passes: scatter's and alltoall's are ``(size, *block)``."""
    return (size, *op.shape) if op.base in ("scatter", "alltoall") else tuple(op.shape)


def alltoallv_counts(seed: int, index: int, op: Op, size: int) -> np.ndarray:
    """``counts[i, j]``: elements rank i of the communicator sends rank j in op ``index`` as ``op`` passes it.

    About a third of the pairs move nothing (the same pairs whatever ``op``); the others ``op.count`` and 0..3 more,
    always the pair to the next rank: a rank whose ``op.count`` differs disagrees with a peer on some count."""
    rng = np.random.default_rng([seed & (2**63 - 1), index, 7])
    zero = rng.random((size, size)) < 0.3
    zero[np.arange(size), (np.arange(size) + 1) % size] = False
    return np.where(zero, 0, op.count + rng.integers(0, 4, (size, size)))


def alltoallv_input(program: Program, index: int, world_rank: int, me: int, size: int) -> tuple:
    """``(buf, sendcounts, recvcounts)`` that ``world_rank`` (rank ``me`` of ``size``) passes to op ``index``."""
    op = program.op_of(world_rank, index)
    counts = alltoallv_counts(program.seed, index, op, size)
    send, recv = counts[me], counts[:, me]
    return values(program.seed, index, world_rank, op, (int(send.sum()),)), send, recv


def alltoallv_result(program: Program, index: int, members: tuple, me: int) -> np.ndarray:
    """What rank ``me`` of ``members`` receives: each member's block for it, in member order."""
    parts = []
    for s, world_rank in enumerate(members):
        buf, send, _ = alltoallv_input(program, index, world_rank, s, len(members))
        start = int(send[:me].sum())
        parts.append(buf[start:start + int(send[me])])
    return np.concatenate(parts)


def input_of(program: Program, index: int, world_rank: int, comm_size: int) -> np.ndarray:
    """What ``world_rank`` passes to op ``index`` (its own arguments, perturbed or not)."""
    op = program.op_of(world_rank, index)
    return values(program.seed, index, world_rank, op, buffer_shape(op, comm_size))


def reduce(stacked: np.ndarray, op: str, dtype) -> np.ndarray:
    """NumPy's reduction over axis 0: integers wrap as the backends' do; floats in float64 (rounded later)."""
    dtype = np.dtype(dtype)
    work = stacked if dtype.kind == "i" else stacked.astype(np.float64)
    return OPS[op].reduce(work, axis=0)


def bound(stacked: np.ndarray, op: str, want: np.ndarray, dtype) -> np.ndarray:
    """How far a float result of ``size`` terms reduced in any order may be from the exact float64 one."""
    eps = float(np.finfo(dtype).eps)
    terms = stacked.shape[0]
    scale = np.abs(stacked.astype(np.float64)).sum(axis=0) if op == "sum" else np.abs(want)
    return (2 * terms + 1) * eps * scale + float(np.finfo(dtype).smallest_subnormal) * terms


def compare(got, want: np.ndarray, dtype, exact: bool, stacked: np.ndarray | None = None,
            op: str = "sum") -> str | None:
    """None when ``got`` is NumPy's ``want`` (bitwise, or within the rounding bound of a float reduction);
    else what differs, in a few words."""
    dtype = np.dtype(dtype)
    if not isinstance(got, np.ndarray):
        return f"returned {type(got).__name__}, expected an array"
    if got.dtype != dtype or got.shape != want.shape:
        return f"returned {got.dtype}{got.shape}, expected {dtype}{want.shape}"
    if exact or dtype.kind == "i" or op in ("max", "min") or stacked is None:
        expected = want.astype(dtype)
        if np.array_equal(_bytes(got), _bytes(expected)):
            return None
        bad = np.flatnonzero(got.ravel() != expected.ravel())
        where = int(bad[0]) if bad.size else 0
        return (f"{bad.size} of {got.size} elements differ from NumPy's; first at {where}: "
                f"{got.ravel()[where]!r}, expected {expected.ravel()[where]!r}")
    err = np.abs(got.astype(np.float64) - want)
    limit = bound(stacked, op, want, dtype)
    over = np.flatnonzero((err > limit).ravel() | ~np.isfinite(got.ravel()))
    if not over.size:
        return None
    w = int(over[0])
    return (f"{over.size} of {got.size} elements beyond the rounding bound; first at {w}: {got.ravel()[w]!r}, "
            f"NumPy {want.ravel()[w]!r} (bound {limit.ravel()[w]:.3g})")


def _bytes(a: np.ndarray) -> np.ndarray:
    """The bytes of ``a``, flat (0-d and empty arrays included)."""
    return np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def reduced(program: Program, index: int, members: tuple) -> tuple:
    """``(want, stacked)``: NumPy's reduction of every member's input to op ``index``, and the inputs stacked."""
    op = program.ops[index]
    stacked = np.stack([input_of(program, index, r, len(members)) for r in members])
    return reduce(stacked, op.op, op.dtype), stacked
