"""Causal multi-head self-attention on (B, T, d), written as batched matmuls over (B, h, T, d/h).

``qkv = Linear(d, 3d)`` splits its output as q, k, v, each (B, T, h, d/h) (as GPT-2 and
nanoGPT do); ``P = softmax(q k^T / sqrt(d/h))`` with position t attending to positions <= t;
heads ``P v`` are laid back side by side to (B, T, d) and ``proj = Linear(d, d)`` mixes them.

No loops over tokens or heads: every product is one ``np.matmul`` over the (B, h) batch,
reading q, k, v as strided views of the qkv output and writing ``P v`` straight into the
(B, T, h, d/h) layout the projection reads. ``P = r * E`` is never normalised in place: with
``E = exp(S - rowmax)`` and ``r = 1 / rowsum(E)``, the row scale ``r`` is applied to the
(T, d/h) operands instead of the (T, T) ones, which saves a pass over (B, h, T, T) in each
direction. Forward keeps the qkv output (with q pre-scaled), ``E`` and ``r`` (under ``no_grad``
none of them: they are freed before the output projection runs); backward holds
at most two (B, h, T, T) arrays (``E`` and ``r dP``), overwrites them in place, and lets both
go when it returns.
"""

from __future__ import annotations

import math

import numpy as np

from npddp.nn._check import cached, check_dout, check_dtype_arg, check_last_dim, check_positive_int, check_rng
from npddp.nn.layers import Linear
from npddp.nn.module import Module


def _heads(qkv: np.ndarray, h: int) -> np.ndarray:
    """(B, T, 3d) -> (3, B, h, T, d/h) view: q, k, v split per head."""
    b, t, three_d = qkv.shape
    return qkv.reshape(b, t, 3, h, three_d // (3 * h)).transpose(2, 0, 3, 1, 4)


class CausalSelfAttention(Module):
    """Multi-head attention where each position sees itself and earlier positions only.

    Both projections are drawn N(0, init_std**2) (the output one N(0, proj_std**2) when given),
    or LeCun-normal when ``init_std`` is None; biases start at zero.
    """

    def __init__(self, d_model: int, num_heads: int, *, dtype=np.float32, rng=None,
                 init_std: float | None = None, proj_std: float | None = None):
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.num_heads = check_positive_int("num_heads", num_heads)
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model {d_model} must be a multiple of num_heads {num_heads}")
        self.dtype = check_dtype_arg(dtype)
        rng = check_rng(rng)
        proj_std = init_std if proj_std is None else proj_std
        self.qkv = Linear(d_model, 3 * d_model, dtype=dtype, rng=rng, init="lecun_normal",
                          init_std=init_std)                                         # (3d, d)
        self.proj = Linear(d_model, d_model, dtype=dtype, rng=rng, init="lecun_normal",
                           init_std=proj_std)                                        # (d, d)
        self.scale = 1.0 / math.sqrt(self.d_model // self.num_heads)  # a Python float: no upcast
        self._qkv = None
        self._e = None
        self._r = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        check_last_dim(self, x, self.d_model, self.dtype)
        if x.ndim != 3:
            raise ValueError(f"{self!r}: expected input of shape (B, T, {self.d_model}), got {x.shape}")
        b, t, d = x.shape
        h, dh = self.num_heads, d // self.num_heads
        qkv = self.qkv.forward(x)                                  # (B, T, 3d)
        q, k, v = _heads(qkv, h)                                   # (B, h, T, dh) views
        q *= self.scale                                            # in place, inside qkv
        e = np.matmul(q, k.transpose(0, 1, 3, 2))                  # (B, h, T, T) scores
        np.copyto(e, -np.inf, where=np.triu(np.ones((t, t), dtype=bool), k=1))  # j > i: masked
        e -= e.max(axis=-1, keepdims=True)                         # row max is 0: stable exp
        np.exp(e, out=e)                                           # (B, h, T, T) E, P = r * E
        r = e.sum(axis=-1, keepdims=True)                          # (B, h, T, 1)
        np.divide(1.0, r, out=r)                                   # r = 1 / rowsum(E)
        y = np.empty((b, t, h, dh), dtype=x.dtype)                 # (B, T, h, dh)
        yh = y.transpose(0, 2, 1, 3)                               # (B, h, T, dh) view
        np.matmul(e, v, out=yh)
        yh *= r                                                    # P v, normalising (T, dh) not (T, T)
        self._qkv, self._e, self._r = (qkv, e, r) if self.grad_enabled else (None, None, None)
        del qkv, q, k, v, e, r                                     # no_grad: freed before proj allocates
        return self.proj.forward(y.reshape(b, t, d))               # (B, T, d)

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """With P = r * E: dv = E^T (r dy); A = (r dy) v^T = r dP; dS = E * (A - r rowsum(A * E))."""
        qkv = cached(self, self._qkv)                              # (B, T, 3d), q scaled
        e, r = self._e, self._r                                    # (B, h, T, T), (B, h, T, 1)
        b, t, three_d = qkv.shape
        check_dout(self, dout, (b, t, self.d_model))
        h, dh = self.num_heads, self.d_model // self.num_heads
        self._qkv = self._e = self._r = None                       # dropped once backward is done
        dy = self._backward_child(self.proj, dout)                 # (B, T, d), ours to scale
        dy = dy.reshape(b, t, h, dh).transpose(0, 2, 1, 3)         # (B, h, T, dh)
        dy *= r                                                    # r dy
        q, k, v = _heads(qkv, h)                                   # (B, h, T, dh)
        dqkv = np.empty_like(qkv)                                  # (B, T, 3d)
        dq, dk, dv = _heads(dqkv, h)                               # (B, h, T, dh) views
        np.matmul(e.transpose(0, 1, 3, 2), dy, out=dv)             # P^T dy
        a = np.matmul(dy, v.transpose(0, 1, 3, 2))                 # (B, h, T, T) r dP
        c = np.einsum("bhij,bhij->bhi", a, e)[..., None]           # (B, h, T, 1) rowsum(r dP * E)
        c *= r
        a -= c
        a *= e                                                     # dS = P * (dP - rowsum(dP * P))
        del e
        np.matmul(a, k, out=dq)                                    # d(scaled q)
        dq *= self.scale                                           # (B, h, T, dh)
        np.matmul(a.transpose(0, 1, 3, 2), q, out=dk)              # (B, h, T, dh)
        del a
        return self._backward_child(self.qkv, dqkv)                # (B, T, d)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}"
