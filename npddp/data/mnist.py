"""MNIST (or any data set in the same IDX files, e.g. Fashion-MNIST) from a local directory.

An IDX file is a big-endian header, ``0x00 0x00 <type code> <ndim>`` then ``ndim`` uint32
sizes, followed by the values in C order. Each of the four files may be stored raw or
gzipped (``name`` or ``name.gz``). Nothing is downloaded.
"""

from __future__ import annotations

import gzip
import os

import numpy as np

from npddp.data._checks import check_float_dtype
from npddp.data.dataset import Dataset

#: (train images, train labels, test images, test labels), as distributed.
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
               "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")

#: IDX type code -> big-endian element type.
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def parse_idx(raw: bytes, what: str = "IDX data") -> np.ndarray:
    """Decode the bytes of one IDX file into an array of its declared type and shape."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise ValueError(f"{what}: bad IDX magic number {raw[:4].hex() or '(empty)'}; expected "
                         f"00 00 <type code in {sorted(_IDX_TYPES)}> <ndim>")
    dtype, ndim = np.dtype(_IDX_TYPES[raw[2]]), raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{what}: file ends inside its header ({len(raw)} bytes, header needs {header})")
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise ValueError(f"{what}: header declares shape {shape} ({expected} bytes in all) "
                         f"but the file holds {len(raw)} bytes")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


def read_idx(path: str) -> np.ndarray:
    """Read one IDX file, gunzipping it when its name ends in ``.gz``."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return parse_idx(f.read(), what=path)


def _find(data_dir: str, name: str) -> str | None:
    """Path of ``name`` or ``name.gz`` inside ``data_dir``, or None."""
    for candidate in (name, name + ".gz"):
        path = os.path.join(data_dir, candidate)
        if os.path.isfile(path):
            return path
    return None


def _read_pair(images_path: str, labels_path: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, H, W) uint8 and labels (N,) uint8, checked against each other."""
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.dtype != np.uint8 or images.ndim != 3:
        raise ValueError(f"{images_path}: expected unsigned-byte images of 3 dimensions (magic "
                         f"00000803), got {images.dtype.name} with shape {images.shape}")
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise ValueError(f"{labels_path}: expected unsigned-byte labels of 1 dimension (magic "
                         f"00000801), got {labels.dtype.name} with shape {labels.shape}")
    if len(images) != len(labels):
        raise ValueError(f"{images_path} holds {len(images)} images but {labels_path} holds "
                         f"{len(labels)} labels")
    return images, labels


def _unit_images(images: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """uint8 (N, H, W) -> (N, 1, H, W) of ``dtype`` scaled to [0, 1]."""
    out = images[:, None].astype(dtype)  # (N, 1, H, W)
    out /= dtype.type(255)
    return out


def load_mnist(data_dir: str, dtype=np.float32, name: str = "mnist") -> Dataset:
    """The four MNIST IDX files in ``data_dir`` as (N, 1, H, W) images in [0, 1]; t10k is the val set."""
    dtype = check_float_dtype(dtype)
    data_dir = os.fspath(data_dir)
    paths = [_find(data_dir, f) for f in MNIST_FILES]
    if None in paths:
        missing = [f for f, p in zip(MNIST_FILES, paths) if p is None]
        raise FileNotFoundError(
            f"MNIST files missing from {os.path.abspath(data_dir)!r}: {', '.join(missing)}; "
            f"expected {', '.join(MNIST_FILES)} (each raw or with .gz)")
    X_train, y_train = _read_pair(paths[0], paths[1])
    X_val, y_val = _read_pair(paths[2], paths[3])
    if X_train.shape[1:] != X_val.shape[1:]:
        raise ValueError(f"train images are {X_train.shape[1:]} but test images are {X_val.shape[1:]}")
    # At least MNIST's ten digits; more when the files hold higher labels (other IDX sets).
    num_classes = max(10, int(max(y_train.max(initial=0), y_val.max(initial=0))) + 1)
    return Dataset(name, _unit_images(X_train, dtype), y_train.astype(np.int64),
                   _unit_images(X_val, dtype), y_val.astype(np.int64),
                   num_classes=num_classes, input_shape=(1,) + X_train.shape[1:],
                   meta={"data_dir": os.path.abspath(data_dir)})
