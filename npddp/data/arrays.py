"""A data set from array files: one .npz or HDF5 file, or a directory of two .npy files.

The inputs are the array ``x_key`` and the targets ``y_key`` (``X`` and ``y`` by default; in
HDF5 a path such as ``train/images``; in a directory the files ``<x_key>.npy`` and
``<y_key>.npy``). Integer targets make a classification set (labels int64, ``num_classes =
max + 1``); float targets make a regression set. Rows are split into train and validation
deterministically from ``seed``.

Every file that cannot be used -- missing, not a regular file (a FIFO would block the
reader), of another format than its name says, corrupt, truncated, holding pickled objects,
mis-shaped, or holding NaN or infinite inputs -- is a :class:`DataFileError` (a ValueError)
or, for an absent array, a KeyError, each a one-line message naming the file.
"""

from __future__ import annotations

import os
import stat
import zipfile
import zlib

import numpy as np

from npddp.data._checks import check_float_dtype
from npddp.data.dataset import Dataset, labels_int64, split_indices

#: File name endings ``load_array_file`` reads (besides directories of .npy files).
ARRAY_SUFFIXES = (".npz", ".h5", ".hdf5")

_MAGIC = {b"\x93NUMPY": ".npy", b"PK\x03\x04": ".npz", b"PK\x05\x06": ".npz", b"\x89HDF\r\n\x1a\n": ".h5"}
#: What a damaged file raises inside NumPy, zipfile and h5py.
_READ_ERRORS = (OSError, ValueError, EOFError, TypeError, zipfile.BadZipFile, zlib.error, RuntimeError)


class DataFileError(ValueError):
    """An array file that cannot be used, with a message naming it and why."""


def check_regular_file(path: str, what: str = "file") -> None:
    """FileNotFoundError when ``path`` is missing, DataFileError when it is not a regular file."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {os.path.abspath(path)!r} does not exist") from None
    except OSError as exc:
        raise DataFileError(f"cannot read {what} {path!r}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else \
            "a socket" if stat.S_ISSOCK(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) \
            else "not a regular file"
        raise DataFileError(f"{what} {path!r} is {kind}, not a regular file")


def _sniff(path: str) -> str | None:
    """The format the file's first bytes announce (.npy, .npz, .h5), or None."""
    with open(path, "rb") as f:
        head = f.read(8)
    return next((kind for magic, kind in _MAGIC.items() if head.startswith(magic)), None)


def _damaged(path: str, kind: str, exc: BaseException) -> DataFileError:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "allow_pickle" in text:
        return DataFileError(f"cannot read {path!r}: it holds pickled Python objects, which are never "
                             f"loaded (save plain numeric arrays)")
    return DataFileError(f"cannot read {path!r}: damaged or truncated {kind} file ({text})")


def _read_npz(path: str, keys: tuple[str, str]) -> list[np.ndarray]:
    """The arrays under ``keys`` in an .npz archive (no pickled objects)."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            _check_keys(path, keys, [k for k in archive.files])
            return [archive[k] for k in keys]
    except KeyError:
        raise
    except _READ_ERRORS as exc:
        raise _damaged(path, ".npz", exc) from None


def _read_npy(path: str) -> np.ndarray:
    """One .npy array (no pickled objects)."""
    try:
        return np.load(path, allow_pickle=False)
    except _READ_ERRORS as exc:
        raise _damaged(path, ".npy", exc) from None


def _read_hdf5(path: str, keys: tuple[str, str]) -> list[np.ndarray]:
    """The datasets under ``keys`` (paths such as ``group/X`` allowed) in an HDF5 file."""
    import h5py

    try:
        with h5py.File(path, "r") as f:
            available = []
            f.visititems(lambda name, obj: available.append(name) if isinstance(obj, h5py.Dataset) else None)
            _check_keys(path, keys, available)
            return [f[k][()] for k in keys]
    except KeyError:
        raise
    except _READ_ERRORS as exc:
        raise _damaged(path, "HDF5", exc) from None


def _check_keys(path: str, keys: tuple[str, str], available: list[str]) -> None:
    """KeyError listing the available arrays when one of ``keys`` is absent."""
    missing = [k for k in keys if k not in available]
    if missing:
        raise KeyError(f"{path} has no array named {', '.join(map(repr, missing))}; "
                       f"available: {', '.join(map(repr, sorted(available))) or '(none)'} "
                       f"(choose them with --x-key/--y-key, or x_key=/y_key=)")


def read_arrays(path, x_key: str = "X", y_key: str = "y") -> tuple[np.ndarray, np.ndarray]:
    """(X, y) from an .npz/.h5/.hdf5 file or a directory holding ``<x_key>.npy`` and ``<y_key>.npy``."""
    path = os.fspath(path)
    if os.path.isdir(path):
        files = [os.path.join(path, f"{key}.npy") for key in (x_key, y_key)]
        missing = [os.path.basename(f) for f in files if not os.path.exists(f)]
        if missing:
            have = sorted(n for n in os.listdir(path) if n.endswith(".npy"))
            raise KeyError(f"directory {path!r} has no {' or '.join(missing)}; .npy files there: "
                           f"{', '.join(have) or '(none)'} (choose them with --x-key/--y-key)")
        arrays = []
        for f in files:
            check_regular_file(f, "array file")
            if _sniff(f) != ".npy":
                raise DataFileError(f"cannot read {f!r}: not a .npy file")
            arrays.append(_read_npy(f))
        return arrays[0], arrays[1]
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in ARRAY_SUFFIXES:
        raise DataFileError(f"cannot read {path!r}: file name must end in {', '.join(ARRAY_SUFFIXES)} "
                            f"(or name a directory of .npy files)")
    check_regular_file(path, "array file")
    found = _sniff(path)
    expected = ".npz" if suffix == ".npz" else ".h5"
    if found != expected:
        what = f"a {found} file" if found else "neither .npz, .npy nor HDF5 (empty, truncated or another format)"
        hint = " (put X.npy and y.npy in a directory and pass the directory)" if found == ".npy" else ""
        raise DataFileError(f"cannot read {path!r}: its name says {suffix} but it is {what}{hint}")
    reader = _read_npz if suffix == ".npz" else _read_hdf5
    X, y = reader(path, (x_key, y_key))
    return X, y


def check_arrays(path: str, X: np.ndarray, y: np.ndarray, x_key: str, y_key: str) -> None:
    """DataFileError unless X and y have matching rows, numeric X without NaN/inf, 1-D or 2-D y."""
    if X.ndim < 1 or y.ndim < 1 or len(X) != len(y):
        raise DataFileError(f"{path}: {x_key!r} has shape {X.shape} and {y_key!r} has shape {y.shape}; "
                            f"both need the same number of rows (first dimension)")
    if len(X) < 2:
        raise DataFileError(f"{path}: {x_key!r} has {len(X)} row(s); at least 2 are needed (train and validation)")
    if not (np.issubdtype(X.dtype, np.number) or X.dtype == np.bool_):
        raise DataFileError(f"{path}: {x_key!r} must hold numbers, got dtype {X.dtype}")
    if np.issubdtype(X.dtype, np.inexact) and not np.all(np.isfinite(X)):
        bad = int(np.size(X) - np.count_nonzero(np.isfinite(X)))
        raise DataFileError(f"{path}: {x_key!r} holds {bad} NaN or infinite value(s)")


def load_array_file(path, x_key: str = "X", y_key: str = "y", val_fraction: float = 0.1,
                    seed: int = 0, dtype=np.float32, name: str | None = None) -> Dataset:
    """Inputs ``x_key`` and targets ``y_key`` from an .npz/.h5/.hdf5 file or a .npy directory, split into train/val."""
    path = os.fspath(path)
    dtype = check_float_dtype(dtype)
    X, y = read_arrays(path, x_key, y_key)
    check_arrays(path, X, y, x_key, y_key)
    train, val = split_indices(len(X), val_fraction, seed)
    if np.issubdtype(y.dtype, np.integer):
        y, num_classes = labels_int64(y, what=f"{path}:{y_key}")
        task = "classification"
    elif np.issubdtype(y.dtype, np.floating):
        y, num_classes, task = y.astype(dtype), 0, "regression"
    else:
        raise TypeError(f"{path}: {y_key!r} must hold integer labels or float targets, got {y.dtype}")
    source_dtype = str(X.dtype)
    X = X.astype(dtype)
    return Dataset(name or os.path.basename(os.path.normpath(path)), X[train], y[train], X[val], y[val],
                   num_classes=num_classes, input_shape=X.shape[1:], task=task,
                   meta={"path": os.path.abspath(path), "x_key": x_key, "y_key": y_key,
                         "val_fraction": float(val_fraction), "seed": int(seed),
                         "source_dtype": source_dtype})
