"""MaxPool2d over NCHW arrays, vectorised as a loop over the k*k window offsets.

Forward takes the elementwise maximum of the k*k strided views (one per window offset).
Backward routes each output gradient to the *first* position in its window that holds the
maximum (row-major order, as PyTorch does), so ties never duplicate a gradient; the routing
is recomputed from the cached input and output rather than stored as an index array.
Windows that do not fit (when (H - k) is not a multiple of the stride) are dropped.
"""

from __future__ import annotations

import numpy as np

from npddp.nn._check import cached, check_dout, check_input
from npddp.nn.conv import as_pair, out_size, window_slice
from npddp.nn.module import Module


class MaxPool2d(Module):
    """Max over ``kernel_size`` windows moved by ``stride`` (default: the kernel size)."""

    def __init__(self, kernel_size, stride=None):
        super().__init__()
        self.kernel_size = as_pair("kernel_size", kernel_size, 1)
        self.stride = self.kernel_size if stride is None else as_pair("stride", stride, 1)
        self._x = self._y = None

    def _views(self, x: np.ndarray, ho: int, wo: int) -> list:
        """The k*k strided views of ``x``, one per window offset, row-major."""
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        return [x[:, :, window_slice(i, ho, sh), window_slice(j, wo, sw)]  # (B, C, Ho, Wo) each
                for i in range(kh) for j in range(kw)]

    def forward(self, x: np.ndarray) -> np.ndarray:
        check_input(self, x, ("B", "C", "H", "W"))
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        if x.shape[2] < kh or x.shape[3] < kw:
            raise ValueError(f"{self!r}: expected input of shape (B, C, H, W) with H >= {kh} and "
                             f"W >= {kw}, got {x.shape} {x.dtype.name}")
        ho, wo = out_size(x.shape[2], kh, sh, 0), out_size(x.shape[3], kw, sw, 0)
        views = self._views(x, ho, wo)
        y = views[0].copy()                                                # (B, C, Ho, Wo)
        for v in views[1:]:
            np.maximum(y, v, out=y)                                        # (B, C, Ho, Wo)
        self._x, self._y = (x, y) if self.grad_enabled else (None, None)
        return y

    def backward(self, dout: np.ndarray) -> np.ndarray:
        x, y = cached(self, self._x), self._y                             # (B, C, H, W), (B, C, Ho, Wo)
        check_dout(self, dout, y.shape)
        (kh, kw), (sh, sw) = self.kernel_size, self.stride
        ho, wo = y.shape[2], y.shape[3]
        # Non-overlapping windows that tile x exactly: every input gets written once.
        tiles = (sh, sw) == (kh, kw) and x.shape[2] == ho * kh and x.shape[3] == wo * kw
        dx = np.empty(x.shape, dout.dtype) if tiles else np.zeros(x.shape, dout.dtype)  # (B, C, H, W)
        views = self._views(x, ho, wo)
        grads = self._views(dx, ho, wo)
        free = None                                                       # (B, C, Ho, Wo) not yet routed
        last = len(views) - 1
        for n, (v, g) in enumerate(zip(views, grads)):
            if n == last:
                hit = free if free is not None else np.ones(y.shape, bool)  # the rest lands here
            else:
                hit = v == y                                              # (B, C, Ho, Wo)
                if free is None:
                    free = ~hit
                else:
                    hit &= free
                    free ^= hit
            if tiles:
                np.multiply(dout, hit, out=g)                             # (B, C, Ho, Wo)
            else:
                g += dout * hit                                           # (B, C, Ho, Wo)
        return dx

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}"
