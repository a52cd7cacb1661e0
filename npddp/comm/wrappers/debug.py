"""Debug mode: a communicator wrapper that checks, before every collective, that all ranks make the same call.

Ranks that call different collectives (or the same one with a different dtype, element count,
reduction op or root) hang, or return garbage, in any backend. :class:`DebugCommunicator`
turns that into an error. Before each collective every rank writes a fingerprint of its call
into ``FINGERPRINT_LENGTH`` int64s: the call's number, operation, dtype, element count, shape,
reduction op and root, and all-gathers it through the wrapped backend's own ``allgather``.
That exchange has the same shape on every rank, so it can never mismatch itself. Every rank
compares the same table, so when the rows differ every rank raises the same
:class:`CollectiveMismatchError`, naming the ranks and the fields that differ, and no rank starts
the collective. Arguments are checked first, exactly as the backends check them.

What must agree: the operation and the call number always; dtype and element count for
everything but barrier; op for the reductions; root for broadcast, gather and scatter; the full
shape for allgather, gather and scatter, whose result shape depends on it (a reduction or a
broadcast may reshape freely, as the backends allow). ``send``/``recv`` are point-to-point and
pass through unchecked; so do ``Work`` handles from ``iallreduce``.

Cost: one extra all-gather of ``size * FINGERPRINT_LENGTH`` int64s per collective, latency bound
(measured: docs/results/2026-11-25-development-machine.md, "The NPDDP_DEBUG checker's cost").
"""

from __future__ import annotations

import numpy as np

from npddp.comm import checks as c
from npddp.comm.signature import CollectiveMismatchError, typed

__all__ = ["CollectiveMismatchError", "DebugCommunicator", "FINGERPRINT_LENGTH", "describe", "encode", "mismatch"]

#: Collectives in fingerprint order; a fingerprint stores the index.
OPERATIONS = ("barrier", "broadcast", "allreduce", "iallreduce", "reduce_scatter", "allgather", "gather", "scatter",
              "ireduce_scatter", "iallgather", "alltoall", "ialltoall", "alltoallv", "ialltoallv")
_REDUCING = frozenset({"allreduce", "iallreduce", "reduce_scatter", "ireduce_scatter"})
_ROOTED = frozenset({"broadcast", "gather", "scatter"})
_SHAPED = frozenset({"allgather", "gather", "scatter", "iallgather", "alltoall", "ialltoall"})
_OP_NAMES = c.REDUCTIONS
_OPERATION_CODE = {name: i for i, name in enumerate(OPERATIONS)}
_OP_CODE = {name: i for i, name in enumerate(_OP_NAMES)}
_DTYPE_CODE = {name: i for i, name in enumerate(c.DTYPES)}

#: Dimensions stored in a fingerprint; deeper shapes fold the rest into the last slot.
MAX_DIMS = 8
#: Field name -> its slots in a fingerprint.
FIELDS = {"sequence": slice(0, 1), "operation": slice(1, 2), "dtype": slice(2, 3), "count": slice(3, 4),
          "op": slice(4, 5), "root": slice(5, 6), "shape": slice(6, 7 + MAX_DIMS)}
FINGERPRINT_LENGTH = 7 + MAX_DIMS
_NONE = -1


def encode(out: np.ndarray, sequence: int, operation: str, buf=None, op=None, root=None) -> np.ndarray:
    """Write the fingerprint of one call into ``out`` (FINGERPRINT_LENGTH int64s); return it."""
    values = [sequence, _OPERATION_CODE[operation], _NONE, _NONE,
              _NONE if op is None else _OP_CODE[op], _NONE if root is None else root]
    if buf is None:
        values += [_NONE] * (1 + MAX_DIMS)
    else:
        shape = buf.shape
        values[2:4] = _DTYPE_CODE[buf.dtype.name], buf.size
        if len(shape) > MAX_DIMS:
            shape = (*shape[:MAX_DIMS - 1], _fold(shape[MAX_DIMS - 1:]))
        values += [buf.ndim, *shape, *[_NONE] * (MAX_DIMS - len(shape))]
    out[:] = values
    return out


def _fold(dims) -> int:
    """A stable 61-bit digest of trailing dimensions."""
    h = 0
    for d in dims:
        h = (h * 1_000_003 + int(d) + 1) % ((1 << 61) - 1)
    return h


def describe(row: np.ndarray) -> str:
    """A fingerprint as a call, e.g. ``allreduce(op=sum, float32, shape (10,))``."""
    code, dtype, op, root, ndim = (int(row[FIELDS[f].start]) for f in ("operation", "dtype", "op", "root", "shape"))
    name = OPERATIONS[code] if 0 <= code < len(OPERATIONS) else f"operation#{code}"
    args = []
    if op != _NONE:
        args.append(f"op={_OP_NAMES[op] if 0 <= op < len(_OP_NAMES) else op}")
    if root != _NONE:
        args.append(f"root={root}")
    if dtype != _NONE:
        args.append(c.DTYPES[dtype] if 0 <= dtype < len(c.DTYPES) else f"dtype#{dtype}")
        if 0 <= ndim <= MAX_DIMS:
            args.append(f"shape {tuple(int(d) for d in row[7:7 + ndim])}")
        else:
            args.append(f"{ndim}-d shape of {int(row[FIELDS['count'].start])} elements")
    return f"{name}({', '.join(args)})"


def differing_fields(a: np.ndarray, b: np.ndarray) -> list[str]:
    """Names of the fields in which fingerprints ``a`` and ``b`` differ, for the operation(s) they name."""
    same_op = a[1] == b[1]
    shaped = 0 <= a[1] < len(OPERATIONS) and OPERATIONS[int(a[1])] in _SHAPED
    return [name for name, s in FIELDS.items()
            if not (name == "shape" and same_op and not shaped) and not np.array_equal(a[s], b[s])]


def mismatch(table: np.ndarray) -> str | None:
    """The error message for a ``(size, FINGERPRINT_LENGTH)`` table of fingerprints, or None if they agree."""
    if table.tobytes() == table[0].tobytes() * len(table):  # the usual case: identical rows
        return None
    groups: dict[bytes, list[int]] = {}
    for r in range(len(table)):
        groups.setdefault(table[r].tobytes(), []).append(r)
    ref = table[0]
    others = [ranks for ranks in groups.values() if differing_fields(ref, table[ranks[0]])]
    if not others:
        return None
    fields = sorted({f for ranks in others for f in differing_fields(ref, table[ranks[0]])}, key=list(FIELDS).index)
    numbered = "sequence" in fields

    def call(ranks):
        row = table[ranks[0]]
        prefix = f"#{int(row[0])} " if numbered else ""
        return f"{'rank' if len(ranks) == 1 else 'ranks'} {', '.join(map(str, ranks))} called {prefix}{describe(row)}"

    base = [r for r in range(len(table)) if not differing_fields(ref, table[r])]
    return (f"collective #{int(ref[0])} mismatch: {', '.join(call(ranks) for ranks in others)} but {call(base)}; "
            f"differing fields: {', '.join(fields)}")


class DebugCommunicator:
    """Wraps any backend; before every collective, checks that all ranks make the same call.

    Attributes it does not have itself (``timeout``, ``chunk_bytes``, ...) are read from and
    written to the wrapped communicator, so the wrapper can stand in for it anywhere.
    """

    __slots__ = ("inner", "_count", "_mine")

    def __init__(self, inner):
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "_count", 0)
        object.__setattr__(self, "_mine", np.empty(FINGERPRINT_LENGTH, dtype=np.int64))  # (FINGERPRINT_LENGTH,)

    def __getattr__(self, name):
        if name == "inner":  # not yet set: no wrapped communicator to ask
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __setattr__(self, name, value):
        if name in DebugCommunicator.__slots__:
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self.inner.rank

    @property
    def size(self) -> int:
        """Number of ranks."""
        return self.inner.size

    @property
    def name(self) -> str:
        """The wrapped backend's name."""
        return self.inner.name

    def split(self, color, key=0):
        """The wrapped backend's split, its child checked as this one is (None where the color is undefined)."""
        child = self.inner.split(color, key)
        return None if child is None else DebugCommunicator(child)

    @property
    def collectives(self) -> int:
        """Collectives checked so far (the number of the last one)."""
        return self._count

    def _check(self, operation: str, buf=None, op=None, root=None) -> None:
        """Exchange this call's fingerprint; CollectiveMismatchError on every rank unless all agree."""
        self._count += 1
        mine = encode(self._mine, self._count, operation, buf, op, root)
        try:
            table = self.inner.allgather(mine)  # (size, FINGERPRINT_LENGTH)
        except TimeoutError as exc:
            raise TimeoutError(f"collective #{self._count} {describe(mine)}: the ranks did not all arrive "
                               f"for its debug check: {exc}") from exc
        message = mismatch(table)
        if message is not None:
            raise CollectiveMismatchError(message)

    # --- collectives: check the arguments, then the fingerprints, then run ------------
    def barrier(self) -> None:
        """Checked barrier."""
        self._check("barrier")
        self.inner.barrier()

    def broadcast(self, buf, root=0):
        """Checked broadcast."""
        c.check_buffer(buf)
        root = c.check_rank(root, self.size)
        self._check("broadcast", buf, root=root)
        return self.inner.broadcast(buf, root)

    def allreduce(self, buf, op="sum", out=None):
        """Checked allreduce."""
        self._check_reduction(buf, op, out)
        self._check("allreduce", buf, op=op)
        return self.inner.allreduce(buf, op, out)

    def iallreduce(self, buf, op="sum"):
        """Checked iallreduce; the wrapped backend's Work handle is returned as is."""
        self._check_reduction(buf, op, None)
        self._check("iallreduce", buf, op=op)
        return self.inner.iallreduce(buf, op)

    def _check_reduction(self, buf, op, out) -> None:
        c.check_op(op)
        if out is None:
            c.check_buffer(buf)
        else:
            c.check_buffer(buf, writable=False)
            c.check_out(buf, out)
        c.average_scale(op, buf, self.size)

    def reduce_scatter(self, buf, op="sum"):
        """Checked reduce_scatter."""
        c.check_op(op)
        c.check_buffer(buf, writable=False)
        c.average_scale(op, buf, self.size)
        self._check("reduce_scatter", buf, op=op)
        return self.inner.reduce_scatter(buf, op)

    def allgather(self, buf):
        """Checked allgather."""
        c.check_buffer(buf, writable=False)
        self._check("allgather", buf)
        return self.inner.allgather(buf)

    def gather(self, buf, root=0):
        """Checked gather."""
        c.check_buffer(buf, writable=False)
        root = c.check_rank(root, self.size)
        self._check("gather", buf, root=root)
        return self.inner.gather(buf, root)

    def scatter(self, buf, root=0):
        """Checked scatter."""
        c.check_stacked(buf, self.size)
        root = c.check_rank(root, self.size)
        self._check("scatter", buf, root=root)
        return self.inner.scatter(buf, root)

    def send(self, buf, dest, tag=0):
        """Point-to-point: passed through unchecked."""
        self.inner.send(buf, dest, tag)

    def recv(self, buf, source, tag=0, status=None):
        """Point-to-point: passed through unchecked."""
        return self.inner.recv(buf, source, tag, status)

    def ireduce_scatter(self, buf, op="sum", out=None):
        """Checked ireduce_scatter; the wrapped backend's Work handle is returned as is."""
        c.check_op(op)
        c.check_buffer(buf, writable=False)
        c.average_scale(op, buf, self.size)
        c.check_block_out(buf, out, self.size, self.rank)
        self._check("ireduce_scatter", buf, op=op)
        return self.inner.ireduce_scatter(buf, op, out)

    def iallgather(self, buf, out=None):
        """Checked iallgather; the wrapped backend's Work handle is returned as is."""
        c.check_buffer(buf, writable=False)
        c.check_stacked_out(buf, out, self.size, self.rank)
        self._check("iallgather", buf)
        return self.inner.iallgather(buf, out)

    def alltoall(self, buf, out=None):
        """Checked alltoall."""
        c.check_alltoall(buf, out, self.size)
        self._check("alltoall", buf)
        return self.inner.alltoall(buf, out)

    def ialltoall(self, buf, out=None):
        """Checked ialltoall; the wrapped backend's Work handle is returned as is."""
        c.check_alltoall(buf, out, self.size)
        self._check("ialltoall", buf)
        return self.inner.ialltoall(buf, out)

    def alltoallv(self, buf, sendcounts, recvcounts, out=None):
        """Checked alltoallv: the operation and dtype here; every pair's counts by the backend's own check."""
        c.check_alltoallv(buf, sendcounts, recvcounts, out, self.size, self.rank)
        self._check("alltoallv", typed(buf.dtype))
        return self.inner.alltoallv(buf, sendcounts, recvcounts, out)

    def ialltoallv(self, buf, sendcounts, recvcounts, out=None):
        """Checked ialltoallv (as :meth:`alltoallv`); the wrapped backend's Work handle is returned as is."""
        c.check_alltoallv(buf, sendcounts, recvcounts, out, self.size, self.rank)
        self._check("ialltoallv", typed(buf.dtype))
        return self.inner.ialltoallv(buf, sendcounts, recvcounts, out)
