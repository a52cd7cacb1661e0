"""Parameter: a trainable array and its gradient, allocated together.

Contract used by DDP and ZeRO:
* ``Parameter.data`` and ``Parameter.grad`` exist from construction; backward only ever
  writes into ``grad`` in place (``+=`` or ``out=``), so DDP may swap ``grad`` for a view into
  a flat bucket once, after construction, and every later backward writes into the bucket.
* ``zero_grad`` zeroes lazily, as PyTorch's ``set_to_none`` does in effect: the gradient is
  marked zero, the next backward overwrites it instead of adding (no pass of zeros, no
  temporary), and reading ``grad`` before that writes the zeros. Code that reads gradient
  memory other than through ``grad`` (a bucket) calls :func:`settle_grads` first.
* ``Parameter(values)`` takes an array or a :class:`npddp.nn.init.Draw` (values not yet drawn,
  which it draws whole).
* ``building(sink)``: a context within which every Parameter made hands its initial values (an
  array or a ``Draw``) to ``sink(parameter, values)`` instead of keeping them, in the order the
  parameters are made; a sink drawing a ``Draw`` keeps the stream's order;
  the sink sets what the parameter holds (ZeRO-3 keeps this rank's part and leaves
  placeholders that occupy no memory, so no rank ever holds the whole model). Scoped to the
  ``with`` block and to the thread or task that entered it.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable

import numpy as np

from npddp.nn.init import Draw


class Parameter:
    """A trainable array with its gradient buffer, allocated together."""

    __slots__ = ("data", "_grad", "_zero")

    def __init__(self, data: np.ndarray | Draw):
        self._zero = False   # zero_grad was called and nothing has written the gradient since
        sink = _SINK.get()
        if sink is not None:   # inside building(sink): the sink sets data and grad
            sink(self, data if isinstance(data, Draw) else np.asarray(data))
            return
        if isinstance(data, Draw):
            data = data.array()
        self.data = np.ascontiguousarray(data)
        self._grad = np.zeros(self.data.shape, self.data.dtype)   # calloc'd: no memory until written

    @property
    def grad(self) -> np.ndarray:
        """The gradient (same shape as ``data``); zeros after ``zero_grad`` until a backward writes it."""
        if self._zero:
            self.settle()
        return self._grad

    def settle(self) -> None:
        """Write the zeros a lazy ``zero_grad`` left pending (nothing if none are)."""
        if self._zero:
            self._zero = False
            if self._grad.flags.writeable:   # a read-only gradient (ZeRO-3's freed one) is zeros already
                self._grad[...] = 0

    @grad.setter
    def grad(self, array: np.ndarray) -> None:
        self._grad, self._zero = array, False

    def zero_grad(self) -> None:
        """Make the gradient zero, lazily: the next backward overwrites it, a read first writes zeros."""
        self._zero = True

    def grad_to_write(self) -> tuple[np.ndarray, bool]:
        """For a backward: ``(gradient, overwrite)``; overwrite when it is zero by ``zero_grad``, else add into it."""
        zero, self._zero = self._zero, False
        return self._grad, zero

    @property
    def shape(self):
        """Shape of ``data``."""
        return self.data.shape

    @property
    def dtype(self):
        """dtype of ``data``."""
        return self.data.dtype

    def __repr__(self) -> str:
        return f"Parameter(shape={self.data.shape}, dtype={self.data.dtype})"


_SINK: contextvars.ContextVar = contextvars.ContextVar("npddp_parameter_sink", default=None)


@contextlib.contextmanager
def building(sink: Callable[[Parameter, np.ndarray], None]):
    """Within this context every new Parameter calls ``sink(parameter, values)``, which sets its data and grad."""
    if not callable(sink):
        raise TypeError(f"building: the sink must be callable, got {type(sink).__name__}")
    token = _SINK.set(sink)
    try:
        yield sink
    finally:
        _SINK.reset(token)


def settle_grads(params) -> None:
    """Write the zeros of every gradient in ``params`` still zero by ``zero_grad`` (before reading their memory directly)."""
    for p in params:
        p.settle()
