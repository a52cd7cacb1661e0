"""The signature of one collective call: what every rank must pass alike, and the error when they do not.

A signature is ``WORDS`` int64s: the collective's kind, its number, dtype, element count, op
and root (:func:`words` gives them as a tuple, :data:`HEAD` packs them into a message). The
hand-written backends send it at the head of the first message of a call to each peer the
first time (:mod:`npddp.comm.engine.signed`; the number word -1 there, since the message's tag
already says which call it belongs to) and its index in the tag after that, the shared-memory
path folds it into one word of its control line (:func:`pack`), and the ``mpi`` backend agrees
on it with one small all-reduce before the data (:mod:`npddp.comm.mpi`). A rank that finds a peer's signature differs from its own raises
:class:`CollectiveMismatchError`, naming both ranks and the fields.

An all-to-all-v's counts differ per rank: its signature holds no count, and its counts are agreed
apart, every rank's row in one table (:func:`counts_table`, :func:`counts_disagreement`).

The blocking and non-blocking forms of a collective (``allreduce`` and ``iallreduce``, ...) have
the same kind: mixing them is allowed and gives the right result. The number is carried for the
message only: ranks number their calls alike, and a call skipped by one rank shows as a timeout.
"""

from __future__ import annotations

import struct

import numpy as np

from npddp.comm import checks as c

#: Kinds of collectives; the non-blocking forms share their blocking form's code.
KINDS = ("barrier", "broadcast", "allreduce", "reduce_scatter", "allgather", "gather", "scatter", "alltoall",
         "alltoallv")
_KIND_CODE = {**{k: i for i, k in enumerate(KINDS)},
              "iallreduce": 2, "ireduce_scatter": 3, "iallgather": 4, "ialltoall": 7, "ialltoallv": 8}
_DTYPE_CODE = {np.dtype(name): i for i, name in enumerate(c.DTYPES)}   # keyed by dtype: faster than its name
_OP_CODE = {name: i for i, name in enumerate(c.REDUCTIONS)}
#: Field names, in word order.
FIELDS = ("kind", "number", "dtype", "count", "op", "root")
WORDS = len(FIELDS)
_COMPARED = (0, 2, 3, 4, 5)   # every field but the number
_NONE = -1
#: The signature as the head of a message: ``WORDS`` little-endian int64s.
HEAD = struct.Struct(f"<{WORDS}q")
#: The signature of a message whose sender is not known to have signed it (a message of unexpected size).
UNKNOWN = (_NONE,) * WORDS


class CollectiveMismatchError(RuntimeError, ValueError):
    """Ranks called different collectives (or the same one with different arguments); raised on every rank."""


def kind_code(operation: str) -> int:
    """The kind code of a collective's name (``iallreduce`` counts as ``allreduce``); -1 for others."""
    return _KIND_CODE.get(operation, _NONE)


def words(operation: str, number: int, buf=None, op=None, root=None) -> tuple:
    """The signature of one call as a tuple of ``WORDS`` ints."""
    if buf is None:
        return (_KIND_CODE[operation], number, _NONE, _NONE, _NONE if op is None else _OP_CODE[op],
                _NONE if root is None else root)
    return (_KIND_CODE[operation], number, _DTYPE_CODE[buf.dtype], buf.size,
            _NONE if op is None else _OP_CODE[op], _NONE if root is None else root)


_TYPED: dict = {}   # dtype -> an empty array of it


def typed(dtype: np.dtype) -> np.ndarray:
    """An empty array of ``dtype``: what an all-to-all-v signs (its dtype, count 0: its counts are agreed apart,
    :mod:`npddp.comm.counts`)."""
    empty = _TYPED.get(dtype)
    if empty is None:
        empty = _TYPED[dtype] = np.empty(0, dtype=dtype)
    return empty


def encode(out: np.ndarray, operation: str, number: int, buf=None, op=None, root=None) -> np.ndarray:
    """Write the signature of one call into ``out`` (WORDS int64s); return it."""
    out[:] = words(operation, number, buf, op, root)
    return out


def agree(a, b) -> bool:
    """True when signatures ``a`` and ``b`` agree in every compared field."""
    return a[0] == b[0] and a[2] == b[2] and a[3] == b[3] and a[4] == b[4] and a[5] == b[5]


def differing(a, b) -> list[str]:
    """Names of the compared fields in which signatures ``a`` and ``b`` differ."""
    return [FIELDS[i] for i in _COMPARED if a[i] != b[i]]


def _value(field: str, word: int) -> str:
    word = int(word)
    if word == _NONE:
        return "none"
    names = {"kind": KINDS, "dtype": c.DTYPES, "op": c.REDUCTIONS}.get(field)
    return (names[word] if 0 <= word < len(names) else f"#{word}") if names else str(word)


def describe(sig) -> str:
    """A signature as a call, e.g. ``allreduce(float32, count=10, op=sum)``."""
    parts = [f"{f}={_value(f, sig[i])}" for i, f in enumerate(FIELDS) if i > 1 and sig[i] != _NONE]
    return f"{_value('kind', sig[0])}({', '.join(parts)})"


def message(number: int, rank: int, mine, peer: int, theirs, found_by: int | None = None) -> str:
    """The error text: who passed what, and which fields differ (``theirs`` :data:`UNKNOWN`: a message's size did)."""
    where = "" if found_by is None else f" (found by rank {found_by})"
    if tuple(int(w) for w in theirs) == UNKNOWN:
        return (f"collective #{number} mismatch{where}: rank {peer} sent a message of another size than rank {rank}'s "
                f"call {describe(mine)} expects; differing fields: count or dtype")
    fields = differing(mine, theirs)
    return (f"collective #{number} mismatch{where}: rank {peer} called {describe(theirs)} but rank {rank} called "
            f"{describe(mine)}; differing fields: {', '.join(fields)}")


#: :func:`pack`: the low bits hold kind, dtype and op; the byte count sits above them.
PACK_BITS = 10


def pack(sig, nbytes: int) -> int:
    """One int64 word for the shared-memory path: ``nbytes``, kind, dtype and op (that path has no root)."""
    return (nbytes << PACK_BITS) | (int(sig[0]) & 15) << 6 | (int(sig[2]) & 7) << 3 | (int(sig[4]) & 7)


class Signature(tuple):
    """A signature (``WORDS`` ints, equal to the plain tuple) that keeps its :func:`pack`-ed bits for a size of 0
    (``low``), so the shared-memory path folds it into a size with one shift and one or."""

    def __new__(cls, words: tuple):
        sig = super().__new__(cls, words)
        sig.low = pack(words, 0)
        return sig


def unpack(word: int) -> tuple[int, list[int]]:
    """(byte count, signature with kind, dtype and op filled in) of a :func:`pack`-ed word."""
    sig = [_NONE] * WORDS
    sig[0], sig[2], sig[4] = (word >> 6) & 15, (word >> 3) & 7, word & 7
    if sig[4] == 7:
        sig[4] = _NONE
    return word >> PACK_BITS, sig


# --- all-to-all-v's per-peer counts ------------------------------------------------------------------------------
# An all-to-all-v moves sendcounts[j] elements from each rank i to rank j, which expects recvcounts[i] of them. A
# signature cannot hold these, since they differ per rank; so with the argument check on, every rank first shares its
# row [sendcounts | recvcounts] (a table of shape (size, 2 * size), the same on every rank once traded) and every rank
# finds the same verdict in it: rank i's sendcounts[j] must equal rank j's recvcounts[i] for every pair, else every
# rank raises the same CollectiveMismatchError before any data has moved.


def counts_row(send: np.ndarray, recv: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """This rank's row of the table: ``[sendcounts | recvcounts]``, int64 of shape (2 * size,)."""
    if out is None:
        out = np.empty(2 * send.size, dtype=np.int64)
    out[:send.size], out[send.size:] = send, recv
    return out


def counts_table(send: np.ndarray, recv: np.ndarray, rank: int) -> np.ndarray:
    """A table of shape ``(size, 2 * size)`` with this rank's row filled in (the others to be received)."""
    table = np.zeros((send.size, 2 * send.size), dtype=np.int64)
    counts_row(send, recv, table[rank])
    return table


def counts_disagreement(table: np.ndarray) -> tuple[int, int] | None:
    """The first ``(i, j)`` (by i, then j) where rank i sends other than rank j expects; None when all agree."""
    size = table.shape[0]
    sent, expected = table[:, :size], table[:, size:].T   # sent[i, j] must equal expected[i, j] (j's recvcounts[i])
    bad = np.argwhere(sent != expected)
    return None if bad.size == 0 else (int(bad[0, 0]), int(bad[0, 1]))


def counts_message(number: int, table: np.ndarray, pair: tuple[int, int]) -> str:
    """The error text of a disagreement at ``pair``: who sends how many, who expects how many."""
    i, j = pair
    size = table.shape[0]
    return (f"collective #{number} mismatch: alltoallv counts disagree: rank {i} sends {int(table[i, j])} elements "
            f"to rank {j} (its sendcounts[{j}]) but rank {j} expects {int(table[j, size + i])} from rank {i} "
            f"(its recvcounts[{i}]); differing fields: count")
