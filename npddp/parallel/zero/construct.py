"""Sharded construction for ZeRO-3: :class:`ShardedInit`, a model built with each rank keeping its part of every parameter.

As DeepSpeed's ``zero.Init`` and FSDP's deferred initialisation do::

    with ShardedInit(comm) as init:
        model = gpt(...)                                  # every rank runs the same builder, same seed
    engine = ZeroDataParallel(model, comm, stage=3, init=init)

Inside the block every Parameter the builder makes hands its initial values to ``init``
(:func:`npddp.nn.parameter.building`), which keeps elements ``[r*s, (r+1)*s)`` of the flattened
values on rank r (``s = ceil(n / N)``) and leaves the Parameter placeholders: read-only zeros
that occupy no memory. A parameter whose values come as a :class:`npddp.nn.init.Draw` (every
drawn weight) is drawn ``init.CHUNK`` values at a time, keeping only the rank's slice, so no
parameter exists whole on any rank; the stream still advances past every value in order, so
the values are the unsharded model's bit for bit. (Values a layer makes whole, such as zero
biases and unit norm weights, are sliced as they come: they occupy no memory until written.) The engine then regroups the pieces into its flat groups'
shards, one parameter at a time (an all-gather of its N pieces), and frees them: no rank ever
holds all parameters.
"""

from __future__ import annotations

import numpy as np

from npddp.nn.init import Draw
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

    def __call__(self, param: Parameter, values: np.ndarray | Draw) -> None:
        """Keep this rank's piece of ``values``; ``param`` gets placeholders of their shape and dtype."""
        size, rank = self.comm.size, self.comm.rank
        n = values.size
        s = -(-n // size)
        lo, hi = min(rank * s, n), min((rank + 1) * s, n)
        piece = np.zeros(s, dtype=values.dtype)                       # (s,)
        if isinstance(values, Draw):
            values.slice(lo, hi, piece)
        else:
            piece[:hi - lo] = values.reshape(-1)[lo:hi]
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
