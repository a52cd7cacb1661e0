"""Dropout masks tied to sample rows, so a slice of a batch gets the bits one process gives those rows.

A :class:`npddp.nn.Dropout` draws ``x.size`` float32 numbers from its PCG64 stream per forward,
row after row. One process on a batch of N rows therefore gives row ``i`` the draws
``i*n .. (i+1)*n - 1`` after the step's starting state (``n`` numbers per row), and leaves the
stream ``N*n`` draws further on. :class:`RowAlignedDropout` reproduces that for any slice of
rows: ``begin_step()`` records each layer's state, ``at_rows(first)`` makes the next forward
of every layer start at the draws of global row ``first`` (a forward pre-hook moves the
stream: PCG64 jumps ahead in O(log n), a float32 takes half a 64-bit output), and
``end_step(rows)`` leaves every stream where one process on ``rows`` rows leaves it. So a
micro-batch (pipeline), a data-parallel rank's shard and a recomputed forward all get the
mask bits the one process would: the seeding is per step and per sample offset.

Rows need not be contiguous: ``at_rows(first, stride)`` places local row ``k`` at global row
``first + k*stride``, which is what a :class:`npddp.data.DistributedSampler` gives data replica
``r`` of ``N`` (the dataset order's positions ``r, r + N, ...``; ``first = r``, ``stride = N``).
For such a forward the layer draws the rows ``first .. first + (k-1)*stride`` in one call and
keeps every ``stride``-th of them (``stride`` times the draws of a contiguous slice).
"""

from __future__ import annotations

import numpy as np

from npddp.nn.dropout import Dropout
from npddp.nn.module import Module


def skipped_state(state: np.ndarray, count: int) -> dict:
    """The PCG64 state (a ``bit_generator.state`` dict) ``count`` float32 draws after ``state`` (six words)."""
    gen = np.random.Generator(np.random.PCG64())
    gen.bit_generator.state = _decoded(state)
    if count and gen.bit_generator.state["has_uint32"]:
        gen.random(1, dtype=np.float32)          # the buffered half of the last 64-bit output
        count -= 1
    if count >= 2:                               # whole 64-bit outputs, two float32 each: jump to the
        gen.bit_generator.advance(count // 2 - 1)  # last one and draw it, which leaves the spare half
        gen.random(2, dtype=np.float32)          # where drawing them all would
    if count % 2:
        gen.random(1, dtype=np.float32)
    return gen.bit_generator.state


def _decoded(words: np.ndarray) -> dict:
    """The ``bit_generator.state`` dict of :meth:`Dropout.get_rng_state`'s six words."""
    w = [int(v) for v in np.asarray(words, dtype=np.uint64)]
    return {"bit_generator": "PCG64", "state": {"state": (w[0] << 64) | w[1], "inc": (w[2] << 64) | w[3]},
            "has_uint32": w[4], "uinteger": w[5]}


class RowAlignedDropout:
    """Position every Dropout of ``model`` by global sample row (see the module docstring)."""

    def __init__(self, model: Module):
        self.layers = [m for _, m in model.named_modules() if isinstance(m, Dropout)]
        self.start: list[np.ndarray | None] = [None] * len(self.layers)
        self.row_size = [0] * len(self.layers)
        self.first_row, self.stride = 0, 1
        self.generators = [layer._rng for layer in self.layers]     # each layer's own stream
        for i, layer in enumerate(self.layers):
            layer.register_forward_pre_hook(self._positioner(i))

    def _positioner(self, i: int):
        def position(layer, args) -> None:
            if self.start[i] is None or not layer.training or layer.p == 0.0:
                return
            x = args[0]
            self.row_size[i] = x.size // x.shape[0]
            layer._rng = self.generators[i]
            layer.set_rng_state(skipped_state(self.start[i], self.first_row * self.row_size[i]))
            if self.stride > 1:
                layer._rng = _StridedDraws(layer, self.generators[i], self.stride)
        return position

    def begin_step(self) -> None:
        """Record where every stream stands: the draws of row 0 of this step's global batch."""
        self.start = [layer.get_rng_state() for layer in self.layers]

    def at_rows(self, first: int, stride: int = 1) -> None:
        """The next forward of every layer draws for global rows ``first``, ``first + stride``, ..."""
        if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or stride < 1:
            raise ValueError(f"stride must be an integer >= 1, got {stride!r}")
        self.first_row, self.stride = int(first), int(stride)

    def end_step(self, rows: int) -> None:
        """Leave every stream where one process on a batch of ``rows`` rows leaves it."""
        for i, layer in enumerate(self.layers):
            layer._rng = self.generators[i]
            if self.start[i] is not None and self.row_size[i]:
                layer.set_rng_state(skipped_state(self.start[i], rows * self.row_size[i]))
        self.start = [None] * len(self.layers)


class _StridedDraws:
    """A Dropout's generator for one forward: every ``stride``-th row of the draws from where it stands."""

    def __init__(self, layer: Dropout, generator: np.random.Generator, stride: int):
        self.layer, self.generator, self.stride = layer, generator, stride

    def random(self, shape, dtype):
        """The draws of rows 0, stride, 2*stride, ... (``shape[0]`` of them); the layer gets its generator back."""
        self.layer._rng = self.generator
        span = (shape[0] - 1) * self.stride + 1 if shape[0] else 0
        return self.generator.random((span, *shape[1:]), dtype=dtype)[::self.stride]
