"""IDX parsing and load_mnist, on tiny files the tests write (raw and gzipped)."""

import itertools
import os

import numpy as np
import pytest

from npddp.data import MNIST_FILES, load_mnist, read_idx
from npddp.data.mnist import parse_idx


@pytest.mark.parametrize("dtype", ["uint8", "int8", ">i2", ">i4", ">f4", ">f8"])
def test_idx_round_trip(tmp_path, idx_tools, dtype):
    idx_bytes, write_idx, _ = idx_tools
    rng = np.random.default_rng(0)
    for shape in [(0,), (5,), (3, 4), (2, 3, 5), (1, 2, 1, 3)]:
        arr = (rng.standard_normal(shape) * 100).astype(dtype)
        for gz in (False, True):
            path = write_idx(str(tmp_path / f"a{len(shape)}"), arr, gz=gz)
            got = read_idx(path)
            assert got.shape == shape and got.dtype == np.dtype(dtype)
            assert np.array_equal(got, arr)
        assert np.array_equal(parse_idx(idx_bytes(arr)), arr)


@pytest.mark.parametrize("raw, pattern", [
    (b"", r"bad IDX magic number \(empty\)"),
    (b"\x01\x00\x08\x01" + b"\x00\x00\x00\x01" + b"\x07", r"bad IDX magic number 01000801"),
    (b"\x00\x00\x07\x01" + b"\x00\x00\x00\x01" + b"\x07", r"bad IDX magic number 00000701"),
    (b"\x00\x00\x08\x03" + b"\x00\x00\x00\x01", r"ends inside its header"),
    (b"\x00\x00\x08\x01" + b"\x00\x00\x00\x03" + b"\x07\x07", r"declares shape \(3,\).*holds 10 bytes"),
    (b"\x00\x00\x08\x01" + b"\x00\x00\x00\x01" + b"\x07\x07", r"declares shape \(1,\)"),
    (b"\x00\x00\x0b\x01" + b"\x00\x00\x00\x02" + b"\x00\x01\x00", r"declares shape \(2,\) \(12 bytes"),
])
def test_bad_idx(raw, pattern):
    with pytest.raises(ValueError, match=pattern):
        parse_idx(raw)


def test_load_mnist_every_raw_gz_mix(tmp_path, idx_tools):
    _, _, write_mnist = idx_tools
    for i, gz in enumerate(itertools.product((False, True), repeat=4)):
        d = tmp_path / f"mix{i}"
        d.mkdir()
        arrays = write_mnist(d, n_train=5, n_test=3, gz=gz, seed=i)
        ds = load_mnist(d)
        assert ds.X_train.shape == (5, 1, 28, 28) and ds.X_val.shape == (3, 1, 28, 28)
        assert ds.X_train.dtype == np.float32 and ds.y_train.dtype == np.int64
        assert np.array_equal(ds.X_train[:, 0], arrays[0] / np.float32(255))
        assert np.array_equal(ds.X_val[:, 0], arrays[2] / np.float32(255))
        assert np.array_equal(ds.y_train, arrays[1]) and np.array_equal(ds.y_val, arrays[3])
        assert 0.0 <= ds.X_train.min() and ds.X_train.max() <= 1.0
        assert ds.input_shape == (1, 28, 28) and ds.num_classes == 10 and ds.name == "mnist"


def test_load_mnist_dtype_and_other_sizes(tmp_path, idx_tools):
    _, _, write_mnist = idx_tools
    arrays = write_mnist(tmp_path, n_train=4, n_test=2, hw=(5, 7))
    ds = load_mnist(str(tmp_path), dtype=np.float64)
    assert ds.X_train.dtype == np.float64 and ds.input_shape == (1, 5, 7)
    assert np.array_equal(ds.X_train[:, 0], arrays[0] / 255.0)
    ends = np.zeros((4, 5, 7), np.uint8)
    ends[:, 0] = 255
    write_idx = idx_tools[1]
    write_idx(str(tmp_path / "train-images-idx3-ubyte"), ends)
    X = load_mnist(tmp_path).X_train
    assert X.dtype == np.float32 and X.max() == 1.0 and X.min() == 0.0
    assert np.array_equal(X[:, 0, 0], np.ones((4, 7), np.float32))
    with pytest.raises(TypeError, match="float type"):
        load_mnist(tmp_path, dtype=np.uint8)


def test_missing_file_lists_names_and_directory(tmp_path, idx_tools):
    _, _, write_mnist = idx_tools
    write_mnist(tmp_path)
    os.remove(tmp_path / "t10k-labels-idx1-ubyte")
    with pytest.raises(FileNotFoundError) as info:
        load_mnist(tmp_path)
    msg = str(info.value)
    assert str(tmp_path) in msg and "missing" in msg
    assert msg.split(";")[0].endswith("t10k-labels-idx1-ubyte")  # only the missing one as missing
    for name in MNIST_FILES:
        assert name in msg
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte, train-labels-idx1-ubyte"):
        load_mnist(empty)


def test_inconsistent_files(tmp_path, idx_tools):
    _, write_idx, write_mnist = idx_tools
    arrays = write_mnist(tmp_path, n_train=5, n_test=3)
    # fewer labels than images
    write_idx(str(tmp_path / "train-labels-idx1-ubyte"), arrays[1][:4])
    with pytest.raises(ValueError, match=r"holds 5 images but .* holds 4 labels"):
        load_mnist(tmp_path)
    # an images file where a labels file belongs
    write_idx(str(tmp_path / "train-labels-idx1-ubyte"), arrays[0])
    with pytest.raises(ValueError, match=r"expected unsigned-byte labels of 1 dimension"):
        load_mnist(tmp_path)
    write_idx(str(tmp_path / "train-labels-idx1-ubyte"), arrays[1])
    # images of the wrong element type
    write_idx(str(tmp_path / "t10k-images-idx3-ubyte"), arrays[2].astype(">f4"))
    with pytest.raises(ValueError, match=r"expected unsigned-byte images.*float32"):
        load_mnist(tmp_path)
    # test images of another size
    write_idx(str(tmp_path / "t10k-images-idx3-ubyte"), np.zeros((3, 27, 28), np.uint8))
    with pytest.raises(ValueError, match=r"train images are \(28, 28\) but test images are \(27, 28\)"):
        load_mnist(tmp_path)
    # bad magic inside load_mnist names the file
    with open(tmp_path / "t10k-images-idx3-ubyte", "wb") as f:
        f.write(b"\x12\x34\x56\x78")
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte: bad IDX magic number 12345678"):
        load_mnist(tmp_path)


def test_raw_file_preferred_over_gz(tmp_path, idx_tools):
    _, write_idx, write_mnist = idx_tools
    arrays = write_mnist(tmp_path, n_train=3, n_test=2)
    write_idx(str(tmp_path / "train-labels-idx1-ubyte"), (arrays[1] + 1) % 10, gz=True)
    assert np.array_equal(load_mnist(tmp_path).y_train, arrays[1])
