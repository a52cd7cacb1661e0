"""A data set from one .npz or HDF5 file holding an input array and a target array.

Integer targets make a classification set (labels int64, ``num_classes = max + 1``); float
targets make a regression set. Rows are split into train and validation deterministically
from ``seed``.
"""

from __future__ import annotations

import os

import numpy as np

from ._checks import check_float_dtype
from .dataset import Dataset, labels_int64, split_indices

#: File name endings ``load_array_file`` reads.
ARRAY_SUFFIXES = (".npz", ".h5", ".hdf5")


def _read_npz(path: str, keys: tuple[str, str]) -> list[np.ndarray]:
    """The arrays under ``keys`` in an .npz archive (no pickled objects)."""
    with np.load(path, allow_pickle=False) as archive:
        _check_keys(path, keys, list(archive.files))
        return [archive[k] for k in keys]


def _read_hdf5(path: str, keys: tuple[str, str]) -> list[np.ndarray]:
    """The datasets under ``keys`` (paths such as ``group/X`` allowed) in an HDF5 file."""
    import h5py

    with h5py.File(path, "r") as f:
        available = []
        f.visititems(lambda name, obj: available.append(name) if isinstance(obj, h5py.Dataset) else None)
        _check_keys(path, keys, available)
        return [f[k][()] for k in keys]


def _check_keys(path: str, keys: tuple[str, str], available: list[str]) -> None:
    """KeyError listing the available arrays when one of ``keys`` is absent."""
    missing = [k for k in keys if k not in available]
    if missing:
        raise KeyError(f"{path} has no array named {', '.join(map(repr, missing))}; "
                       f"available: {', '.join(map(repr, sorted(available))) or '(none)'} "
                       f"(choose with x_key=/y_key=)")


def load_array_file(path, x_key: str = "X", y_key: str = "y", val_fraction: float = 0.1,
                    seed: int = 0, dtype=np.float32, name: str | None = None) -> Dataset:
    """Inputs ``x_key`` and targets ``y_key`` from an .npz/.h5/.hdf5 file, split into train/val."""
    path = os.fspath(path)
    dtype = check_float_dtype(dtype)
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in ARRAY_SUFFIXES:
        raise ValueError(f"cannot read {path!r}: file name must end in {', '.join(ARRAY_SUFFIXES)}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"array file {os.path.abspath(path)!r} does not exist")
    reader = _read_npz if suffix == ".npz" else _read_hdf5
    X, y = reader(path, (x_key, y_key))
    if X.ndim < 1 or y.ndim < 1 or len(X) != len(y):
        raise ValueError(f"{path}: {x_key!r} has shape {X.shape} and {y_key!r} has shape {y.shape}; "
                         f"both need the same number of rows (first dimension)")
    if not (np.issubdtype(X.dtype, np.number) or X.dtype == np.bool_):
        raise TypeError(f"{path}: {x_key!r} must hold numbers, got dtype {X.dtype}")
    train, val = split_indices(len(X), val_fraction, seed)
    if np.issubdtype(y.dtype, np.integer):
        y, num_classes = labels_int64(y, what=f"{path}:{y_key}")
        task = "classification"
    elif np.issubdtype(y.dtype, np.floating):
        y, num_classes, task = y.astype(dtype), 0, "regression"
    else:
        raise TypeError(f"{path}: {y_key!r} must hold integer labels or float targets, got {y.dtype}")
    X = X.astype(dtype)
    return Dataset(name or os.path.basename(path), X[train], y[train], X[val], y[val],
                   num_classes=num_classes, input_shape=X.shape[1:], task=task,
                   meta={"path": os.path.abspath(path), "x_key": x_key, "y_key": y_key,
                         "val_fraction": float(val_fraction), "seed": int(seed)})
