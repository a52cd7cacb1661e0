"""Synthetic data sets: determinism, shapes and dtypes, balance, learnability, errors."""

import numpy as np
import pytest

from npddp.data import synthetic_classification, synthetic_regression

IMAGE = (1, 8, 8)


def arrays(ds):
    """The four arrays of a data set."""
    return ds.X_train, ds.y_train, ds.X_val, ds.y_val


def least_squares_accuracy(ds):
    """Validation accuracy of a linear least-squares fit to one-hot labels (with a bias)."""
    def design(X):
        X = X.reshape(len(X), -1).astype(np.float64)
        return np.hstack([X, np.ones((len(X), 1))])
    W = np.linalg.lstsq(design(ds.X_train), np.eye(ds.num_classes)[ds.y_train], rcond=None)[0]
    return float(np.mean(np.argmax(design(ds.X_val) @ W, axis=1) == ds.y_val))


@pytest.mark.parametrize("image_shape", [None, IMAGE])
def test_deterministic_from_seed(image_shape):
    kw = dict(n_train=300, n_val=50, num_classes=5, image_shape=image_shape)
    a, b = synthetic_classification(seed=3, **kw), synthetic_classification(seed=3, **kw)
    c = synthetic_classification(seed=4, **kw)
    for x, y in zip(arrays(a), arrays(b)):
        assert np.array_equal(x, y)
    assert not np.array_equal(a.X_train, c.X_train)
    assert not np.array_equal(a.y_train, c.y_train)


@pytest.mark.parametrize("image_shape", [None, IMAGE])
def test_rows_do_not_depend_on_the_count_asked_for(image_shape):
    small = synthetic_classification(n_train=40, n_val=10, seed=1, image_shape=image_shape)
    big = synthetic_classification(n_train=5000, n_val=30, seed=1, image_shape=image_shape)
    assert np.array_equal(small.X_train, big.X_train[:40])
    assert np.array_equal(small.y_train, big.y_train[:40])
    assert np.array_equal(small.X_val, big.X_val[:10])
    assert np.array_equal(small.y_val, big.y_val[:10])
    # train and val are different draws
    assert not np.array_equal(big.X_train[:30], big.X_val)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape_kw", [dict(in_features=13), dict(image_shape=(2, 5, 7))])
def test_shapes_and_dtypes(dtype, shape_kw):
    ds = synthetic_classification(n_train=77, n_val=11, num_classes=4, seed=0, dtype=dtype, **shape_kw)
    input_shape = (13,) if "in_features" in shape_kw else (2, 5, 7)
    assert ds.input_shape == input_shape
    assert ds.X_train.shape == (77,) + input_shape and ds.X_val.shape == (11,) + input_shape
    assert ds.X_train.dtype == dtype and ds.X_val.dtype == dtype
    assert ds.y_train.dtype == np.int64 and ds.y_train.shape == (77,) and ds.y_val.shape == (11,)
    assert ds.y_train.min() >= 0 and ds.y_train.max() < 4
    assert ds.num_classes == 4 and ds.task == "classification"
    assert ds.in_features == int(np.prod(input_shape))
    ref = synthetic_classification(n_train=77, n_val=11, num_classes=4, seed=0, dtype=np.float64, **shape_kw)
    assert np.array_equal(ds.X_train, ref.X_train.astype(dtype))  # dtype only casts
    assert np.array_equal(ds.y_train, ref.y_train)


def test_default_shapes():
    ds = synthetic_classification(n_train=10, n_val=2)
    assert ds.input_shape == (64,) and ds.num_classes == 10 and ds.X_train.dtype == np.float32
    assert ds.name == "synthetic"
    img = synthetic_classification(n_train=10, n_val=2, image_shape=(3, 6, 6))
    assert img.name == "synthetic-image" and img.X_train.shape == (10, 3, 6, 6)


def test_empty_sets():
    ds = synthetic_classification(n_train=0, n_val=0, image_shape=IMAGE)
    assert ds.X_train.shape == (0,) + IMAGE and ds.y_val.shape == (0,)


@pytest.mark.parametrize("num_classes", [2, 3, 10])
@pytest.mark.parametrize("image_shape", [None, (1, 16, 16), (3, 6, 6)])
def test_classes_balanced(num_classes, image_shape):
    ds = synthetic_classification(n_train=4000, n_val=10, num_classes=num_classes, seed=2,
                                  image_shape=image_shape)
    share = np.bincount(ds.y_train, minlength=num_classes) / ds.n_train * num_classes
    assert share.min() > 0.6 and share.max() < 1.4, share


@pytest.mark.parametrize("image_shape, min_acc", [(None, 0.8), ((1, 16, 16), 0.65)])
def test_learnable_by_a_linear_fit(image_shape, min_acc):
    """Default problem: a linear least-squares classifier is already far above chance (10%)."""
    ds = synthetic_classification(n_train=4096, n_val=1000, seed=0, image_shape=image_shape)
    assert least_squares_accuracy(ds) > min_acc


def test_boundary_drop_makes_it_easier():
    kw = dict(n_train=3000, n_val=1000, seed=5, in_features=32)
    hard = least_squares_accuracy(synthetic_classification(boundary_drop=0.0, **kw))
    easy = least_squares_accuracy(synthetic_classification(boundary_drop=0.6, **kw))
    assert easy > hard + 0.05, (hard, easy)


def test_images_are_smooth_with_unit_variance():
    ds = synthetic_classification(n_train=2000, n_val=10, image_shape=(2, 12, 12), seed=0,
                                  dtype=np.float64)
    X = ds.X_train
    assert abs(X.std() - 1.0) < 0.1 and abs(X.mean()) < 0.05
    corr_w = np.mean(X[..., :-1] * X[..., 1:]) / X.var()
    corr_h = np.mean(X[:, :, :-1] * X[:, :, 1:]) / X.var()
    assert corr_w > 0.6 and corr_h > 0.6, (corr_w, corr_h)
    flat = synthetic_classification(n_train=2000, n_val=10, in_features=16, seed=0).X_train
    assert abs(np.mean(flat[:, :-1] * flat[:, 1:])) < 0.1  # flat inputs are white


@pytest.mark.parametrize("kwargs, exc, pattern", [
    (dict(num_classes=1), ValueError, r"num_classes must be >= 2, got 1"),
    (dict(n_train=-5), ValueError, r"n_train must be >= 0, got -5"),
    (dict(n_val=2.5), TypeError, r"n_val must be an int"),
    (dict(in_features=0), ValueError, r"in_features must be >= 1, got 0"),
    (dict(seed=-1), ValueError, r"seed must be >= 0, got -1"),
    (dict(dtype=np.int32), TypeError, r"float type.*got int32"),
    (dict(dtype="nonsense"), TypeError, r"not a NumPy dtype"),
    (dict(image_shape=(8, 8)), ValueError, r"image_shape must be \(C, H, W\), got \(8, 8\)"),
    (dict(image_shape=(1, 0, 8)), ValueError, r"image_shape entry must be >= 1, got 0"),
    (dict(image_shape=(1, 4, 4), in_features=15), ValueError, r"in_features=15 disagrees"),
    (dict(boundary_drop=0.95), ValueError, r"boundary_drop must be a fraction in \[0, 0.9\], got 0.95"),
    (dict(hidden=0), ValueError, r"hidden must be >= 1, got 0"),
    (dict(boundary_drop="0.5"), TypeError, r"boundary_drop must be a real number.*'0.5'"),
    (dict(boundary_drop=True), TypeError, r"boundary_drop must be a real number"),
    (dict(image_shape=(1, 4, 4), in_features=16.0), TypeError, r"in_features must be an int"),
])
def test_classification_errors(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        synthetic_classification(n_train=kwargs.pop("n_train", 10), n_val=kwargs.pop("n_val", 5), **kwargs)


# --- regression -----------------------------------------------------------------------------

@pytest.mark.parametrize("out_features", [1, 3])
@pytest.mark.parametrize("noise", [0.0, 0.3])
def test_regression_targets(out_features, noise):
    ds = synthetic_regression(n_train=2000, n_val=300, in_features=8, out_features=out_features,
                              seed=4, noise=noise, dtype=np.float64)
    w = ds.meta["w_true"]
    assert w.shape == (8, out_features)
    assert ds.y_train.shape == (2000, out_features) and ds.y_val.shape == (300, out_features)
    assert ds.task == "regression" and ds.num_classes == 0 and ds.input_shape == (8,)
    resid = ds.y_train - ds.X_train @ w
    if noise == 0.0:
        assert np.abs(resid).max() < 1e-12
    else:
        assert abs(resid.std() - noise) < 0.03
    w_fit = np.linalg.lstsq(ds.X_train, ds.y_train, rcond=None)[0]
    assert np.abs(w_fit - w).max() < 5 * noise / np.sqrt(2000) + 1e-9  # 5 standard errors


def test_regression_determinism_dtype_and_prefix():
    a = synthetic_regression(n_train=100, n_val=20, seed=9)
    b = synthetic_regression(n_train=100, n_val=20, seed=9)
    c = synthetic_regression(n_train=500, n_val=20, seed=9)
    assert a.X_train.dtype == np.float32 and a.y_train.dtype == np.float32
    for x, y in zip(arrays(a), arrays(b)):
        assert np.array_equal(x, y)
    assert np.array_equal(a.X_train, c.X_train[:100]) and np.array_equal(a.y_train, c.y_train[:100])
    assert np.array_equal(a.X_val, c.X_val)
    d = synthetic_regression(n_train=100, n_val=20, seed=10)
    assert not np.array_equal(a.meta["w_true"], d.meta["w_true"])


@pytest.mark.parametrize("kwargs, exc, pattern", [
    (dict(noise=-0.1), ValueError, r"noise must be a float >= 0, got -0.1"),
    (dict(noise=None), TypeError, r"noise must be a real number, got NoneType"),
    (dict(out_features=0), ValueError, r"out_features must be >= 1, got 0"),
    (dict(in_features=-2), ValueError, r"in_features must be >= 1, got -2"),
    (dict(dtype=np.int64), TypeError, r"float type"),
])
def test_regression_errors(kwargs, exc, pattern):
    with pytest.raises(exc, match=pattern):
        synthetic_regression(n_train=10, n_val=5, **kwargs)
