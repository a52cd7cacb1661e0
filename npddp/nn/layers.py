"""Dense layers and pointwise activations: Linear, ReLU, Tanh, Flatten.

Each ``forward`` caches its input by reference (no copy; nothing under ``no_grad``) and
``backward`` uses the input of the most recent ``forward``.  Parameter gradients are *added* into ``.grad`` in place (or
written over one that ``zero_grad`` left zero) and looked up at backward time, so a ``.grad``
swapped for a view into a flat buffer keeps working.
"""

from __future__ import annotations

import numpy as np

from npddp.nn._check import cached, check_dout, check_dtype_arg, check_float_array, check_last_dim, check_positive_int, check_rng
from npddp.nn.init import draw, normal
from npddp.nn.module import Module
from npddp.nn.parameter import Parameter


class Linear(Module):
    """``y = x @ W.T + b`` with ``W`` of shape (out, in), as in PyTorch; ``x`` is (..., in).

    Weights start He-normal (``init`` picks another scheme from :mod:`npddp.nn.init`;
    ``init_std`` draws N(0, init_std**2) instead), drawn from ``rng`` (a Generator or int
    seed; None: unseeded), biases zero.  ``weight=`` shares an existing (out, in) Parameter
    instead of drawing one (tied weights: the same array and gradient in two layers).
    ``input_grad=False`` skips dL/dx (backward returns None): use it for a first layer whose
    input is data, which saves one matmul per step.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 dtype=np.float32, rng=None, init: str = "he_normal", input_grad: bool = True,
                 init_std: float | None = None, weight: Parameter | None = None):
        super().__init__()
        self.in_features = check_positive_int("in_features", in_features)
        self.out_features = check_positive_int("out_features", out_features)
        self.dtype = check_dtype_arg(dtype)
        rng = check_rng(rng)
        shape = (self.out_features, self.in_features)
        if weight is not None:
            if not isinstance(weight, Parameter) or weight.shape != shape or weight.dtype != self.dtype:
                raise ValueError(f"weight must be a Parameter of shape {shape} and dtype {self.dtype.name} "
                                 f"to share, got {weight!r}")
            self.weight = weight                                                            # (out, in)
        elif init_std is not None:
            if not (isinstance(init_std, (int, float)) and init_std >= 0):
                raise ValueError(f"init_std must be a number >= 0, got {init_std!r}")
            self.weight = Parameter(normal(rng, shape, init_std, self.dtype))  # (out, in)
        else:
            self.weight = Parameter(draw(init, rng, shape, self.in_features, self.dtype))   # (out, in)
        self.bias = Parameter(np.zeros(self.out_features, self.dtype)) if bias else None   # (out,)
        self.input_grad = bool(input_grad)
        self._x = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        check_last_dim(self, x, self.in_features, self.dtype)
        self._x = x if self.grad_enabled else None         # (..., in)
        x2 = x.reshape(-1, self.in_features)               # (N, in) N = prod(...)
        y = np.matmul(x2, self.weight.data.T)              # (N, out)
        if self.bias is not None:
            np.add(y, self.bias.data, out=y)               # (N, out)
        return y.reshape(x.shape[:-1] + (self.out_features,))  # (..., out)

    def backward(self, dout: np.ndarray) -> np.ndarray | None:
        x = cached(self, self._x)                          # (..., in)
        check_dout(self, dout, x.shape[:-1] + (self.out_features,))
        x2 = x.reshape(-1, self.in_features)               # (N, in)
        d2 = dout.reshape(-1, self.out_features)           # (N, out)
        gw, overwrite = self.weight.grad_to_write()
        if overwrite:
            np.matmul(d2.T, x2, out=gw)                    # (out, in)
        else:
            np.add(gw, np.matmul(d2.T, x2), out=gw)
        if self.bias is not None:
            gb, overwrite = self.bias.grad_to_write()
            if overwrite:
                np.sum(d2, axis=0, out=gb)                 # (out,)
            else:
                np.add(gb, d2.sum(axis=0), out=gb)
        if not self.input_grad:
            return None
        return np.matmul(d2, self.weight.data).reshape(x.shape)  # (..., in)

    def extra_repr(self) -> str:
        return f"{self.in_features}->{self.out_features}" + ("" if self.bias is not None else ", bias=False")


class ReLU(Module):
    """``max(x, 0)`` elementwise; the gradient at 0 is taken as 0."""

    def __init__(self):
        super().__init__()
        self._x = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        check_float_array(self, x)
        self._x = x if self.grad_enabled else None         # (B, ...)
        return np.maximum(x, 0)                            # (B, ...)

    def backward(self, dout: np.ndarray) -> np.ndarray:
        x = cached(self, self._x)                          # (B, ...)
        check_dout(self, dout, x.shape)
        return dout * (x > 0)                              # (B, ...)


class Tanh(Module):
    """``tanh(x)`` elementwise; backward uses the cached output: ``dout * (1 - y**2)``."""

    def __init__(self):
        super().__init__()
        self._y = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        check_float_array(self, x)
        y = np.tanh(x)                                     # (B, ...)
        self._y = y if self.grad_enabled else None
        return y

    def backward(self, dout: np.ndarray) -> np.ndarray:
        y = cached(self, self._y)                          # (B, ...)
        check_dout(self, dout, y.shape)
        dx = np.multiply(y, y)                             # (B, ...)
        np.subtract(1, dx, out=dx)                         # (B, ...)
        np.multiply(dx, dout, out=dx)                      # (B, ...)
        return dx


class Flatten(Module):
    """``(B, d1, d2, ...) -> (B, d1*d2*...)``: a view when the input is contiguous."""

    def __init__(self):
        super().__init__()
        self._shape = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        check_float_array(self, x, min_ndim=2)
        self._shape = x.shape if self.grad_enabled else None  # (B, ...)
        return x.reshape(x.shape[0], -1)                   # (B, prod(...))

    def backward(self, dout: np.ndarray) -> np.ndarray:
        shape = cached(self, self._shape)
        check_dout(self, dout, (shape[0], int(np.prod(shape[1:]))))
        return dout.reshape(shape)                         # (B, ...)
