"""``comm.split(color, key)``: the checked arguments, every rank's choice, and the child's ranks in MPI's order.

Every backend's ``split`` checks ``color`` and ``key`` first (nothing is sent for bad ones), all-gathers
``(color, key)`` as int64 over the parent, and orders each group by key, then parent rank, as
``MPI_Comm_split`` does. A color of None or below 0 (MPI_UNDEFINED) joins no group: that rank gets None.
The hand-written backends' child runs over ``transport.split`` (a message context of its own), seen
through :class:`OrderedTransport` when the keys reorder the ranks.
"""

from __future__ import annotations

import numpy as np

UNDEFINED = -1
_INT64 = np.iinfo(np.int64)


def _check_int(name: str, value, allow_none: bool) -> int | None:
    """``value`` as an int within int64; TypeError/ValueError naming it and the valid values otherwise."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        valid = "an int or None" if allow_none else "an int"
        raise TypeError(f"split: {name} must be {valid}, got {value!r} ({type(value).__name__})")
    if not _INT64.min <= int(value) <= _INT64.max:
        raise ValueError(f"split: {name}={value} is out of range; valid: {_INT64.min}..{_INT64.max}")
    return int(value)


def check_split(color, key) -> tuple[int, int]:
    """``(color, key)`` as ints, color ``UNDEFINED`` for None or negative; raised before any message."""
    color = _check_int("color", color, allow_none=True)
    key = _check_int("key", key, allow_none=False)
    return (UNDEFINED if color is None or color < 0 else color), key


def choices(comm, color: int, key: int, extra: int = 0) -> np.ndarray:
    """Every rank's ``(color, key, extra)`` (collective: an all-gather of int64 over ``comm``), shape (size, 3)."""
    return comm.allgather(np.array([color, key, extra], dtype=np.int64))


def members(table: np.ndarray, rank: int) -> list[int] | None:
    """The parent ranks of ``rank``'s group in child-rank order (by key, then parent rank); None if undefined."""
    color = int(table[rank, 0])
    if color == UNDEFINED:
        return None
    same = [r for r in range(len(table)) if int(table[r, 0]) == color]
    return sorted(same, key=lambda r: (int(table[r, 1]), r))


def dense_colors(table: np.ndarray) -> list[int]:
    """Small non-negative colors with the same groups; each undefined rank alone in a color of its own."""
    defined = sorted({int(c) for c in table[:, 0] if int(c) != UNDEFINED})
    index = {c: i for i, c in enumerate(defined)}
    return [index[int(c)] if int(c) != UNDEFINED else len(defined) + r for r, c in enumerate(table[:, 0])]


class OrderedTransport:
    """A transport seen with its ranks renumbered: this view's rank i is the inner transport's ``order[i]``."""

    def __init__(self, inner, order: list[int]):
        self.inner, self.order = inner, list(order)
        self.name, self.size = inner.name, inner.size
        self.rank = self.order.index(inner.rank)

    def isend(self, buf: np.ndarray, dest: int, tag: int):
        """The inner transport's isend to ``dest``'s inner rank."""
        return self.inner.isend(buf, self.order[dest], tag)

    def irecv(self, buf: np.ndarray, source: int, tag: int):
        """The inner transport's irecv from ``source``'s inner rank."""
        return self.inner.irecv(buf, self.order[source], tag)

    def split(self, colors):
        """The transport among the ranks whose color matches this rank's, in this view's order (collective)."""
        inner_colors = [0] * self.size
        for view_rank, inner_rank in enumerate(self.order):
            inner_colors[inner_rank] = colors[view_rank]
        mine = colors[self.rank]
        group = [self.order[r] for r in range(self.size) if colors[r] == mine]   # inner ranks, view order
        return ordered(self.inner.split(inner_colors), [sorted(group).index(r) for r in group])


def ordered(transport, order: list[int]):
    """``transport`` itself when ``order`` is the identity, else an :class:`OrderedTransport` over it."""
    return transport if order == sorted(order) else OrderedTransport(transport, order)


def tcp_world(transport):
    """The TCP world under ``transport`` (through any reordering), or None for other transports."""
    while isinstance(transport, OrderedTransport):
        transport = transport.inner
    return getattr(transport, "world", None) if transport.name == "tcp" else None


def split_transport(transport, table: np.ndarray):
    """This rank's group of ``table`` (see :func:`choices`) as a transport in a context of its own, or None.

    Collective: every rank of ``transport`` calls it with the same table (undefined ranks too)."""
    group = members(table, transport.rank)
    child = transport.split(dense_colors(table))
    if group is None:
        return None
    return ordered(child, [sorted(group).index(r) for r in group])
