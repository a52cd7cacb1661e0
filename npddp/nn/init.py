"""Weight initialisers: deterministic given a Generator, sampled in float64, then cast.

Sampling in float64 and casting means a float32 model is the float64 model rounded, so the
two can be compared directly.  ``fan_in`` is the number of inputs feeding one output
(``in_features`` for Linear, ``in_ch * kh * kw`` for Conv2d).

* ``he_normal``    N(0, 2 / fan_in)                      -- layers followed by ReLU (default)
* ``he_uniform``   U(-b, b), b = sqrt(6 / fan_in)          -- same variance as he_normal
* ``lecun_normal`` N(0, 1 / fan_in)                      -- output layers, tanh
* ``lecun_uniform`` U(-b, b), b = sqrt(3 / fan_in)
Biases start at zero.

Layers hand a :class:`Draw` to their Parameter (:func:`draw`, :func:`normal`): values not yet
drawn, which the Parameter draws whole, or which a sharded build (ZeRO-3's ``ShardedInit``)
draws chunk by chunk, keeping only its slice. Either way the stream advances past every value,
in order, so the values are the same bit for bit; only the memory differs.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

#: Values a sharded draw samples at a time (float64): its memory while drawing, whatever the parameter's size.
CHUNK = 1 << 18


class Draw:
    """The next ``prod(shape)`` values of ``rng`` as ``sample(rng, n)`` gives them (float64), cast to ``dtype``."""

    __slots__ = ("rng", "shape", "dtype", "sample")

    def __init__(self, rng: np.random.Generator, shape: tuple, dtype, sample: Callable):
        self.rng, self.shape, self.dtype, self.sample = rng, tuple(shape), np.dtype(dtype), sample

    @property
    def size(self) -> int:
        """Number of values."""
        return math.prod(self.shape)

    def array(self) -> np.ndarray:
        """All the values, drawn now, of ``shape`` and ``dtype``."""
        return self.sample(self.rng, self.size).reshape(self.shape).astype(self.dtype)

    def slice(self, lo: int, hi: int, out: np.ndarray) -> np.ndarray:
        """Draw every value in order, ``CHUNK`` at a time, writing flattened elements ``[lo, hi)`` into ``out``."""
        done = 0
        while done < self.size:
            k = min(CHUNK, self.size - done)
            values = self.sample(self.rng, k)                                 # (k,) float64
            a, b = max(lo, done), min(hi, done + k)
            if a < b:
                out[a - lo:b - lo] = values[a - done:b - done]
            done += k
        return out


def _normal(std: float):
    return lambda rng, n: rng.standard_normal(n) * std


def _uniform(bound: float):
    return lambda rng, n: rng.uniform(-bound, bound, n)


def normal(rng: np.random.Generator, shape: tuple, std: float, dtype) -> Draw:
    """N(0, std**2), not yet drawn."""
    return Draw(rng, shape, dtype, _normal(std))


SCHEMES = {
    "he_normal": lambda fan_in: _normal(math.sqrt(2.0 / fan_in)),
    "he_uniform": lambda fan_in: _uniform(math.sqrt(6.0 / fan_in)),
    "lecun_normal": lambda fan_in: _normal(math.sqrt(1.0 / fan_in)),
    "lecun_uniform": lambda fan_in: _uniform(math.sqrt(3.0 / fan_in)),
}


def draw(name: str, rng: np.random.Generator, shape: tuple, fan_in: int, dtype) -> Draw:
    """Initialiser ``name``'s values, not yet drawn; ``ValueError`` listing the valid names for an unknown one."""
    try:
        scheme = SCHEMES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown init {name!r}; valid: {', '.join(SCHEMES)}") from None
    return Draw(rng, shape, dtype, scheme(fan_in))


def he_normal(rng: np.random.Generator, shape: tuple, fan_in: int, dtype) -> np.ndarray:
    """Kaiming normal: std sqrt(2 / fan_in)."""
    return draw("he_normal", rng, shape, fan_in, dtype).array()


def he_uniform(rng: np.random.Generator, shape: tuple, fan_in: int, dtype) -> np.ndarray:
    """Kaiming uniform: U(-sqrt(6 / fan_in), sqrt(6 / fan_in))."""
    return draw("he_uniform", rng, shape, fan_in, dtype).array()


def lecun_normal(rng: np.random.Generator, shape: tuple, fan_in: int, dtype) -> np.ndarray:
    """LeCun normal: std sqrt(1 / fan_in)."""
    return draw("lecun_normal", rng, shape, fan_in, dtype).array()


def lecun_uniform(rng: np.random.Generator, shape: tuple, fan_in: int, dtype) -> np.ndarray:
    """LeCun uniform: U(-sqrt(3 / fan_in), sqrt(3 / fan_in))."""
    return draw("lecun_uniform", rng, shape, fan_in, dtype).array()


INITS = {
    "he_normal": he_normal,
    "he_uniform": he_uniform,
    "lecun_normal": lecun_normal,
    "lecun_uniform": lecun_uniform,
}


def get_init(name: str):
    """The initialiser called ``name``; ``ValueError`` listing the valid names otherwise."""
    try:
        return INITS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown init {name!r}; valid: {', '.join(INITS)}") from None
