"""Argument checks shared by the data modules: each raises a TypeError/ValueError naming the value."""

from __future__ import annotations

import operator

import numpy as np

from npddp.util.shown import shown

#: Element types accepted for inputs (labels of classification data are always int64).
FLOAT_DTYPES = ("float16", "float32", "float64")


def _typed(value) -> str:
    """``value`` with its type, as an error message shows it (an array by shape, never in full)."""
    return shown(value) if isinstance(value, np.ndarray) and value.ndim else f"{type(value).__name__} {shown(value)}"


def as_int(value, what: str) -> int:
    """``value`` as a Python int; TypeError naming it unless it is an integer (bool excluded)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be an int, got bool {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {_typed(value)}") from None


def check_count(value, what: str, minimum: int = 0) -> int:
    """``value`` as an int >= ``minimum``; TypeError/ValueError naming it otherwise."""
    value = as_int(value, what)
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return value


def check_seed(seed, what: str = "seed") -> int:
    """``seed`` as a non-negative int (what ``np.random.default_rng`` accepts)."""
    return check_count(seed, what)


def check_float_dtype(dtype) -> np.dtype:
    """``dtype`` as a NumPy float dtype; TypeError naming the valid ones otherwise."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype {shown(dtype)} is not a NumPy dtype; valid dtypes: "
                        f"{', '.join(FLOAT_DTYPES)}") from None
    if dt.name not in FLOAT_DTYPES:
        raise TypeError(f"dtype must be a float type ({', '.join(FLOAT_DTYPES)}), got {dt}")
    return dt


def as_real(value, what: str) -> float:
    """``value`` as a Python float; TypeError naming it unless it is a real number (bool excluded)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} must be a real number, got {_typed(value)}")
    return float(value)
