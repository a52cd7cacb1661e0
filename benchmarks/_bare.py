"""The MLP training step written in bare NumPy: the ceiling a DDP step is measured against.

The same work as one DDP step of :func:`npddp.nn.mlp` with cross-entropy and SGD with momentum
(PyTorch's semantics: the first step's buffer is the gradient, then ``b = mu b + g``;
``w -= lr b``), and no modules, hooks, buckets, averaging or communication: every array is
allocated once, every operation writes in place. The first layer computes no input gradient,
as the benchmark's models do not.
"""

from __future__ import annotations

import time

import numpy as np

from npddp.nn import Linear


class BareMLP:
    """One model's weights (copied from an npddp MLP) and the buffers of its plain-NumPy step."""

    def __init__(self, model, batch: int, lr: float, momentum: float):
        layers = [m for _, m in model.named_modules() if isinstance(m, Linear)]
        self.w = [m.weight.data.copy() for m in layers]                       # (out, in) each
        self.b = [m.bias.data.copy() for m in layers]                         # (out,) each
        dtype = self.w[0].dtype
        self.gw = [np.zeros_like(w) for w in self.w]
        self.gb = [np.zeros_like(b) for b in self.b]
        self.vw = [np.zeros_like(w) for w in self.w]                          # momentum buffers
        self.vb = [np.zeros_like(b) for b in self.b]
        self.h = [np.empty((batch, w.shape[0]), dtype) for w in self.w]       # (B, out) each layer's output
        self.dh = [np.empty((batch, w.shape[1]), dtype) for w in self.w[1:]]  # (B, in) of layers 1..
        self.lr, self.momentum, self.first = lr, momentum, True
        self.rows = np.arange(batch)

    def step(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float, float]:
        """One training step on ``x`` (B, in) with labels ``y`` (B,); (forward, backward, optimizer) seconds."""
        t0 = time.perf_counter()
        w, b, h, last = self.w, self.b, self.h, len(self.w) - 1
        inp = x
        for i in range(last + 1):
            np.matmul(inp, w[i].T, out=h[i])
            h[i] += b[i]
            if i < last:
                np.maximum(h[i], 0, out=h[i])
            inp = h[i]
        logits = h[last]                                   # (B, classes), turned into dL/dlogits in place
        logits -= logits.max(axis=1, keepdims=True)
        np.exp(logits, out=logits)
        logits /= logits.sum(axis=1, keepdims=True)
        logits[self.rows, y] -= 1
        logits /= x.shape[0]
        t1 = time.perf_counter()
        dz = logits
        for i in range(last, -1, -1):
            below = h[i - 1] if i else x
            np.matmul(dz.T, below, out=self.gw[i])
            np.sum(dz, axis=0, out=self.gb[i])
            if i:
                np.matmul(dz, w[i], out=self.dh[i - 1])
                self.dh[i - 1] *= below > 0                # ReLU's gradient
                dz = self.dh[i - 1]
        t2 = time.perf_counter()
        lr, mu = self.lr, self.momentum
        for p, g, v in zip(w + b, self.gw + self.gb, self.vw + self.vb):
            if self.first:
                np.copyto(v, g)
            else:
                v *= mu
                v += g
            np.multiply(v, -lr, out=g)                     # the gradient is spent: its buffer holds the update
            p += g
        self.first = False
        return t1 - t0, t2 - t1, time.perf_counter() - t2
