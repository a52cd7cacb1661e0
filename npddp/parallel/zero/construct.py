"""Sharded construction for ZeRO-3: :class:`ShardedInit`, a model built with each rank keeping its part of every parameter.

As DeepSpeed's ``zero.Init`` and FSDP's deferred initialisation do::

    with ShardedInit(comm) as init:
        model = gpt(...)                                  # every rank runs the same builder, same seed
    engine = ZeroDataParallel(model, comm, stage=3, init=init)

Inside the block every Parameter the builder makes hands its initial values to ``init``
(:func:`npddp.nn.parameter.building`), which keeps elements ``[r*s, (r+1)*s)`` of the flattened
values on rank r (``s = ceil(n / N)``) and leaves the Parameter placeholders: read-only zeros
that occupy no memory. The builder still draws every parameter, in order, from its one seeded
stream, so the values are the unsharded model's bit for bit; only one parameter exists whole
at a time (while it is drawn). The engine then regroups the pieces into its flat groups'
shards, one parameter at a time (an all-gather of its N pieces), and frees them: no rank ever
holds all parameters.
"""

from __future__ import annotations

import numpy as np

from npddp.nn.parameter import Parameter, building
from npddp.parallel.zero.flat import _absent


class ShardedInit:
    """A context building a model with 1/N of every parameter's initial values kept on each rank."""

    def __init__(self, comm):
        self.comm = comm
        self.pieces: dict[int, np.ndarray] = {}   # id(parameter) -> this rank's (ceil(n / N),) piece, zero-padded
        self._scope = None

    def __enter__(self) -> "ShardedInit":
        self._scope = building(self)
        self._scope.__enter__()
        return self

    def __exit__(self, *exc):
        scope, self._scope = self._scope, None
        return scope.__exit__(*exc)

    def __call__(self, param: Parameter, values: np.ndarray) -> None:
        """Keep this rank's piece of ``values``; ``param`` gets placeholders of their shape and dtype."""
        flat = values.reshape(-1)
        size, rank = self.comm.size, self.comm.rank
        s = -(-flat.size // size)
        piece = np.zeros(s, dtype=values.dtype)                       # (s,)
        mine = flat[rank * s:(rank + 1) * s]
        piece[:mine.size] = mine
        self.pieces[id(param)] = piece
        param.data = _absent(values.shape, values.dtype)
        param.grad = _absent(values.shape, values.dtype)

    def full(self, param: Parameter) -> np.ndarray:
        """Collective: the whole flattened initial values of ``param`` (its piece freed); a parameter made
        outside the block gives its own values."""
        piece = self.pieces.pop(id(param), None)
        if piece is None:
            return param.data.reshape(-1)
        table = self.comm.allgather(piece)                            # (N, s)
        return table.reshape(-1)[:param.data.size]

    def held_bytes(self) -> int:
        """Bytes of pieces not yet regrouped."""
        return sum(p.nbytes for p in self.pieces.values())
