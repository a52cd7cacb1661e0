"""Weight initialisers: deterministic given a Generator, sampled in float64, then cast.

Sampling in float64 and casting means a float32 model is the float64 model rounded, so the
two can be compared directly.  ``fan_in`` is the number of inputs feeding one output
(``in_features`` for Linear, ``in_ch * kh * kw`` for Conv2d).

* ``he_normal``    N(0, 2 / fan_in)                      -- layers followed by ReLU (default)
* ``he_uniform``   U(-b, b), b = sqrt(6 / fan_in)          -- same variance as he_normal
* ``lecun_normal`` N(0, 1 / fan_in)                      -- output layers, tanh
* ``lecun_uniform`` U(-b, b), b = sqrt(3 / fan_in)
Biases start at zero.
"""

from __future__ import annotations

import math

import numpy as np


def he_normal(rng: np.random.Generator, shape: tuple, fan_in: int, dtype) -> np.ndarray:
    """Kaiming normal: std sqrt(2 / fan_in)."""
    return (rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)).astype(dtype)


def he_uniform(rng: np.random.Generator, shape: tuple, fan_in: int, dtype) -> np.ndarray:
    """Kaiming uniform: U(-sqrt(6 / fan_in), sqrt(6 / fan_in))."""
    bound = math.sqrt(6.0 / fan_in)
    return rng.uniform(-bound, bound, shape).astype(dtype)


def lecun_normal(rng: np.random.Generator, shape: tuple, fan_in: int, dtype) -> np.ndarray:
    """LeCun normal: std sqrt(1 / fan_in)."""
    return (rng.standard_normal(shape) * math.sqrt(1.0 / fan_in)).astype(dtype)


def lecun_uniform(rng: np.random.Generator, shape: tuple, fan_in: int, dtype) -> np.ndarray:
    """LeCun uniform: U(-sqrt(3 / fan_in), sqrt(3 / fan_in))."""
    bound = math.sqrt(3.0 / fan_in)
    return rng.uniform(-bound, bound, shape).astype(dtype)


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
