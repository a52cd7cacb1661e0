"""Input scaling on load: standardise features, or scale them to [0, 1], from training rows only.

Networks initialised for inputs of unit scale learn nothing from raw pixel values 0..255
(the loss explodes or stalls at chance): :func:`unscaled_reason` says when inputs look like
that, and :func:`normalize` rescales a :class:`Dataset`:

* ``standard``: per input position, subtract the training mean and divide by the training
  standard deviation (1 where it is 0);
* ``unit``: ``(x - min) / (max - min)`` with the training set's overall min and max;
* ``none``: unchanged.

Validation rows are scaled with the training statistics, so nothing leaks from them.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from npddp.data.dataset import Dataset

#: The ways :func:`normalize` rescales inputs.
NORMALIZE_MODES = ("none", "standard", "unit")

#: Inputs with a magnitude beyond this look unscaled.
UNSCALED_LIMIT = 10.0


def unscaled_reason(ds: Dataset) -> str | None:
    """Why ``ds``'s inputs look unscaled (an integer source dtype, or values beyond +-10), or None."""
    source = ds.meta.get("source_dtype")
    if source is not None and (np.issubdtype(np.dtype(source), np.integer) or np.dtype(source) == np.bool_):
        return f"its inputs were stored as {source}"
    if ds.n_train:
        low, high = float(np.min(ds.X_train)), float(np.max(ds.X_train))
        if max(abs(low), abs(high)) > UNSCALED_LIMIT:
            return f"its inputs range over [{low:g}, {high:g}]"
    return None


def normalize(ds: Dataset, mode: str) -> Dataset:
    """``ds`` with inputs rescaled as ``mode`` says (statistics from the training rows)."""
    if mode not in NORMALIZE_MODES:
        raise ValueError(f"normalize must be one of {', '.join(NORMALIZE_MODES)}, got {mode!r}")
    if mode == "none" or ds.n_train == 0:
        return ds
    X, V = ds.X_train, ds.X_val
    stats = np.float64 if X.dtype == np.float64 else np.float32
    if mode == "standard":
        mean = X.mean(axis=0, dtype=np.float64)                        # (*input_shape)
        std = X.std(axis=0, dtype=np.float64)                          # (*input_shape)
        std[std == 0] = 1.0
        shift, scale = mean.astype(stats), (1.0 / std).astype(stats)
    else:
        low, high = float(X.min()), float(X.max())
        shift, scale = stats(low), stats(1.0 / (high - low) if high > low else 1.0)
    X = ((X - shift) * scale).astype(X.dtype, copy=False)             # (N_train, *input_shape)
    V = ((V - shift) * scale).astype(V.dtype, copy=False)             # (N_val, *input_shape)
    return dataclasses.replace(ds, X_train=X, X_val=V, meta={**ds.meta, "normalize": mode})
