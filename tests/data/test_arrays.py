"""load_array_file: .npz and HDF5 round trips, the split, and clear errors."""

import h5py
import numpy as np
import pytest

from npddp.data import load_array_file


def tagged(n, tail=(3,), labels=True, seed=0):
    """X whose first column is the row number, and y (labels or float targets)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n,) + tail)
    X.reshape(n, -1)[:, 0] = np.arange(n)
    y = rng.integers(0, 4, size=n).astype(np.int32) if labels else rng.standard_normal((n, 2))
    return X, y


def save(path, arrays):
    """Write ``arrays`` (name -> array) to .npz or HDF5, by suffix; names may hold '/'."""
    if str(path).endswith(".npz"):
        np.savez(path, **arrays)
    else:
        with h5py.File(path, "w") as f:
            for k, v in arrays.items():
                f.create_dataset(k, data=v)
    return path


def row_ids(X):
    """The row numbers tagged into X's first column."""
    return X.reshape(len(X), -1)[:, 0].round().astype(int)


@pytest.mark.parametrize("suffix", [".npz", ".h5", ".hdf5"])
@pytest.mark.parametrize("keys", [("X", "y"), ("inputs", "targets"), ("grp/feat", "grp/lab")])
def test_round_trip_custom_keys(tmp_path, suffix, keys):
    if suffix == ".npz" and "/" in keys[0]:
        keys = ("feat", "lab")
    X, y = tagged(50, tail=(2, 3))
    path = save(tmp_path / f"data{suffix}", {keys[0]: X, keys[1]: y, "other": np.zeros(3)})
    ds = load_array_file(path, x_key=keys[0], y_key=keys[1], val_fraction=0.2, seed=1)
    assert ds.X_train.shape == (40, 2, 3) and ds.X_val.shape == (10, 2, 3)
    assert ds.X_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    assert ds.input_shape == (2, 3) and ds.task == "classification"
    assert ds.num_classes == int(y.max()) + 1
    train, val = row_ids(ds.X_train), row_ids(ds.X_val)
    assert sorted(train.tolist() + val.tolist()) == list(range(50))  # each row once
    assert np.array_equal(ds.y_train, y[train]) and np.array_equal(ds.y_val, y[val])
    assert np.array_equal(ds.X_val, X[val].astype(np.float32))


def test_split_sizes_and_determinism(tmp_path):
    X, y = tagged(37)
    path = save(tmp_path / "d.npz", {"X": X, "y": y})
    for frac in (0.0, 0.05, 0.1, 0.25, 0.5, 0.9, 0.99):
        ds = load_array_file(path, val_fraction=frac, seed=3)
        n_val = min(round(37 * frac), 36)
        assert (ds.n_train, ds.n_val) == (37 - n_val, n_val), frac
        again = load_array_file(path, val_fraction=frac, seed=3)
        assert np.array_equal(ds.X_val, again.X_val) and np.array_equal(ds.y_train, again.y_train)
    a = row_ids(load_array_file(path, val_fraction=0.3, seed=0).X_val)
    b = row_ids(load_array_file(path, val_fraction=0.3, seed=1).X_val)
    assert set(a) != set(b)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_targets_make_regression(tmp_path, dtype):
    X, y = tagged(20, labels=False)
    path = save(tmp_path / "r.h5", {"X": X, "y": y})
    ds = load_array_file(path, val_fraction=0.25, dtype=dtype)
    assert ds.task == "regression" and ds.num_classes == 0
    assert ds.X_train.dtype == dtype and ds.y_train.dtype == dtype and ds.y_val.shape == (5, 2)
    assert np.array_equal(ds.y_train, y[row_ids(ds.X_train)].astype(dtype))


def test_integer_inputs_are_cast(tmp_path):
    X = np.arange(40, dtype=np.uint8).reshape(10, 4)
    path = save(tmp_path / "u.npz", {"X": X, "y": np.arange(10)})
    ds = load_array_file(path, val_fraction=0.0)
    assert ds.X_train.dtype == np.float32 and np.array_equal(ds.X_train, X.astype(np.float32))
    assert ds.num_classes == 10 and ds.n_val == 0


@pytest.mark.parametrize("suffix", [".npz", ".h5"])
def test_missing_key_lists_available(tmp_path, suffix):
    X, y = tagged(8)
    path = save(tmp_path / f"k{suffix}", {"features": X, "labels": y})
    with pytest.raises(KeyError, match=r"no array named 'X'.*available: 'features', 'labels'"):
        load_array_file(path)
    with pytest.raises(KeyError, match=r"no array named 'nope'.*available: 'features', 'labels'"):
        load_array_file(path, x_key="features", y_key="nope")


def test_h5_lists_nested_datasets(tmp_path):
    path = save(tmp_path / "n.h5", {"g/X": np.zeros((3, 2)), "g/h/y": np.zeros(3, int)})
    with pytest.raises(KeyError, match=r"available: 'g/X', 'g/h/y'"):
        load_array_file(path)
    assert load_array_file(path, x_key="g/X", y_key="g/h/y", val_fraction=0.0).n_train == 3


@pytest.mark.parametrize("arrays, kwargs, exc, pattern", [
    ({"X": np.zeros((5, 2)), "y": np.zeros(4, int)}, {}, ValueError, r"same number of rows"),
    ({"X": np.zeros((5, 2)), "y": np.array([0, 1, -1, 0, 1])}, {}, ValueError, r"negative label -1"),
    ({"X": np.zeros((5, 2)), "y": np.zeros((5, 2), int)}, {}, TypeError, r"1-D integer array"),
    ({"X": np.zeros((5, 2)), "y": np.array(["a"] * 5)}, {}, TypeError, r"integer labels or float"),
    ({"X": np.zeros((5, 2)), "y": np.zeros(5, int)}, {"val_fraction": 1.0}, ValueError,
     r"val_fraction must lie in \[0, 1\), got 1.0"),
    ({"X": np.zeros((5, 2)), "y": np.zeros(5, int)}, {"val_fraction": -0.1}, ValueError,
     r"val_fraction must lie in \[0, 1\)"),
    ({"X": np.zeros((5, 2)), "y": np.zeros(5, int)}, {"val_fraction": "0.1"}, TypeError,
     r"val_fraction must be a real number, got str '0.1'"),
    ({"X": np.zeros((5, 2)), "y": np.zeros(5, int)}, {"seed": -3}, ValueError, r"seed must be >= 0"),
    ({"X": np.zeros((5, 2)), "y": np.zeros(5, int)}, {"dtype": int}, TypeError, r"float type"),
])
def test_bad_contents(tmp_path, arrays, kwargs, exc, pattern):
    path = save(tmp_path / "bad.npz", arrays)
    with pytest.raises(exc, match=pattern):
        load_array_file(path, **kwargs)


def test_bad_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"absent.npz"):
        load_array_file(tmp_path / "absent.npz")
    with pytest.raises(ValueError, match=r"must end in .npz, .h5, .hdf5"):
        load_array_file(tmp_path / "data.csv")


def test_object_arrays_refused(tmp_path):
    path = tmp_path / "obj.npz"
    np.savez(path, X=np.array([{"a": 1}] * 3, dtype=object), y=np.zeros(3, int))
    with pytest.raises(ValueError, match="pickle"):
        load_array_file(path)
