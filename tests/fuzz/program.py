"""Random programs over the Communicator surface, derived from a seed: the same program on every rank.

A program is a list of :class:`Op` run in order by every rank of the world (an op on a ``split``
child only by that child's members), ending with a barrier on the world. A perturbed program gives
one rank other arguments for one op (its dtype, count, reduction op or root, or a point-to-point
message's dtype or length) or swaps two of its calls; every rank knows the whole program, so each
computes what every peer passed without talking to it.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from npddp.comm import DTYPES, OPS

#: Blocking collectives, and each non-blocking form with the blocking one it counts as.
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "broadcast", "gather", "scatter", "barrier", "alltoall",
               "alltoallv")
NONBLOCKING = {"iallreduce": "allreduce", "ireduce_scatter": "reduce_scatter", "iallgather": "allgather",
               "ialltoall": "alltoall", "ialltoallv": "alltoallv"}
REDUCING = ("allreduce", "reduce_scatter")
ROOTED = ("broadcast", "gather", "scatter")
#: Which fields of a collective a perturbation may change (besides the call order).
FIELDS = {"allreduce": ("dtype", "count", "op"), "reduce_scatter": ("dtype", "count", "op"),
          "allgather": ("dtype", "count"), "broadcast": ("dtype", "count", "root"),
          "gather": ("dtype", "count", "root"), "scatter": ("dtype", "count", "root"), "barrier": (),
          "alltoall": ("dtype", "count"), "alltoallv": ("dtype", "count")}
#: Perturbations of a point-to-point message: the sender's dtype, or its length above or below the receive's.
P2P_FIELDS = ("p2p-dtype", "p2p-longer", "p2p-shorter")
#: How a program's communicator is wrapped: plain, checked by ``debug=True``, or driven by a progress thread.
MODES = ("plain", "debug", "thread")
USER_TAGS = 16384


@dataclass(frozen=True)
class Op:
    """One step of a program; the fields a kind does not use keep their defaults."""

    kind: str                    # a collective, its i-form, "wait", "test", "p2p" or "split"
    comm: int = 0                # 0: the world; c: the child made by the split at op index c - 1
    dtype: str = "float32"
    shape: tuple = (0,)          # scatter, alltoall: one block's shape (the buffer is (size, *shape)); alltoallv:
    #                              (n,), the least count of a pair that moves anything (oracle.alltoallv_counts)
    op: str = "sum"
    root: int = 0                # taken modulo the communicator's size
    place: str = "in"            # in | out | alias (out is buf); iallgather alias: buf is out[rank]; wait: in | poll
    handle: int = -1             # wait/test: the index of the non-blocking op they finish
    values: str = "exact"        # exact: small integers (no rounding anywhere) | random
    messages: tuple = ()         # p2p: (src, dst, tag, dtype, count) per message, world ranks
    blocking: bool = True        # p2p: send/recv (one message) or isend/irecv + wait
    colors: tuple = ()           # split: each world rank's color (-1: None) and key
    keys: tuple = ()

    @property
    def count(self) -> int:
        """Elements in one block (scatter) or the whole buffer."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def base(self) -> str:
        """The blocking kind this op's signature counts as."""
        return NONBLOCKING.get(self.kind, self.kind)


@dataclass(frozen=True)
class Perturbation:
    """Rank ``rank`` runs ``op`` instead of the program's op at ``index`` (``field`` "order": swaps it with the next)."""

    rank: int
    index: int
    field: str
    op: Op | None = None


@dataclass(frozen=True)
class Program:
    """A generated program: ``ops`` as every rank runs them, but for ``perturbation``'s rank."""

    seed: int
    size: int
    backend: str
    mode: str
    ops: tuple
    perturbation: Perturbation | None = None

    def ops_for(self, rank: int) -> list:
        """``(index, op)`` in the order ``rank`` runs them, its own arguments included."""
        steps = list(enumerate(self.ops))
        p = self.perturbation
        if p is None or p.rank != rank:
            return steps
        if p.field == "order":
            steps[p.index], steps[p.index + 1] = steps[p.index + 1], steps[p.index]
        else:
            steps[p.index] = (p.index, p.op)
        return steps

    def op_of(self, rank: int, index: int) -> Op:
        """The op ``rank`` passes at program index ``index``."""
        p = self.perturbation
        if p is not None and p.rank == rank and p.index == index and p.op is not None:
            return p.op
        return self.ops[index]

    def members(self, comm: int, rank: int) -> tuple:
        """World ranks of ``rank``'s communicator ``comm``, in that communicator's rank order; () if not a member."""
        if comm == 0:
            return tuple(range(self.size))
        split = self.ops[comm - 1]
        parent = self.members(split.comm, rank)
        if rank not in parent or split.colors[rank] < 0:
            return ()
        mine = [r for r in parent if split.colors[r] == split.colors[rank]]
        return tuple(sorted(mine, key=lambda r: (split.keys[r], parent.index(r))))


def _count(rng: random.Random, size: int) -> int:
    """An element count: edge cases (0, 1, around the rank count) often, a few large ones."""
    roll = rng.random()
    if roll < 0.35:
        return rng.choice((0, 1, max(size - 1, 0), size, size + 1))
    if roll < 0.70:
        return rng.randrange(2, 65)
    if roll < 0.90:
        return rng.randrange(65, 5001) | 1
    if roll < 0.98:
        return rng.randrange(5001, 40001)
    return rng.randrange(200_000, 400_001)


def _shape(rng: random.Random, n: int) -> tuple:
    """A shape of ``n`` elements: mostly 1-d, sometimes 0-d (n = 1) or 2-d."""
    if n == 1 and rng.random() < 0.2:
        return ()
    if n > 1 and rng.random() < 0.2:
        for a in (2, 3, 5, 7):
            if n % a == 0:
                return (a, n // a)
    return (n,)


def _collective(rng: random.Random, kind: str, size: int, comm: int) -> Op:
    """A random call of ``kind`` (blocking or non-blocking) on communicator ``comm``."""
    base = NONBLOCKING.get(kind, kind)
    n = _count(rng, size)
    if base in ("scatter", "alltoall", "alltoallv"):
        n = min(n, 5000)
    place = "in"
    if base == "allreduce" and kind == "allreduce":
        place = rng.choice(("in", "out", "alias"))
    elif kind in ("ireduce_scatter",):
        place = rng.choice(("in", "out"))       # in: out=None (a new array); out: an array of ours
    elif kind == "iallgather":
        place = rng.choice(("in", "out", "alias"))
    elif kind in ("ialltoall", "ialltoallv"):
        place = rng.choice(("in", "out"))       # in: out=None (a new array); out: an array of ours
    if base == "alltoallv":
        return Op(kind, comm=comm, dtype=rng.choice(DTYPES), shape=(n,), place=place,
                  values=rng.choice(("exact", "random")))
    return Op(kind, comm=comm, dtype=rng.choice(DTYPES), shape=_shape(rng, n), op=rng.choice(tuple(OPS)),
              root=rng.randrange(8), place=place, values=rng.choice(("exact", "exact", "random")))


def _p2p(rng: random.Random, size: int) -> Op:
    """Point-to-point messages among world ranks: one blocking message, or several non-blocking ones."""
    blocking = rng.random() < 0.4
    count = 1 if blocking else rng.randrange(1, 2 * size + 1)
    messages = []
    for _ in range(count):
        src = rng.randrange(size)
        dst = rng.choice([r for r in range(size) if r != src])
        n = _count(rng, size) if rng.random() < 0.8 else rng.randrange(40001)
        messages.append((src, dst, rng.randrange(USER_TAGS), rng.choice(DTYPES), n))
    return Op("p2p", messages=tuple(messages), blocking=blocking, values="random")


def _split(rng: random.Random, size: int, comm: int) -> Op:
    """A split of communicator ``comm``: colors in {None, 0, 1, 2}, keys that reorder the ranks."""
    colors = tuple(rng.choice((-1, 0, 0, 1, 1, 2)) if rng.random() < 0.9 else -1 for _ in range(size))
    keys = tuple(rng.randrange(-3, 4) for _ in range(size))
    return Op("split", comm=comm, colors=colors, keys=keys)


def _base_ops(rng: random.Random, size: int) -> list:
    """The unperturbed program: collectives, p2p, splits and their children, non-blocking calls and their waits."""
    ops: list = []
    open_handles: list = []          # indices of non-blocking ops not yet waited
    comms = [0]
    for _ in range(rng.randrange(3, 13)):
        roll = rng.random()
        comm = rng.choice(comms) if rng.random() < 0.3 else 0
        if open_handles and roll < 0.20:
            h = open_handles.pop(rng.randrange(len(open_handles)))
            ops.append(Op("wait", comm=ops[h].comm, handle=h, place=rng.choice(("in", "in", "poll"))))
        elif open_handles and roll < 0.27:
            h = rng.choice(open_handles)
            ops.append(Op("test", comm=ops[h].comm, handle=h))
        elif roll < 0.42:
            kind = rng.choice(tuple(NONBLOCKING))
            open_handles.append(len(ops))
            ops.append(_collective(rng, kind, size, comm))
        elif roll < 0.52:
            ops.append(_p2p(rng, size))
        elif roll < 0.58 and len(comms) < 4:
            comms.append(len(ops) + 1)
            ops.append(_split(rng, size, comm))
        else:
            ops.append(_collective(rng, rng.choice(COLLECTIVES), size, comm))
    rng.shuffle(open_handles)
    ops.extend(Op("wait", comm=ops[h].comm, handle=h, place=rng.choice(("in", "in", "poll"))) for h in open_handles)
    ops.append(Op("barrier"))
    return ops


def _outstanding(ops, index: int) -> bool:
    """True when a non-blocking op started before ``index`` is still waited for at ``index``."""
    waited = {op.handle for op in ops[:index] if op.kind == "wait"}
    return any(op.kind in NONBLOCKING and i not in waited for i, op in enumerate(ops[:index]))


def _changed(rng: random.Random, op: Op, field: str, size: int) -> Op:
    """``op`` with ``field`` changed to another valid value."""
    if field == "dtype":
        return dataclasses.replace(op, dtype=rng.choice([d for d in DTYPES if d != op.dtype]))
    if field == "op":
        return dataclasses.replace(op, op=rng.choice([o for o in OPS if o != op.op]))
    if field == "root":
        root = op.root % size
        return dataclasses.replace(op, root=rng.choice([r for r in range(size) if r != root]))
    n = op.count
    choices = {0, 1, n + 1, n + size, 2 * n + 1} | ({n - 1} if n else set())
    return dataclasses.replace(op, shape=(rng.choice(sorted(choices - {n})),))


def _perturb(rng: random.Random, ops: list, size: int):
    """A perturbation of one world op (or an appended p2p message) and the ops the perturbed program keeps."""
    rank = rng.randrange(size)
    if rng.random() < 0.15:                       # a point-to-point message whose sender passes other arguments
        src, dst = rank, rng.choice([r for r in range(size) if r != rank])
        n = rng.randrange(1, 65)
        dtype = rng.choice(DTYPES)
        base = Op("p2p", messages=((src, dst, rng.randrange(USER_TAGS), dtype, n),),
                  blocking=rng.random() < 0.5, values="random")
        field = rng.choice(P2P_FIELDS)
        if field == "p2p-dtype":
            sent = (src, dst, base.messages[0][2], rng.choice([d for d in DTYPES if d != dtype]), n)
        else:
            m = n + rng.randrange(1, 9) if field == "p2p-longer" else rng.randrange(0, n)
            sent = (src, dst, base.messages[0][2], dtype, m)
        ops = ops + [base]
        return ops, Perturbation(rank, len(ops) - 1, field, dataclasses.replace(base, messages=(sent,)))
    candidates = [i for i, op in enumerate(ops[:-1]) if op.comm == 0 and op.base in COLLECTIVES]
    swaps = [i for i in candidates if i + 1 in candidates and not ops[i].kind in NONBLOCKING
             and not ops[i + 1].kind in NONBLOCKING and _signature(ops[i], size) != _signature(ops[i + 1], size)]
    fields = [(i, f) for i in candidates for f in FIELDS[ops[i].base]] + [(i, "order") for i in swaps]
    if not fields:
        return ops, None
    index, field = rng.choice(fields)
    # keep the ops up to the perturbed one (and the next, for a swap), then wait what is open and end
    end = index + (2 if field == "order" else 1)
    kept = ops[:end]
    waited = {op.handle for op in kept if op.kind == "wait"}
    kept += [Op("wait", comm=op.comm, handle=i, place=rng.choice(("in", "poll"))) for i, op in enumerate(kept)
             if op.kind in NONBLOCKING and i not in waited]
    kept.append(Op("barrier"))
    changed = None if field == "order" else _changed(rng, ops[index], field, size)
    return kept, Perturbation(rank, index, field, changed)


def _signature(op: Op, size: int) -> tuple:
    """What the argument check compares: kind, dtype, count, op (reductions), root (rooted; modulo ``size``)."""
    if op.base == "barrier":
        return ("barrier",)
    return (op.base, op.dtype, op.count, op.op if op.base in REDUCING else None,
            op.root % size if op.base in ROOTED else None)


def generate(seed: int, size: int, backend: str, perturbed: bool) -> Program:
    """The program of ``seed`` for ``size`` ranks on ``backend``; with one rank's arguments changed if ``perturbed``."""
    rng = random.Random(f"{seed}:{size}:{backend}:{int(perturbed)}")
    mode = rng.choices(MODES, weights=(70, 15, 15))[0]
    ops = _base_ops(rng, size)
    perturbation = None
    if perturbed:
        ops, perturbation = _perturb(rng, ops, size)
    return Program(seed, size, backend, mode, tuple(ops), perturbation)


def is_outstanding_at(program: Program, index: int) -> bool:
    """True when a non-blocking call is still open on the world when op ``index`` starts."""
    return _outstanding(program.ops, index)
