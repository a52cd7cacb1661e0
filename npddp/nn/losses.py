"""Losses: ``forward(pred, target) -> float`` then ``backward() -> dL/dpred``.

Both average over the batch (MSE over every element), so under data parallelism each rank
returns its local mean and DDP's average over ranks gives the global mean for equal shards.
Losses hold no parameters and are not Modules.
"""

from __future__ import annotations

import numpy as np


def _fmt(a) -> str:
    """``(32, 10) float32`` for an array, the type name otherwise."""
    return f"{a.shape} {a.dtype.name}" if isinstance(a, np.ndarray) else type(a).__name__


class CrossEntropyLoss:
    """Softmax + negative log-likelihood from logits (B, C) and integer class targets (B,).

    Stable for large logits: each row is shifted by its maximum before ``exp``, so the loss
    is ``logsumexp(z) - z[target]`` computed without overflow.
    """

    def __init__(self):
        self._probs = None
        self._target = None

    def _check(self, logits, target) -> None:
        """Logits (B, C) floating, target (B,) integer in [0, C)."""
        if not isinstance(logits, np.ndarray) or logits.ndim != 2 or logits.dtype.kind != "f":
            raise ValueError(f"CrossEntropyLoss: expected logits of shape (B, C) and a floating dtype, "
                             f"got {_fmt(logits)}")
        b, c = logits.shape
        if b == 0:
            raise ValueError("CrossEntropyLoss: empty batch (B = 0)")
        if (not isinstance(target, np.ndarray) or target.shape != (b,)
                or target.dtype.kind not in "iu"):
            raise ValueError(f"CrossEntropyLoss: expected integer targets of shape ({b},), got {_fmt(target)}")
        if target.min() < 0 or target.max() >= c:
            raise ValueError(f"CrossEntropyLoss: targets must be in [0, {c}), got values in "
                             f"[{target.min()}, {target.max()}]")

    def forward(self, logits: np.ndarray, target: np.ndarray) -> float:
        """Mean cross-entropy over the batch."""
        self._check(logits, target)
        b = logits.shape[0]
        rows = np.arange(b)
        z = logits - logits.max(axis=1, keepdims=True)                   # (B, C) max is 0
        e = np.exp(z)                                                     # (B, C)
        s = e.sum(axis=1)                                                 # (B,)
        nll = np.log(s) - z[rows, target]                                 # (B,)
        np.divide(e, s[:, None], out=e)                                   # (B, C) softmax
        self._probs, self._target = e, target
        return float(nll.mean())

    def backward(self) -> np.ndarray:
        """dL/dlogits = (softmax - onehot) / B, in the logits' dtype."""
        if self._probs is None:
            raise RuntimeError("CrossEntropyLoss: backward called before forward")
        probs, target = self._probs, self._target                       # (B, C), (B,)
        b = probs.shape[0]
        d = probs.copy()                                                  # (B, C)
        d[np.arange(b), target] -= 1
        np.divide(d, b, out=d)                                            # (B, C)
        return d

    def correct(self, logits: np.ndarray, target: np.ndarray) -> int:
        """How many rows have their largest logit at the target class."""
        self._check(logits, target)
        return int(np.count_nonzero(logits.argmax(axis=1) == target))

    __call__ = forward


class MSELoss:
    """Mean squared error over every element: ``mean((pred - target)**2)``."""

    def __init__(self):
        self._diff = None

    def forward(self, pred: np.ndarray, target: np.ndarray) -> float:
        """Mean of the squared differences."""
        if not isinstance(pred, np.ndarray) or pred.dtype.kind != "f" or pred.size == 0:
            raise ValueError(f"MSELoss: expected a non-empty floating prediction array, got {_fmt(pred)}")
        if not isinstance(target, np.ndarray) or target.shape != pred.shape:
            raise ValueError(f"MSELoss: expected target of shape {pred.shape}, got {_fmt(target)}")
        diff = np.subtract(pred, target, dtype=pred.dtype)               # (B, ...)
        self._diff = diff
        return float(np.vdot(diff, diff) / diff.size)

    def backward(self) -> np.ndarray:
        """dL/dpred = 2 (pred - target) / N."""
        if self._diff is None:
            raise RuntimeError("MSELoss: backward called before forward")
        d = self._diff
        return np.multiply(d, d.dtype.type(2.0 / d.size))                # (B, ...)

    __call__ = forward
