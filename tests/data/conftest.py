"""Fixtures for the data tests: tiny IDX files written on the spot (helpers reach tests as fixtures)."""

import gzip
import os

import numpy as np
import pytest

#: NumPy element type -> IDX type code.
IDX_CODES = {np.dtype("uint8"): 0x08, np.dtype("int8"): 0x09, np.dtype(">i2"): 0x0B,
             np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D, np.dtype(">f8"): 0x0E}


def idx_bytes(arr: np.ndarray) -> bytes:
    """The IDX encoding of ``arr``: magic, big-endian uint32 sizes, big-endian values."""
    big = arr.astype(arr.dtype.newbyteorder(">")) if arr.dtype.itemsize > 1 else arr
    code = IDX_CODES[np.dtype(big.dtype)]
    header = bytes([0, 0, code, arr.ndim]) + np.asarray(arr.shape, dtype=">u4").tobytes()
    return header + np.ascontiguousarray(big).tobytes()


def write_idx(path: str, arr: np.ndarray, gz: bool = False) -> str:
    """Write ``arr`` as an IDX file at ``path`` (``path + '.gz'`` gzipped when ``gz``)."""
    if gz:
        path += ".gz"
        with gzip.open(path, "wb") as f:
            f.write(idx_bytes(arr))
    else:
        with open(path, "wb") as f:
            f.write(idx_bytes(arr))
    return path


def write_mnist(directory, n_train=6, n_test=4, hw=(28, 28), gz=(False, False, False, False), seed=0):
    """Random MNIST-format files in ``directory``; returns the arrays written."""
    rng = np.random.default_rng(seed)
    arrays = (rng.integers(0, 256, size=(n_train,) + hw, dtype=np.uint8),
              rng.integers(0, 10, size=n_train, dtype=np.uint8),
              rng.integers(0, 256, size=(n_test,) + hw, dtype=np.uint8),
              rng.integers(0, 10, size=n_test, dtype=np.uint8))
    names = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
    for name, arr, z in zip(names, arrays, gz):
        write_idx(os.path.join(directory, name), arr, gz=z)
    return arrays


@pytest.fixture
def mnist_dir(tmp_path):
    """A directory holding tiny raw MNIST files, and the arrays in them."""
    return tmp_path, write_mnist(tmp_path)


@pytest.fixture
def idx_tools():
    """The IDX helpers, for tests that write their own files: (idx_bytes, write_idx, write_mnist)."""
    return idx_bytes, write_idx, write_mnist
