"""What all backends share: the op table, argument checks, timeouts, block layout and the settings every
communicator reads from the environment (``NPDDP_DEBUG``, ``NPDDP_CHECK_ARGS``, ``NPDDP_TIMEOUT``).

Every check here runs before a backend sends a single message, so a bad argument
raises the same error on the rank that passed it and nothing is left half-sent.
"""

from __future__ import annotations

import numpy as np

from npddp.util import variables

#: Supported element types, by NumPy name.
DTYPES = ("float16", "float32", "float64", "int32", "int64")
_DTYPE_SET = frozenset(np.dtype(d) for d in DTYPES)

#: Reduction name -> NumPy ufunc applied elementwise (``ufunc(a, b, out=a)``).
OPS = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}
#: The average: a sum scaled by 1/N where each reduced block is complete (floating dtypes only).
AVG = "avg"
#: Every reduction name the reducing collectives accept.
REDUCTIONS = (*OPS, AVG)
#: Dtypes ``avg`` accepts (an integer mean is not an integer; sum and divide as you need).
AVG_DTYPES = ("float16", "float32", "float64")

#: Tags below this bound are the user's (``send``/``recv``); collectives use the ones above.
USER_TAG_LIMIT = 1 << 14
COLLECTIVE_TAG_SPAN = 1 << 14


#: Seconds the hand-written backends wait for a peer before raising TimeoutError (declared with ``NPDDP_TIMEOUT``).
DEFAULT_TIMEOUT = float(variables.TIMEOUT.default)


def check_timeout(value, what: str = "timeout") -> float:
    """Return a timeout in seconds as float; ``float('inf')`` waits forever. TypeError/ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} must be a number of seconds, got {type(value).__name__}")
    if not value > 0:  # also rejects NaN
        raise ValueError(f"{what}={value} is out of range; valid: seconds > 0 (inf: wait forever)")
    return float(value)


def debug_from_env(environ=None) -> bool:
    """``NPDDP_DEBUG`` as a bool (unset: False); ValueError naming the valid values otherwise."""
    return variables.flag(variables.DEBUG, environ)


def check_args_from_env(environ=None) -> bool:
    """``NPDDP_CHECK_ARGS`` as a bool (unset: True); ValueError naming the valid values otherwise."""
    return variables.flag(variables.CHECK_ARGS, environ)


def timeout_from_env(environ=None) -> float:
    """``NPDDP_TIMEOUT`` in seconds (unset or empty: ``DEFAULT_TIMEOUT``); ValueError when malformed."""
    value = variables.number(variables.TIMEOUT, environ, "seconds > 0 (inf: wait forever)")
    return DEFAULT_TIMEOUT if value is None else check_timeout(value, variables.TIMEOUT.name)


def check_op(op: str):
    """Return the ufunc for reduction ``op`` (``avg``: the sum's); ValueError naming the valid ops otherwise."""
    if not isinstance(op, str):
        hint = " (an array where op goes: pass the output as out=)" if isinstance(op, np.ndarray) else ""
        raise ValueError(f"unsupported op {op!r}{hint}; valid ops: {', '.join(REDUCTIONS)}")
    if op == AVG:
        return np.add
    try:
        return OPS[op]
    except KeyError:
        raise ValueError(f"unsupported op {op!r}; valid ops: {', '.join(REDUCTIONS)}") from None


def average_scale(op: str, buf: np.ndarray, size: int) -> float:
    """The factor ``avg`` applies after summing (1/size), 0.0 for the other ops; TypeError for an integer ``avg``."""
    if op != AVG:
        return 0.0
    if buf.dtype.name not in AVG_DTYPES:
        raise TypeError(f"op='avg' needs a floating dtype, got {buf.dtype}; valid dtypes for avg: "
                        f"{', '.join(AVG_DTYPES)} (for integers use op='sum' and divide as you need)")
    return 1.0 / size if size > 1 else 0.0


def check_buffer(buf, what: str = "buf", writable: bool = True) -> np.ndarray:
    """Validate a communication buffer: ndarray, supported dtype, C-contiguous, writable if asked."""
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{what} must be a numpy.ndarray, got {type(buf).__name__}")
    if buf.dtype not in _DTYPE_SET:
        raise TypeError(f"{what} has unsupported dtype {buf.dtype}; valid dtypes: {', '.join(DTYPES)}")
    flags = buf.flags
    if not flags.c_contiguous:
        if writable:   # a copy would be reduced and the array itself left unchanged
            raise ValueError(f"{what} must be C-contiguous (got strides {buf.strides} for shape {buf.shape}): "
                             "the result is written into it, and a contiguous copy would leave it unchanged; "
                             "reduce a copy and copy the result back (tmp = np.ascontiguousarray(x); "
                             "comm.allreduce(tmp); x[...] = tmp)")
        raise ValueError(f"{what} must be C-contiguous (got strides {buf.strides} for shape {buf.shape}); "
                         "pass np.ascontiguousarray(...)")
    if writable and not flags.writeable:
        raise ValueError(f"{what} is read-only but the operation writes into it")
    return buf


def check_out(buf: np.ndarray, out) -> np.ndarray:
    """Validate an ``out=`` array against its input: same shape and dtype, writable, no overlap."""
    check_buffer(out, "out")
    if out.shape != buf.shape or out.dtype != buf.dtype:
        raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}; expected shape {buf.shape} "
                         f"and dtype {buf.dtype} like the input")
    if out is not buf and np.shares_memory(out, buf):
        raise ValueError("out overlaps the input buffer; pass out=None for an in-place operation")
    return out


def check_rank(value, size: int, what: str = "root") -> int:
    """Return ``value`` as an int rank; ValueError naming the valid range otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {type(value).__name__}")
    if not 0 <= value < size:
        raise ValueError(f"{what}={value} is out of range; valid ranks: 0..{size - 1}")
    return int(value)


def check_tag(tag) -> int:
    """Return a user tag as int; ValueError unless 0 <= tag < USER_TAG_LIMIT."""
    if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)):
        raise TypeError(f"tag must be an int, got {type(tag).__name__}")
    if not 0 <= tag < USER_TAG_LIMIT:
        raise ValueError(f"tag={tag} is out of range; valid tags: 0..{USER_TAG_LIMIT - 1}")
    return int(tag)


def check_stacked(buf, size: int, what: str = "buf") -> np.ndarray:
    """Validate a ``(size, *block)`` buffer as used by scatter."""
    check_buffer(buf, what, writable=False)
    if buf.ndim == 0 or buf.shape[0] != size:
        raise ValueError(f"{what} has shape {buf.shape}; expected (size={size}, *block)")
    return buf


def block_bounds(n: int, size: int) -> np.ndarray:
    """Offsets of ``np.array_split`` blocks: block i is ``[b[i], b[i+1])``; shape (size + 1,)."""
    q, r = divmod(n, size)
    counts = np.full(size, q, dtype=np.int64)
    counts[:r] += 1
    bounds = np.zeros(size + 1, dtype=np.int64)
    np.cumsum(counts, out=bounds[1:])
    return bounds


def check_block_out(buf: np.ndarray, out, size: int, rank: int) -> np.ndarray:
    """``out=`` of a reduce-scatter: 1-d, ``buf``'s dtype, this rank's block length, no overlap (None: allocate)."""
    q, r = divmod(buf.size, size)
    count = q + (rank < r)
    if out is None:
        return np.empty(count, dtype=buf.dtype)
    check_buffer(out, "out")
    if out.shape != (count,) or out.dtype != buf.dtype:
        raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}; expected shape ({count},) and dtype "
                         f"{buf.dtype}: this rank's block of np.array_split(buf.ravel(), {size})")
    if np.shares_memory(out, buf):
        raise ValueError("out overlaps the input buffer of a reduce-scatter; pass a separate array")
    return out


def check_stacked_out(buf: np.ndarray, out, size: int, rank: int) -> np.ndarray:
    """``out=`` of an all-gather: shape ``(size, *buf.shape)``, ``buf``'s dtype (None: allocate).

    ``buf`` may overlap ``out`` only as exactly ``out[rank]`` (an in-place all-gather)."""
    if out is None:
        return np.empty((size, *buf.shape), dtype=buf.dtype)
    check_buffer(out, "out")
    if out.shape != (size, *buf.shape) or out.dtype != buf.dtype:
        raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}; expected shape {(size, *buf.shape)} "
                         f"and dtype {buf.dtype}")
    if np.shares_memory(out, buf) and not is_row(buf, out, rank):
        raise ValueError(f"out overlaps the input buffer other than as out[{rank}] (an in-place all-gather); "
                         "pass a separate array or out[rank] itself")
    return out


def is_row(buf: np.ndarray, out: np.ndarray, rank: int) -> bool:
    """True when ``buf`` is exactly the memory of ``out[rank]`` (an in-place all-gather's input)."""
    row = out.reshape(out.shape[0], -1)[rank]  # (buf.size,)
    return (buf.size == row.size and buf.size > 0
            and buf.__array_interface__["data"][0] == row.__array_interface__["data"][0])


def check_alltoall(buf, out, size: int) -> np.ndarray:
    """An all-to-all's ``buf`` of shape ``(size, *block)`` and ``out`` of the same shape and dtype, apart from
    ``buf`` (None: allocate); returns ``out``."""
    check_stacked(buf, size)
    if out is None:
        return np.empty_like(buf)
    check_buffer(out, "out")
    if out.shape != buf.shape or out.dtype != buf.dtype:
        raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}; expected shape {buf.shape} and dtype "
                         f"{buf.dtype} like buf (size={size}, *block)")
    if np.shares_memory(out, buf):
        raise ValueError("out overlaps buf in an all-to-all; pass a separate array")
    return out


def check_counts(counts, size: int, what: str) -> np.ndarray:
    """Per-peer element counts: ``size`` ints >= 0 (list, tuple or integer array) as an int64 array of shape (size,)."""
    if isinstance(counts, np.ndarray):
        if counts.dtype.kind not in "iu":
            raise TypeError(f"{what} must hold integers, got dtype {counts.dtype}")
        values = counts.reshape(-1).astype(np.int64)
    elif isinstance(counts, (list, tuple)):
        bad = [v for v in counts if isinstance(v, bool) or not isinstance(v, (int, np.integer))]
        if bad:
            raise TypeError(f"{what} must hold ints, got {bad[0]!r} ({type(bad[0]).__name__})")
        values = np.array(counts, dtype=np.int64).reshape(-1)
    else:
        raise TypeError(f"{what} must be a list, tuple or integer array of {size} counts, got {type(counts).__name__}")
    if values.size != size:
        raise ValueError(f"{what} has {values.size} counts; expected one per rank: {size}")
    if values.size and values.min() < 0:
        raise ValueError(f"{what}={values.tolist()} holds a negative count; valid counts: >= 0")
    return values


def check_alltoallv(buf, sendcounts, recvcounts, out, size: int, rank: int):
    """An all-to-all-v's arguments: ``(sendcounts, recvcounts, flat buf, out)``; ``buf`` holds ``sum(sendcounts)``
    elements (any shape, read flat), ``out`` is 1-d of ``sum(recvcounts)`` elements and ``buf``'s dtype (None:
    allocate), and this rank's block to itself has one count both ways."""
    check_buffer(buf, writable=False)
    send, recv = check_counts(sendcounts, size, "sendcounts"), check_counts(recvcounts, size, "recvcounts")
    if int(send.sum()) != buf.size:
        raise ValueError(f"sendcounts={send.tolist()} add up to {int(send.sum())} elements but buf holds {buf.size}; "
                         "valid: sum(sendcounts) == buf.size")
    if send[rank] != recv[rank]:
        raise ValueError(f"sendcounts[{rank}]={send[rank]} but recvcounts[{rank}]={recv[rank]}: rank {rank}'s block "
                         "to itself must have one count both ways")
    total = int(recv.sum())
    if out is None:
        out = np.empty(total, dtype=buf.dtype)
    else:
        check_buffer(out, "out")
        if out.shape != (total,) or out.dtype != buf.dtype:
            raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}; expected shape ({total},) "
                             f"(sum(recvcounts)) and dtype {buf.dtype}")
        if np.shares_memory(out, buf):
            raise ValueError("out overlaps buf in an all-to-all-v; pass a separate array")
    return send, recv, buf.reshape(-1), out
