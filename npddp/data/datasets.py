"""Data sets by name: what the training CLI's ``--dataset`` accepts.

``load_dataset(name)`` takes one of ``DATASET_NAMES``, a path ending in .npz/.h5/.hdf5, or a
directory holding ``X.npy`` and ``y.npy``;
extra keyword arguments go to the loader for that name.
"""

from __future__ import annotations

import os

import numpy as np

from npddp.data._checks import check_float_dtype
from npddp.data.arrays import ARRAY_SUFFIXES, load_array_file
from npddp.data.dataset import Dataset, labels_int64, split_indices
from npddp.data.mnist import load_mnist
from npddp.data.synthetic import synthetic_classification, synthetic_regression
from npddp.data.tokens import load_text_file, load_token_file, synthetic_tokens
from npddp.util.shown import shown

#: Names ``load_dataset`` knows, besides paths to array files and ``tokens:PATH`` / ``text:PATH``.
DATASET_NAMES = ("synthetic", "synthetic-image", "regression", "digits", "mnist", "synthetic-tokens")

#: Prefixes of token data sets: ``tokens:PATH`` (.bin uint16 or .npy ids), ``text:PATH`` (bytes).
TOKEN_PREFIXES = ("tokens:", "text:")

#: Image shape of the ``synthetic-image`` set unless ``image_shape=`` says otherwise.
DEFAULT_IMAGE_SHAPE = (1, 16, 16)


def load_digits(seed: int = 0, dtype=np.float32, val_fraction: float = 0.2,
                as_images: bool = False) -> Dataset:
    """scikit-learn's bundled 8x8 digits (1797 rows, 10 classes) scaled to [0, 1]; needs scikit-learn."""
    dtype = check_float_dtype(dtype)
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError as exc:
        raise ImportError("the 'digits' data set needs scikit-learn, an optional extra: "
                          "pip install scikit-learn (or pip install npddp[digits])") from exc
    bunch = sklearn_digits()
    X = np.asarray(bunch.data, dtype=np.float64) / 16.0    # (N, 64), pixel values 0..16
    y, num_classes = labels_int64(np.asarray(bunch.target), what="digits target")
    shape = (1, 8, 8) if as_images else (64,)
    X = X.reshape((len(X),) + shape).astype(dtype)
    train, val = split_indices(len(X), val_fraction, seed)
    return Dataset("digits", X[train], y[train], X[val], y[val], num_classes=num_classes,
                   input_shape=shape, meta={"seed": int(seed), "val_fraction": float(val_fraction)})


def load_dataset(name: str, data_dir: str | None = None, seed: int = 0, dtype=np.float32,
                 **kwargs) -> Dataset:
    """Build the data set called ``name`` (see ``DATASET_NAMES``) or read the array file at ``name``.

    ``data_dir`` is where 'mnist' and relative array-file and token-file paths are looked up;
    the synthetic and digits sets read no files. Token sets (``synthetic-tokens``,
    ``tokens:PATH``, ``text:PATH``) take ``context_length`` (and ``vocab_size``) keywords.
    """
    if not isinstance(name, (str, os.PathLike)):
        raise TypeError(f"dataset name must be a str, got {type(name).__name__} {shown(name)}")
    name = os.fspath(name)
    if name == "synthetic":
        return synthetic_classification(seed=seed, dtype=dtype, **kwargs)
    if name == "synthetic-image":
        kwargs.setdefault("image_shape", DEFAULT_IMAGE_SHAPE)
        return synthetic_classification(seed=seed, dtype=dtype, **kwargs)
    if name == "regression":
        return synthetic_regression(seed=seed, dtype=dtype, **kwargs)
    if name == "digits":
        return load_digits(seed=seed, dtype=dtype, **kwargs)
    if name == "mnist":
        if data_dir is None:
            raise ValueError("the 'mnist' data set needs data_dir: the directory holding "
                             "train-images-idx3-ubyte and the other three IDX files")
        return load_mnist(data_dir, dtype=dtype, **kwargs)
    if name == "synthetic-tokens":
        return synthetic_tokens(seed=seed, **kwargs)
    if name.startswith(TOKEN_PREFIXES):
        prefix, _, path = name.partition(":")
        if not path:
            raise ValueError(f"dataset {name!r} names no file: write {prefix}:PATH")
        path = path if data_dir is None or os.path.isabs(path) else os.path.join(data_dir, path)
        return (load_token_file if prefix == "tokens" else load_text_file)(path, **kwargs)
    path = name if data_dir is None or os.path.isabs(name) else os.path.join(data_dir, name)
    if name.lower().endswith(ARRAY_SUFFIXES) or os.path.isdir(path):
        return load_array_file(path, seed=seed, dtype=dtype, **kwargs)
    raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(DATASET_NAMES)}, "
                     f"tokens:PATH, text:PATH, a path ending in {', '.join(ARRAY_SUFFIXES)}, "
                     "or a directory of .npy files")
