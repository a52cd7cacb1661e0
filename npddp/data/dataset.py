"""The ``Dataset`` record every loader returns, and the split and label helpers they share."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from npddp.data._checks import as_real, check_seed

#: classification: integer labels (N,); regression: float targets; language_model: token
#: sequences X (N, T) with next-token targets y (N, T) and ``num_classes`` the vocabulary size.
TASKS = ("classification", "regression", "language_model")


@dataclass(frozen=True, repr=False)
class Dataset:
    """Train and validation arrays plus what a model needs to know about them."""

    name: str
    X_train: np.ndarray          # (N_train, *input_shape)
    y_train: np.ndarray          # (N_train,) int64 labels, or (N_train, out) regression targets
    X_val: np.ndarray            # (N_val, *input_shape)
    y_val: np.ndarray            # (N_val,) or (N_val, out)
    num_classes: int             # 0 for regression
    input_shape: tuple
    task: str = "classification"
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        for split, X, y in (("train", self.X_train, self.y_train), ("val", self.X_val, self.y_val)):
            if X.shape[1:] != tuple(self.input_shape):
                raise ValueError(f"X_{split} rows have shape {X.shape[1:]}, expected input_shape "
                                 f"{tuple(self.input_shape)}")
            if len(X) != len(y):
                raise ValueError(f"X_{split} has {len(X)} rows but y_{split} has {len(y)}")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(map(repr, TASKS))}, got {self.task!r}")

    @property
    def n_train(self) -> int:
        """Number of training rows."""
        return len(self.X_train)

    @property
    def n_val(self) -> int:
        """Number of validation rows."""
        return len(self.X_val)

    @property
    def in_features(self) -> int:
        """Product of ``input_shape``: the width of a flattened input row."""
        return int(np.prod(self.input_shape))

    def __repr__(self) -> str:
        return (f"Dataset({self.name!r}, task={self.task}, train={self.X_train.shape} "
                f"{self.X_train.dtype}, val={self.X_val.shape}, num_classes={self.num_classes})")


def split_indices(n: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic (train, val) row numbers, each sorted: ``round(n * val_fraction)`` go to val."""
    val_fraction = as_real(val_fraction, "val_fraction")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must lie in [0, 1), got {val_fraction}")
    n_val = min(int(round(n * val_fraction)), max(n - 1, 0))  # keep at least one training row
    perm = np.random.default_rng(check_seed(seed)).permutation(n)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def labels_int64(y: np.ndarray, what: str = "y") -> tuple[np.ndarray, int]:
    """Integer class labels as a 1-D int64 array and the class count ``max + 1``."""
    y = np.asarray(y)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise TypeError(f"{what} must be a 1-D integer array of class labels, "
                        f"got dtype {y.dtype} shape {y.shape}")
    y = y.astype(np.int64)
    if y.size and y.min() < 0:
        raise ValueError(f"{what} holds a negative label {y.min()}; labels must be >= 0")
    return y, (int(y.max()) + 1 if y.size else 0)
