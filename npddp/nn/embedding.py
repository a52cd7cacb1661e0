"""Embedding: a learned row of ``weight`` (V, d) per integer index, as ``torch.nn.Embedding``.

Input is an integer array of any shape (...,); output is (..., d). Backward scatter-adds
``dout`` into the rows that were read (``np.add.at``, exact for repeated indices) and returns
None: integer input has no gradient.
"""

from __future__ import annotations

import numpy as np

from npddp.nn._check import cached, check_dout, check_dtype_arg, check_positive_int, check_rng
from npddp.nn.init import normal
from npddp.nn.module import Module
from npddp.nn.parameter import Parameter


class Embedding(Module):
    """``weight[idx]`` with ``weight`` of shape (num_embeddings, embedding_dim), drawn N(0, init_std**2)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, dtype=np.float32, rng=None,
                 init_std: float = 1.0):
        super().__init__()
        self.num_embeddings = check_positive_int("num_embeddings", num_embeddings)
        self.embedding_dim = check_positive_int("embedding_dim", embedding_dim)
        self.dtype = check_dtype_arg(dtype)
        if not (isinstance(init_std, (int, float)) and init_std >= 0):
            raise ValueError(f"init_std must be a number >= 0, got {init_std!r}")
        rng = check_rng(rng)
        shape = (self.num_embeddings, self.embedding_dim)
        self.weight = Parameter(normal(rng, shape, init_std, self.dtype))  # (V, d)
        self._idx = None

    def forward(self, idx: np.ndarray) -> np.ndarray:
        if not isinstance(idx, np.ndarray) or idx.dtype.kind not in "iu":
            got = f"{idx.shape} {idx.dtype.name}" if isinstance(idx, np.ndarray) else type(idx).__name__
            raise TypeError(f"{self!r}: expected an integer index array of any shape, got {got}")
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_embeddings):
            raise ValueError(f"{self!r}: indices must lie in [0, {self.num_embeddings}), got values in "
                             f"[{idx.min()}, {idx.max()}]")
        self._idx = idx if self.grad_enabled else None             # (...)
        return np.take(self.weight.data, idx, axis=0)              # (..., d)

    def backward(self, dout: np.ndarray) -> None:
        idx = cached(self, self._idx)                              # (...)
        check_dout(self, dout, idx.shape + (self.embedding_dim,))
        np.add.at(self.weight.grad, idx.reshape(-1), dout.reshape(-1, self.embedding_dim))  # (V, d)
        return None

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"
