"""Losses: ``forward(pred, target) -> float`` then ``backward() -> dL/dpred``.

Both average over the batch (MSE over every element), so under data parallelism each rank
returns its local mean and DDP's average over ranks gives the global mean for equal shards.
Losses hold no parameters and are not Modules. ``CrossEntropyLoss.score`` is the forward-only
form evaluation uses: the same loss, bit for bit, and the correct count, keeping nothing.
"""

from __future__ import annotations

import numpy as np


def _fmt(a) -> str:
    """``(32, 10) float32`` for an array, the type name otherwise."""
    return f"{a.shape} {a.dtype.name}" if isinstance(a, np.ndarray) else type(a).__name__


class CrossEntropyLoss:
    """Softmax + negative log-likelihood from logits (B, C) or (B, T, C) and integer targets (B,) or (B, T).

    The mean runs over every target (B or B*T of them), as PyTorch's default reduction.
    Stable for large logits: each row is shifted by its maximum before ``exp``, so the loss
    is ``logsumexp(z) - z[target]`` computed without overflow.
    """

    def __init__(self):
        self._probs = None
        self._target = None
        self._shape = None

    def _check(self, logits, target) -> None:
        """Logits (B, C) or (B, T, C) floating, target of the leading shape, integer in [0, C)."""
        if (not isinstance(logits, np.ndarray) or logits.ndim not in (2, 3) or logits.dtype.kind != "f"):
            raise ValueError(f"CrossEntropyLoss: expected logits of shape (B, C) or (B, T, C) and a "
                             f"floating dtype, got {_fmt(logits)}")
        lead, c = logits.shape[:-1], logits.shape[-1]
        if 0 in lead:
            raise ValueError(f"CrossEntropyLoss: empty batch (logits {logits.shape})")
        want = ", ".join(map(str, lead)) + ("," if len(lead) == 1 else "")
        if (not isinstance(target, np.ndarray) or target.shape != lead
                or target.dtype.kind not in "iu"):
            raise ValueError(f"CrossEntropyLoss: expected integer targets of shape ({want}), got {_fmt(target)}")
        if target.min() < 0 or target.max() >= c:
            raise ValueError(f"CrossEntropyLoss: targets must be in [0, {c}), got values in "
                             f"[{target.min()}, {target.max()}]")

    @staticmethod
    def _nll(logits: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(nll (N,), exp(z - rowmax) (N, C), its row sums (N,)) of checked logits and targets."""
        c = logits.shape[-1]
        z = logits.reshape(-1, c)                                         # (N, C)
        t = target.reshape(-1)                                            # (N,)
        e = np.subtract(z, z.max(axis=1, keepdims=True))                  # (N, C) max is 0
        picked = e[np.arange(len(t)), t]                                  # (N,) z[target] - max
        np.exp(e, out=e)
        s = e.sum(axis=1)                                                 # (N,)
        return np.log(s) - picked, e, s

    def forward(self, logits: np.ndarray, target: np.ndarray) -> float:
        """Mean cross-entropy over every target."""
        self._check(logits, target)
        nll, e, s = self._nll(logits, target)
        np.divide(1.0, s, out=s)
        e *= s[:, None]                                                   # (N, C) softmax
        self._probs, self._target, self._shape = e, target.reshape(-1), logits.shape
        return float(nll.mean())

    def score(self, logits: np.ndarray, target: np.ndarray) -> tuple[float, int]:
        """(mean cross-entropy, as ``forward`` gives it, and the ``correct`` count); keeps nothing for backward."""
        self._check(logits, target)
        nll, _, _ = self._nll(logits, target)
        return float(nll.mean()), int(np.count_nonzero(logits.argmax(axis=-1) == target))

    def backward(self) -> np.ndarray:
        """dL/dlogits = (softmax - onehot) / N, in the logits' shape and dtype."""
        if self._probs is None:
            raise RuntimeError("CrossEntropyLoss: backward called before forward")
        probs, target = self._probs, self._target                       # (N, C), (N,)
        n = probs.shape[0]
        d = probs.copy()                                                  # (N, C)
        d[np.arange(n), target] -= 1
        d *= 1.0 / n                                                      # (N, C)
        return d.reshape(self._shape)

    def correct(self, logits: np.ndarray, target: np.ndarray) -> int:
        """How many targets (rows, or tokens) have their largest logit at the target class."""
        self._check(logits, target)
        return int(np.count_nonzero(logits.argmax(axis=-1) == target))

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
