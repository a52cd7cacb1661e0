"""Causal self-attention with its heads split across a tensor group.

From a full :class:`npddp.nn.attention.CausalSelfAttention` with ``h`` heads, rank ``r`` of a
group of ``tp`` keeps heads ``r*h/tp .. (r+1)*h/tp - 1``: the matching rows of q, k and v in
``qkv`` (column-parallel), attention over its own heads only (heads never mix), and the
matching input columns of ``proj`` (row-parallel, whose g all-reduce sums the heads' shares).
So one block's attention costs one all-reduce forward and one backward, of (B, T, d).

The per-head arithmetic is the full layer's (scale 1/sqrt(d/h), position t sees positions
<= t), written plainly on (B, h/tp, T, d/h) arrays.
"""

from __future__ import annotations

import math

import numpy as np

from npddp.nn.attention import CausalSelfAttention
from npddp.nn.module import Module
from npddp.parallel.model.tensor import ColumnParallelLinear, RowParallelLinear, block, check_divisible


def _heads(qkv: np.ndarray, h: int) -> np.ndarray:
    """(B, T, 3 h dh) -> (3, B, h, T, dh) view."""
    b, t, width = qkv.shape
    return qkv.reshape(b, t, 3, h, width // (3 * h)).transpose(2, 0, 3, 1, 4)


class HeadParallelAttention(Module):
    """This rank's heads of a CausalSelfAttention: qkv column-parallel by heads, proj row-parallel."""

    def __init__(self, full: CausalSelfAttention, comm, tracer=None):
        super().__init__()
        check_divisible("num_heads", full.num_heads, comm.size)
        d = full.d_model
        self.num_heads = full.num_heads // comm.size                  # heads on this rank
        self.head_dim = d // full.num_heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        mine = block(d, comm.rank, comm.size)                        # this rank's heads' features
        self.qkv = ColumnParallelLinear(full.qkv, comm, rows=np.concatenate([mine, d + mine, 2 * d + mine]),
                                        tracer=tracer)
        self.proj = RowParallelLinear(full.proj, comm, tracer=tracer)
        self._cache = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        qkv = self.qkv.forward(x)                                      # (B, T, 3 d/tp)
        b, t, _ = qkv.shape
        q, k, v = _heads(qkv, self.num_heads)                          # (B, h', T, dh)
        s = np.matmul(q, k.transpose(0, 1, 3, 2)) * self.scale         # (B, h', T, T)
        s[..., np.triu(np.ones((t, t), dtype=bool), k=1)] = -np.inf
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        s /= s.sum(axis=-1, keepdims=True)                             # P
        y = np.matmul(s, v)                                            # (B, h', T, dh)
        self._cache = (qkv, s)
        return self.proj.forward(y.transpose(0, 2, 1, 3).reshape(b, t, -1))   # (B, T, d)

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """dv = P^T dy; dP = dy v^T; dS = P (dP - rowsum(dP P)); dq = scale dS k; dk = scale dS^T q."""
        qkv, p = self._cache
        self._cache = None
        b, t, _ = qkv.shape
        h, dh = self.num_heads, self.head_dim
        dy = self._backward_child(self.proj, dout)                     # (B, T, h' dh)
        dy = dy.reshape(b, t, h, dh).transpose(0, 2, 1, 3)             # (B, h', T, dh)
        q, k, v = _heads(qkv, h)
        dqkv = np.empty_like(qkv)
        dq, dk, dv = _heads(dqkv, h)
        np.matmul(p.transpose(0, 1, 3, 2), dy, out=dv)
        dp = np.matmul(dy, v.transpose(0, 1, 3, 2))                    # (B, h', T, T)
        dp -= np.einsum("bhij,bhij->bhi", dp, p)[..., None]
        dp *= p                                                        # dS
        np.matmul(dp, k, out=dq)
        dq *= self.scale
        np.matmul(dp.transpose(0, 1, 3, 2), q, out=dk)
        dk *= self.scale
        return self._backward_child(self.qkv, dqkv)                    # (B, T, d), all-reduced by f

    def extra_repr(self) -> str:
        return f"{self.num_heads} heads of {self.head_dim}"
