"""GELU, ``x * Phi(x)``, with PyTorch's two formulas: ``approximate="none"`` (exact) or ``"tanh"``.

* ``"none"``: ``Phi(x) = (1 + erf(x / sqrt(2))) / 2``, the standard normal CDF. float64 (and any
  other dtype but float32) takes it from ``scipy.special.ndtr``, accurate to a few units in
  the last place. float32 evaluates ``Phi(x) = (1 + tanh(x * P(x**2))) / 2`` with an odd
  polynomial of degree 13 fitted here (weighted minimax, on |x| <= 5.75, of
  ``atanh(erf(x / sqrt(2)))``; beyond that ``Phi`` is 0 or 1 to float32 precision): the
  absolute error of ``Phi`` stays below 1e-7, about one float32 unit near 1, and it runs on
  NumPy's vectorised ``tanh`` instead of a scalar ``erf`` (several times faster).
* ``"tanh"``: ``Phi(x) ~ (1 + tanh(sqrt(2/pi) * (x + 0.044715 x**3))) / 2`` in every dtype.

Forward caches its input and ``Phi(x)`` (under ``no_grad`` nothing: ``x * Phi(x)`` is written
over ``Phi(x)``); backward computes ``dGELU/dx = Phi(x) + x * phi(x)``
(``phi`` the normal density, or the derivative of the tanh formula). Pointwise work runs on
chunks of ``CHUNK`` elements so that each of its many passes hits the cache, not memory.
"""

from __future__ import annotations

import math

import numpy as np

from npddp.nn._check import cached, check_dout, check_float_array
from npddp.nn.module import Module

APPROXIMATIONS = ("none", "tanh")
CHUNK = 1 << 15                          # elements per pointwise chunk (128 KiB of float32)

_CLIP32 = 5.75                           # |x| beyond this: Phi is 0 or 1 in float32
_POLY32 = (0.7978849411010742, 0.03633308410644531, -3.259483855799772e-05,  # x * P(x**2) ~ atanh(2 Phi - 1)
           -5.5306260037468746e-05, 3.964757524954621e-06, -1.322645033496883e-07,
           1.7562062915033039e-09)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TANH_K = math.sqrt(2.0 / math.pi)
_TANH_A = 0.044715


def _chunks(n: int):
    """Slices of ``range(n)`` of at most CHUNK elements."""
    for start in range(0, n, CHUNK):
        yield slice(start, min(start + CHUNK, n))


def _phi_fast32(x: np.ndarray, phi: np.ndarray, z: np.ndarray, p: np.ndarray) -> None:
    """``phi = Phi(x)`` for float32 chunks (flat); ``z``, ``p`` are scratch of the same size."""
    np.clip(x, -_CLIP32, _CLIP32, out=phi)                 # (n,) x clipped
    np.square(phi, out=z)                                  # (n,) x**2
    np.multiply(z, _POLY32[-1], out=p)
    for c in _POLY32[-2:0:-1]:                             # Horner in x**2
        p += c
        p *= z
    p += _POLY32[0]
    p *= phi                                               # (n,) x * P(x**2)
    np.tanh(p, out=p)
    p += 1.0
    np.multiply(p, 0.5, out=phi)                           # (n,) Phi(x)


def _phi_tanh(x: np.ndarray, phi: np.ndarray, z: np.ndarray, p: np.ndarray) -> None:
    """``phi = (1 + tanh(k (x + a x**3))) / 2`` for flat chunks."""
    np.square(x, out=z)
    np.multiply(z, _TANH_K * _TANH_A, out=p)
    p += _TANH_K
    p *= x                                                 # (n,) k (x + a x**3)
    np.tanh(p, out=p)
    p += 1.0
    np.multiply(p, 0.5, out=phi)


class GELU(Module):
    """``x * Phi(x)`` elementwise, exact (``approximate="none"``) or PyTorch's tanh formula."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in APPROXIMATIONS:
            raise ValueError(f"GELU approximate must be one of {', '.join(map(repr, APPROXIMATIONS))}, "
                             f"got {approximate!r}")
        self.approximate = approximate
        self._x = None
        self._phi = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        check_float_array(self, x)
        x = np.ascontiguousarray(x)                        # (...)
        phi = np.empty_like(x)                             # (...) Phi(x)
        xf, pf = x.reshape(-1), phi.reshape(-1)
        if self.approximate == "none" and x.dtype != np.float32:
            from scipy.special import ndtr
            ndtr(xf, out=pf)
        else:
            fill = _phi_tanh if self.approximate == "tanh" else _phi_fast32
            z = np.empty(min(CHUNK, xf.size), x.dtype)
            p = np.empty_like(z)
            for s in _chunks(xf.size):
                n = s.stop - s.start
                fill(xf[s], pf[s], z[:n], p[:n])
        if not self.grad_enabled:                          # forward only: the output in phi's memory
            self._x = self._phi = None
            return np.multiply(x, phi, out=phi)            # (...)
        self._x, self._phi = x, phi
        return np.multiply(x, phi)                         # (...)

    def backward(self, dout: np.ndarray) -> np.ndarray:
        x = cached(self, self._x)                          # (...)
        phi = self._phi                                    # (...)
        check_dout(self, dout, x.shape)
        dx = np.empty_like(x)                              # (...)
        xf, pf, gf = x.reshape(-1), phi.reshape(-1), dx.reshape(-1)
        df = np.ascontiguousarray(dout).reshape(-1)
        z = np.empty(min(CHUNK, xf.size), x.dtype)
        for s in _chunks(xf.size):
            xs, g, zs = xf[s], gf[s], z[:s.stop - s.start]
            np.square(xs, out=zs)                          # x**2
            if self.approximate == "none":                 # Phi + x phi(x)
                zs *= -0.5
                np.exp(zs, out=g)
                g *= xs
                g *= _INV_SQRT_2PI
            else:                                          # Phi + x/2 (1 - t**2) k (1 + 3a x**2), t = 2 Phi - 1
                zs *= 3.0 * _TANH_K * _TANH_A
                zs += _TANH_K
                zs *= xs                                   # x k (1 + 3a x**2)
                np.subtract(1.0, pf[s], out=g)
                g *= pf[s]                                 # Phi (1 - Phi) = (1 - t**2) / 4
                g *= zs
                g *= 2.0
            g += pf[s]
            g *= df[s]
        return dx

    def extra_repr(self) -> str:
        return "" if self.approximate == "none" else f"approximate={self.approximate!r}"
