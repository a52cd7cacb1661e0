"""LayerNorm over the last dimension, PyTorch's formula: biased variance, ``eps`` inside the root.

``y = (x - mean) / sqrt(var + eps) * weight + bias`` for x of shape (..., d). Forward caches
the normalised input and ``1 / sqrt(var + eps)`` per row (under ``no_grad`` it scales the
normalised input in place into the output and keeps nothing); backward is the usual
``dx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` with ``g = dout * weight``.
"""

from __future__ import annotations

import numpy as np

from npddp.nn._check import cached, check_dout, check_dtype_arg, check_last_dim, check_positive_int
from npddp.nn.module import Module
from npddp.nn.parameter import Parameter


class LayerNorm(Module):
    """Normalise each row of the last dimension; ``weight`` starts at 1, ``bias`` at 0."""

    def __init__(self, normalized_shape: int, eps: float = 1e-5, *, dtype=np.float32):
        super().__init__()
        self.d = check_positive_int("normalized_shape", normalized_shape)
        if not (isinstance(eps, (int, float)) and eps > 0):
            raise ValueError(f"eps must be a number > 0, got {eps!r}")
        self.eps = float(eps)
        self.dtype = check_dtype_arg(dtype)
        self.weight = Parameter(np.ones(self.d, self.dtype))     # (d,)
        self.bias = Parameter(np.zeros(self.d, self.dtype))      # (d,)
        self._xhat = None
        self._rstd = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        check_last_dim(self, x, self.d, self.dtype)
        mean = x.mean(axis=-1, keepdims=True)                    # (..., 1)
        xhat = np.subtract(x, mean)                              # (..., d) centred
        var = np.einsum("...i,...i->...", xhat, xhat)[..., None]  # (..., 1) sum of squares
        var *= 1.0 / self.d
        var += self.eps
        rstd = np.sqrt(var, out=var)
        np.divide(1.0, rstd, out=rstd)                           # (..., 1)
        xhat *= rstd                                             # (..., d)
        if not self.grad_enabled:                                # forward only: y in xhat's memory
            self._xhat = self._rstd = None
            xhat *= self.weight.data
            xhat += self.bias.data
            return xhat
        self._xhat, self._rstd = xhat, rstd
        y = np.multiply(xhat, self.weight.data)                  # (..., d)
        y += self.bias.data
        return y

    def backward(self, dout: np.ndarray) -> np.ndarray:
        xhat = cached(self, self._xhat)                          # (..., d)
        rstd = self._rstd                                        # (..., 1)
        check_dout(self, dout, xhat.shape)
        d2, x2 = dout.reshape(-1, self.d), xhat.reshape(-1, self.d)  # (N, d)
        g = np.multiply(d2, x2)                                  # (N, d) dout * xhat
        gw, gb = self.weight.grad, self.bias.grad
        np.add(gw, g.sum(axis=0), out=gw)                        # (d,)
        np.add(gb, d2.sum(axis=0), out=gb)                       # (d,)
        np.multiply(d2, self.weight.data, out=g)                 # (N, d) g = dout * weight
        mean_g = g.mean(axis=-1, keepdims=True)                  # (N, 1)
        mean_gx = np.einsum("ni,ni->n", g, x2)[:, None]          # (N, 1)
        mean_gx *= 1.0 / self.d
        dx = np.multiply(x2, mean_gx)                            # (N, d)
        np.subtract(g, dx, out=dx)
        dx -= mean_g
        dx *= rstd.reshape(-1, 1)
        return dx.reshape(xhat.shape)                            # (..., d)

    def extra_repr(self) -> str:
        return f"{self.d}" + ("" if self.eps == 1e-5 else f", eps={self.eps:g}")
