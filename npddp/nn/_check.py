"""Input validation shared by the layers: one clear error naming the layer and what it expects."""

from __future__ import annotations

import numpy as np


def _fmt_shape(shape) -> str:
    """``(32, 100)`` style text for a shape (a 1-tuple keeps its comma)."""
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def check_input(layer, x, expected: tuple, dtype=None) -> None:
    """Raise if ``x`` does not match ``expected`` (ints fixed, strings free) or ``dtype``.

    ``expected`` is a tuple such as ``("B", 784)``; ``dtype=None`` accepts any floating dtype.
    Shape problems raise ``ValueError``, dtype problems ``TypeError``; both name the layer.
    """
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{layer!r}: expected a numpy.ndarray, got {type(x).__name__}")
    shape = x.shape
    bad_shape = len(shape) != len(expected) or any(
        isinstance(e, int) and s != e for s, e in zip(shape, expected))
    bad_dtype = x.dtype.kind != "f" if dtype is None else x.dtype != dtype
    if bad_shape or bad_dtype:
        want = "a floating dtype" if dtype is None else f"dtype {np.dtype(dtype).name}"
        msg = (f"{layer!r}: expected input of shape {_fmt_shape(expected)} "
               f"and {want}, got {_fmt_shape(shape)} {x.dtype.name}")
        raise ValueError(msg) if bad_shape else TypeError(msg)


def check_last_dim(layer, x, features: int, dtype) -> None:
    """Raise unless ``x`` has shape (..., features) (at least one dimension) and exactly ``dtype``.

    Shape problems raise ``ValueError``, dtype problems ``TypeError``; both name the layer.
    """
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{layer!r}: expected a numpy.ndarray, got {type(x).__name__}")
    bad_shape = x.ndim < 1 or x.shape[-1] != features
    if bad_shape or x.dtype != dtype:
        msg = (f"{layer!r}: expected input of shape (..., {features}) and dtype "
               f"{np.dtype(dtype).name}, got {_fmt_shape(x.shape)} {x.dtype.name}")
        raise ValueError(msg) if bad_shape else TypeError(msg)


def check_float_array(layer, x, min_ndim: int = 1) -> None:
    """Raise unless ``x`` is a floating ndarray with at least ``min_ndim`` dimensions."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{layer!r}: expected a numpy.ndarray, got {type(x).__name__}")
    if x.ndim < min_ndim:
        raise ValueError(f"{layer!r}: expected input with at least {min_ndim} dimensions "
                         f"(B, ...) and a floating dtype, got {_fmt_shape(x.shape)} {x.dtype.name}")
    if x.dtype.kind != "f":
        raise TypeError(f"{layer!r}: expected input of shape (B, ...) and a floating dtype, "
                        f"got {_fmt_shape(x.shape)} {x.dtype.name}")


def check_dtype_arg(dtype) -> np.dtype:
    """Return ``np.dtype(dtype)`` if it is a floating type, else raise ``TypeError``."""
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"dtype must be a NumPy floating type, got {dtype!r}") from exc
    if dt.kind != "f":
        raise TypeError(f"dtype must be a NumPy floating type (float32, float64), got {dt.name}")
    return dt


def check_positive_int(name: str, value, minimum: int = 1) -> int:
    """Return ``value`` as int if it is an integer >= ``minimum``, else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def check_rng(rng) -> np.random.Generator:
    """Return a Generator: ``rng`` itself, a fresh one seeded by an int, or an unseeded one for None."""
    if rng is None or isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return np.random.default_rng(rng)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, an int seed or None, got {type(rng).__name__}")
    return rng


def check_dout(layer, dout, shape: tuple) -> None:
    """Raise unless ``dout`` is an array of the shape the last forward produced."""
    if not isinstance(dout, np.ndarray) or dout.shape != shape:
        got = dout.shape if isinstance(dout, np.ndarray) else type(dout).__name__
        raise ValueError(f"{layer!r}: backward expected dout of shape {shape}, got {got}")


def cached(layer, value):
    """Return a forward cache, or raise if backward has no forward that kept one."""
    if value is None:
        raise RuntimeError(f"{layer!r}: backward called before forward (or after a forward under no_grad, "
                           "which keeps nothing for it)")
    return value
