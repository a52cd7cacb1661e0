"""load_dataset dispatch, the optional digits set, the Dataset record, and import hygiene."""

import subprocess
import sys
import types

import numpy as np
import pytest

from npddp.data import DATASET_NAMES, DEFAULT_IMAGE_SHAPE, Dataset, load_dataset, load_digits, synthetic_classification, synthetic_regression


def test_synthetic_names_dispatch():
    ds = load_dataset("synthetic", seed=2, n_train=30, n_val=7, num_classes=3)
    ref = synthetic_classification(n_train=30, n_val=7, num_classes=3, seed=2)
    assert ds.name == "synthetic" and np.array_equal(ds.X_train, ref.X_train)
    img = load_dataset("synthetic-image", n_train=12, n_val=3, dtype=np.float64)
    assert img.input_shape == DEFAULT_IMAGE_SHAPE and img.X_train.dtype == np.float64
    other = load_dataset("synthetic-image", n_train=12, n_val=3, image_shape=(3, 4, 4))
    assert other.input_shape == (3, 4, 4)
    reg = load_dataset("regression", seed=5, n_train=20, n_val=4, noise=0.0)
    assert reg.task == "regression"
    assert np.array_equal(reg.y_val, synthetic_regression(n_train=20, n_val=4, seed=5, noise=0.0).y_val)


def test_mnist_dispatch(mnist_dir):
    directory, arrays = mnist_dir
    ds = load_dataset("mnist", data_dir=directory)
    assert ds.X_train.shape == (len(arrays[0]), 1, 28, 28)
    assert np.array_equal(ds.y_val, arrays[3])
    with pytest.raises(ValueError, match=r"'mnist' data set needs data_dir"):
        load_dataset("mnist")
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        load_dataset("mnist", data_dir=directory / "nowhere")


@pytest.mark.parametrize("suffix", [".npz", ".h5", ".HDF5"])
def test_array_file_dispatch(tmp_path, suffix):
    X = np.arange(40.0).reshape(20, 2)
    y = np.arange(20) % 3
    if suffix == ".npz":
        np.savez(tmp_path / f"d{suffix}", inputs=X, labels=y)
    else:
        import h5py
        with h5py.File(tmp_path / f"d{suffix}", "w") as f:
            f["inputs"], f["labels"] = X, y
    for name, data_dir in ((str(tmp_path / f"d{suffix}"), None), (f"d{suffix}", str(tmp_path))):
        ds = load_dataset(name, data_dir=data_dir, seed=1, x_key="inputs", y_key="labels",
                          val_fraction=0.25)
        assert (ds.n_train, ds.n_val, ds.num_classes) == (15, 5, 3)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as info:
        load_dataset("cifar10")
    msg = str(info.value)
    assert "'cifar10'" in msg and ".npz" in msg
    for name in DATASET_NAMES:
        assert name in msg
    with pytest.raises(TypeError, match="dataset name must be a str"):
        load_dataset(3)
    with pytest.raises(TypeError, match="unexpected keyword"):
        load_dataset("synthetic", no_such_option=1)


# --- digits: an optional extra --------------------------------------------------------------

def test_digits_without_scikit_learn(monkeypatch):
    """When scikit-learn cannot be imported, the error says how to install it."""
    monkeypatch.setitem(sys.modules, "sklearn", None)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    for call in (load_digits, lambda: load_dataset("digits")):
        with pytest.raises(ImportError, match=r"pip install scikit-learn"):
            call()


def fake_sklearn(monkeypatch, n=50):
    """Install a stand-in ``sklearn.datasets.load_digits`` returning n known 8x8 images."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, 17, size=(n, 64)).astype(np.float64)
    target = np.arange(n) % 10
    datasets = types.ModuleType("sklearn.datasets")
    datasets.load_digits = lambda: types.SimpleNamespace(data=data, target=target)
    package = types.ModuleType("sklearn")
    package.datasets = datasets
    monkeypatch.setitem(sys.modules, "sklearn", package)
    monkeypatch.setitem(sys.modules, "sklearn.datasets", datasets)
    return data, target


@pytest.mark.parametrize("as_images", [False, True])
def test_digits_with_scikit_learn_stand_in(monkeypatch, as_images):
    data, target = fake_sklearn(monkeypatch)
    ds = load_digits(seed=3, val_fraction=0.2, as_images=as_images)
    shape = (1, 8, 8) if as_images else (64,)
    assert ds.input_shape == shape and ds.X_train.shape == (40,) + shape and ds.n_val == 10
    assert ds.num_classes == 10 and ds.y_train.dtype == np.int64 and ds.X_train.dtype == np.float32
    # rows keep their label and are scaled from 0..16 to 0..1
    X_all = np.concatenate([ds.X_train, ds.X_val]).reshape(50, 64)
    y_all = np.concatenate([ds.y_train, ds.y_val])
    expected = {tuple((data[i] / 16).astype(np.float32)): target[i] for i in range(50)}
    assert {tuple(x): int(t) for x, t in zip(X_all, y_all)} == expected
    same = load_dataset("digits", seed=3, val_fraction=0.2, as_images=as_images)
    assert np.array_equal(same.X_val, ds.X_val)


@pytest.mark.slow
def test_real_digits_if_installed():
    """Extra check against the real bundled set (the tests above cover both paths without it)."""
    pytest.importorskip("sklearn")
    ds = load_digits()
    assert ds.n_train + ds.n_val == 1797 and ds.num_classes == 10
    assert 0.0 <= ds.X_train.min() and ds.X_train.max() <= 1.0


# --- the Dataset record ---------------------------------------------------------------------

def test_dataset_record_checks_and_repr():
    X, y = np.zeros((4, 3), np.float32), np.zeros(4, np.int64)
    ds = Dataset("t", X, y, X[:2], y[:2], num_classes=2, input_shape=(3,))
    assert (ds.n_train, ds.n_val, ds.in_features) == (4, 2, 3)
    assert "train=(4, 3)" in repr(ds) and len(repr(ds)) < 200
    with pytest.raises(ValueError, match=r"X_train has 4 rows but y_train has 3"):
        Dataset("t", X, y[:3], X, y, num_classes=2, input_shape=(3,))
    with pytest.raises(ValueError, match=r"X_val rows have shape \(2,\), expected input_shape \(3,\)"):
        Dataset("t", X, y, X[:, :2], y, num_classes=2, input_shape=(3,))
    with pytest.raises(ValueError, match=r"task must be"):
        Dataset("t", X, y, X, y, num_classes=2, input_shape=(3,), task="ranking")


def test_data_package_imports_no_mpi():
    code = ("import sys, npddp.data; "
            "bad = [m for m in sys.modules if m.startswith(('mpi4py', 'npddp.comm'))]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
