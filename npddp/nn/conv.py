"""Conv2d over NCHW arrays by im2col: one strided copy, then one (batched) matmul.

Forward copies the sliding windows of the zero-padded input into a column buffer
``cols`` of shape (B, C*kh*kw, Ho*Wo) and computes ``W (O, C*kh*kw) @ cols`` for every image
at once, which lands directly in NCHW.  Backward reuses the cached ``cols`` for dL/dW and
scatters dL/dcols back onto the padded input with col2im: a loop over the kh*kw kernel
positions, each adding one strided (B, C, Ho, Wo) block, never a loop over pixels.
The padded-input and column buffers are kept between calls with the same input shape (under
``no_grad`` too: they are scratch, reused by the next forward; only backward reads ``cols``).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from npddp.nn._check import cached, check_dout, check_dtype_arg, check_input, check_positive_int, check_rng
from npddp.nn.init import draw
from npddp.nn.module import Module
from npddp.nn.parameter import Parameter


def as_pair(name: str, value, minimum: int) -> tuple[int, int]:
    """``3 -> (3, 3)``; a pair is checked element by element."""
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return (check_positive_int(name, value[0], minimum), check_positive_int(name, value[1], minimum))
    v = check_positive_int(name, value, minimum)
    return (v, v)


def out_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Output length along one axis: floor((size + 2*padding - kernel) / stride) + 1."""
    return (size + 2 * padding - kernel) // stride + 1


def window_slice(start: int, count: int, stride: int) -> slice:
    """The ``count`` positions ``start, start+stride, ...`` as a slice."""
    return slice(start, start + stride * (count - 1) + 1, stride)


class Conv2d(Module):
    """2-D convolution (cross-correlation, as in PyTorch), NCHW, weight (O, C, kh, kw).

    Weights start He-normal with fan_in = C*kh*kw (``init`` picks another scheme from
    :mod:`npddp.nn.init`), drawn from ``rng`` (a Generator or int seed; None: unseeded),
    biases zero.  ``input_grad=False`` skips dL/dx (backward returns None), for a first
    layer whose input is data.  ``kernel_size``, ``stride`` and ``padding`` are ints or pairs.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 bias: bool = True, *, dtype=np.float32, rng=None, init: str = "he_normal",
                 input_grad: bool = True):
        super().__init__()
        self.in_channels = check_positive_int("in_channels", in_channels)
        self.out_channels = check_positive_int("out_channels", out_channels)
        self.kernel_size = as_pair("kernel_size", kernel_size, 1)
        self.stride = as_pair("stride", stride, 1)
        self.padding = as_pair("padding", padding, 0)
        self.dtype = check_dtype_arg(dtype)
        rng = check_rng(rng)
        kh, kw = self.kernel_size
        fan_in = self.in_channels * kh * kw
        shape = (self.out_channels, self.in_channels, kh, kw)
        self.weight = Parameter(draw(init, rng, shape, fan_in, self.dtype))   # (O, C, kh, kw)
        self.bias = Parameter(np.zeros(self.out_channels, self.dtype)) if bias else None  # (O,)
        self.input_grad = bool(input_grad)
        self._dw = np.empty((self.out_channels, fan_in), self.dtype)  # (O, K) scratch for dL/dW
        self._x_shape = None
        self._work_shape = None   # input shape the buffers below were made for
        self._xp = self._cols = self._dwb = self._dcols = None

    def _buffers(self, shape: tuple) -> None:
        """(Re)allocate the padded-input, column and backward scratch buffers for ``shape``."""
        if shape == self._work_shape:
            return
        b, c, h, w = shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        ho, wo = out_size(h, kh, sh, ph), out_size(w, kw, sw, pw)
        k = c * kh * kw
        self._xp = np.zeros((b, c, h + 2 * ph, w + 2 * pw), self.dtype)    # (B, C, Hp, Wp), border stays 0
        self._cols = np.empty((b, c, kh, kw, ho, wo), self.dtype)          # (B, C, kh, kw, Ho, Wo)
        self._dwb = np.empty((b, self.out_channels, k), self.dtype)        # (B, O, K)
        self._dcols = None                                                 # made on first use
        self._work_shape = shape

    def _check(self, x: np.ndarray) -> None:
        """Channels, dtype and a spatial size the kernel fits in."""
        check_input(self, x, ("B", self.in_channels, "H", "W"), self.dtype)
        (kh, kw), (ph, pw) = self.kernel_size, self.padding
        if x.shape[2] + 2 * ph < kh or x.shape[3] + 2 * pw < kw:
            raise ValueError(f"{self!r}: input of shape {x.shape} is smaller than the kernel "
                             f"{self.kernel_size} even with padding {self.padding}")

    def forward(self, x: np.ndarray) -> np.ndarray:
        self._check(x)
        self._buffers(x.shape)
        b, c, h, w = x.shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        cols = self._cols                                                 # (B, C, kh, kw, Ho, Wo)
        ho, wo = cols.shape[4], cols.shape[5]
        if ph or pw:
            self._xp[:, :, ph:ph + h, pw:pw + w] = x                     # (B, C, Hp, Wp)
            xp = self._xp
        else:
            xp = x                                                        # (B, C, H, W)
        win = sliding_window_view(xp, (kh, kw), axis=(2, 3))              # (B, C, Hp-kh+1, Wp-kw+1, kh, kw)
        win = win[:, :, ::sh, ::sw].transpose(0, 1, 4, 5, 2, 3)           # (B, C, kh, kw, Ho, Wo)
        np.copyto(cols, win)
        cols3 = cols.reshape(b, c * kh * kw, ho * wo)                     # (B, K, L)
        w2 = self.weight.data.reshape(self.out_channels, -1)              # (O, K)
        y = np.matmul(w2, cols3)                                          # (B, O, L)
        if self.bias is not None:
            np.add(y, self.bias.data[:, None], out=y)                     # (B, O, L)
        self._x_shape = x.shape if self.grad_enabled else None           # the column buffer is scratch
        return y.reshape(b, self.out_channels, ho, wo)                    # (B, O, Ho, Wo)

    def backward(self, dout: np.ndarray) -> np.ndarray | None:
        b, c, h, w = cached(self, self._x_shape)
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        cols = self._cols                                                 # (B, C, kh, kw, Ho, Wo)
        ho, wo = cols.shape[4], cols.shape[5]
        check_dout(self, dout, (b, self.out_channels, ho, wo))
        k = c * kh * kw
        d3 = dout.reshape(b, self.out_channels, ho * wo)                  # (B, O, L)
        cols3 = cols.reshape(b, k, ho * wo)                               # (B, K, L)
        np.matmul(d3, cols3.transpose(0, 2, 1), out=self._dwb)            # (B, O, K)
        gw, overwrite = self.weight.grad_to_write()
        if overwrite and gw.flags.c_contiguous:                           # so the reshape is a view
            np.sum(self._dwb, axis=0, out=gw.reshape(self.out_channels, k))  # (O, K)
        else:
            if overwrite:
                gw[...] = 0
            np.sum(self._dwb, axis=0, out=self._dw)                       # (O, K)
            np.add(gw, self._dw.reshape(gw.shape), out=gw)                # (O, C, kh, kw)
        if self.bias is not None:
            gb, overwrite = self.bias.grad_to_write()
            if overwrite:
                np.sum(d3, axis=(0, 2), out=gb)                           # (O,)
            else:
                np.add(gb, d3.sum(axis=(0, 2)), out=gb)
        if not self.input_grad:
            return None
        w2 = self.weight.data.reshape(self.out_channels, k)               # (O, K)
        if self._dcols is None:
            self._dcols = np.empty((b, k, ho * wo), self.dtype)           # (B, K, L)
        np.matmul(w2.T, d3, out=self._dcols)                              # (B, K, L)
        dcols = self._dcols.reshape(b, c, kh, kw, ho, wo)                 # (B, C, kh, kw, Ho, Wo)
        dxp = np.zeros((b, c, h + 2 * ph, w + 2 * pw), self.dtype)        # (B, C, Hp, Wp)
        for i in range(kh):
            rows = window_slice(i, ho, sh)
            for j in range(kw):
                block = dxp[:, :, rows, window_slice(j, wo, sw)]          # (B, C, Ho, Wo) view
                np.add(block, dcols[:, :, i, j], out=block)
        return dxp[:, :, ph:ph + h, pw:pw + w]                            # (B, C, H, W)

    def extra_repr(self) -> str:
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        text = f"{self.in_channels}->{self.out_channels}, kernel=({kh}, {kw})"
        if (sh, sw) != (1, 1):
            text += f", stride=({sh}, {sw})"
        if (ph, pw) != (0, 0):
            text += f", padding=({ph}, {pw})"
        return text + ("" if self.bias is not None else ", bias=False")
