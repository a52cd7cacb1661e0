"""Dropout with its own seeded random stream, whose state a checkpoint can save and restore.

The stream is a PCG64 generator.  ``get_rng_state()`` returns it as a uint64 array of six
words (state hi/lo, increment hi/lo, has_uint32, uinteger) that HDF5 stores as is, and
``set_rng_state`` accepts that array (or NumPy's ``bit_generator.state`` dict).
"""

from __future__ import annotations

import numbers

import numpy as np

from npddp.nn._check import cached, check_dout, check_float_array
from npddp.nn.module import Module

_MASK64 = (1 << 64) - 1


class Dropout(Module):
    """Zero each element with probability ``p`` in training, scale the rest by 1/(1-p).

    In eval mode (``model.eval()``) it is the identity and draws no random numbers.
    """

    def __init__(self, p: float = 0.5, seed: int = 0):
        super().__init__()
        if not isinstance(p, numbers.Real) or not 0.0 <= float(p) < 1.0:
            raise ValueError(f"Dropout p must be a number in [0, 1), got {p!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"Dropout seed must be an integer >= 0, got {seed!r}")
        self.p = float(p)
        self.seed = int(seed)
        self._rng = np.random.Generator(np.random.PCG64(self.seed))
        self._mask = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        check_float_array(self, x)
        if not self.training or self.p == 0.0:
            self._mask = False if self.grad_enabled else None             # backward: identity
            return x
        draw = self._rng.random(x.shape, dtype=np.float32)                # (B, ...)
        keep = draw >= np.float32(self.p)                                 # (B, ...)
        self._mask = keep if self.grad_enabled else None
        y = np.multiply(x, keep)                                          # (B, ...)
        np.multiply(y, x.dtype.type(1.0 / (1.0 - self.p)), out=y)         # (B, ...)
        return y

    def backward(self, dout: np.ndarray) -> np.ndarray:
        keep = cached(self, self._mask)
        if keep is False:
            return dout
        check_dout(self, dout, keep.shape)
        dx = np.multiply(dout, keep)                                      # (B, ...)
        np.multiply(dx, dx.dtype.type(1.0 / (1.0 - self.p)), out=dx)      # (B, ...)
        return dx

    # --- random state for checkpoints -------------------------------------------------
    def get_rng_state(self) -> np.ndarray:
        """The generator state as uint64 words: state hi, lo, inc hi, lo, has_uint32, uinteger."""
        st = self._rng.bit_generator.state
        s, inc = st["state"]["state"], st["state"]["inc"]
        return np.array([s >> 64, s & _MASK64, inc >> 64, inc & _MASK64,
                         st["has_uint32"], st["uinteger"]], dtype=np.uint64)

    def set_rng_state(self, state) -> None:
        """Restore a state from :meth:`get_rng_state` (or a PCG64 ``bit_generator.state`` dict)."""
        if isinstance(state, dict):
            if state.get("bit_generator") != "PCG64":
                raise ValueError(f"{self!r}: expected a PCG64 state dict, got {state.get('bit_generator')!r}")
            self._rng.bit_generator.state = state
            return
        words = np.asarray(state)
        if words.shape != (6,) or words.dtype.kind not in "iu":
            raise ValueError(f"{self!r}: expected an integer rng state of shape (6,), "
                             f"got {words.shape} {words.dtype.name}")
        w = [int(v) for v in words.astype(np.uint64)]
        self._rng.bit_generator.state = {
            "bit_generator": "PCG64",
            "state": {"state": (w[0] << 64) | w[1], "inc": (w[2] << 64) | w[3]},
            "has_uint32": w[4], "uinteger": w[5]}

    def extra_repr(self) -> str:
        return f"p={self.p}, seed={self.seed}"
