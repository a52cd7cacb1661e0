"""Input scaling on load: statistics from the training rows only, both modes, and when inputs look unscaled."""

import numpy as np
import pytest

from npddp.data import NORMALIZE_MODES, Dataset, normalize, unscaled_reason


def _ds(X_train, X_val, source=None):
    meta = {"source_dtype": source} if source else {}
    return Dataset("t", X_train, np.zeros(len(X_train), np.int64), X_val, np.zeros(len(X_val), np.int64),
                   num_classes=1, input_shape=X_train.shape[1:], meta=meta)


def test_standard_uses_the_training_mean_and_std_per_feature():
    rng = np.random.default_rng(0)
    X = (rng.standard_normal((500, 2, 3)) * [[[1, 10, 100]]] + 50).astype(np.float32)
    V = X[:7] + 1
    out = normalize(_ds(X, V), "standard")
    assert np.allclose(out.X_train.mean(axis=0), 0, atol=1e-4) and np.allclose(out.X_train.std(axis=0), 1, atol=1e-4)
    expected = (V - X.mean(axis=0, dtype=np.float64)) / X.std(axis=0, dtype=np.float64)
    assert np.allclose(out.X_val, expected, atol=1e-4) and out.X_val.dtype == np.float32
    assert out.meta["normalize"] == "standard"


def test_unit_maps_the_training_range_to_0_1_and_constant_features_stay_finite():
    X = np.array([[0.0, 5.0], [255.0, 5.0]])
    out = normalize(_ds(X, np.array([[127.5, 5.0]])), "unit")
    assert np.allclose(out.X_train, [[0, 5 / 255], [1, 5 / 255]]) and np.allclose(out.X_val, [[0.5, 5 / 255]])
    const = normalize(_ds(np.ones((4, 2)), np.ones((1, 2))), "standard")
    assert np.all(const.X_train == 0) and np.all(np.isfinite(const.X_val))


def test_none_returns_the_same_data_and_unknown_modes_name_the_valid_ones():
    ds = _ds(np.ones((3, 2)), np.ones((1, 2)))
    assert normalize(ds, "none") is ds and NORMALIZE_MODES == ("none", "standard", "unit")
    with pytest.raises(ValueError, match="none, standard, unit"):
        normalize(ds, "zscore")


@pytest.mark.parametrize("X, source, expected", [
    (np.ones((3, 2)), "uint8", "stored as uint8"), (np.ones((3, 2)), "bool", "stored as bool"),
    (np.full((3, 2), 11.0), None, "range over [11, 11]"), (np.full((3, 2), -200.0), "float64", "range over [-200"),
    (np.full((3, 2), 9.5), "float32", None)])
def test_unscaled_reason(X, source, expected):
    reason = unscaled_reason(_ds(X, X[:1], source))
    assert (reason is None) if expected is None else (expected in reason)
