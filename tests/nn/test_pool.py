"""MaxPool2d: values against a direct loop, gradient checks on tie-free inputs, tie routing."""

import numpy as np
import pytest

from npddp.nn import MaxPool2d
from npddp.nn.gradcheck import check_module

CONFIGS = [  # (kernel, stride, H, W)
    (2, None, 6, 8),        # tiles exactly
    (2, None, 7, 5),        # odd sizes: last row/column dropped
    (3, 2, 7, 8),           # overlapping windows
    (2, 1, 4, 5),
    ((2, 3), (1, 2), 5, 7),
    (1, None, 3, 4),
    (3, 3, 3, 3),
]


def tie_free(rng, shape):
    """Distinct values at least 0.01 apart, so an eps-perturbation never moves a maximum."""
    return (rng.permutation(int(np.prod(shape))) * 0.01).reshape(shape) + 0.5 * rng.random() * 0.01


def reference_pool(x, k, s):
    (kh, kw), (sh, sw) = k, s
    ho, wo = (x.shape[2] - kh) // sh + 1, (x.shape[3] - kw) // sw + 1
    y = np.empty(x.shape[:2] + (ho, wo))
    for i in range(ho):
        for j in range(wo):
            y[:, :, i, j] = x[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw].max(axis=(2, 3))
    return y


@pytest.mark.parametrize("kernel,stride,h,w", CONFIGS)
def test_pool_forward_matches_direct_loop(kernel, stride, h, w):
    rng = np.random.default_rng(CONFIGS.index((kernel, stride, h, w)))
    pool = MaxPool2d(kernel, stride)
    x = rng.standard_normal((2, 3, h, w))
    np.testing.assert_array_equal(pool.forward(x), reference_pool(x, pool.kernel_size, pool.stride))


@pytest.mark.parametrize("kernel,stride,h,w", CONFIGS)
def test_pool_gradients(kernel, stride, h, w):
    rng = np.random.default_rng(100 + CONFIGS.index((kernel, stride, h, w)))
    errors = check_module(MaxPool2d(kernel, stride), tie_free(rng, (2, 2, h, w)), rng)
    assert errors["input"] < 1e-6, f"MaxPool2d({kernel}, {stride}) on {h}x{w}: {errors}"


@pytest.mark.parametrize("kernel,stride,h,w", CONFIGS)
def test_pool_ties_route_to_first_maximum_only(kernel, stride, h, w):
    """Constant input: every window is a tie; each output sends its gradient to one input,
    the top-left of its window, so the gradients sum to sum(dout) and land where expected."""
    pool = MaxPool2d(kernel, stride)
    x = np.zeros((1, 2, h, w))
    y = pool.forward(x)
    dout = np.random.default_rng(0).standard_normal(y.shape)
    dx = pool.backward(dout)
    sh, sw = pool.stride
    expected = np.zeros_like(x)
    for i in range(y.shape[2]):
        for j in range(y.shape[3]):
            expected[:, :, i * sh, j * sw] += dout[:, :, i, j]
    np.testing.assert_allclose(dx, expected, rtol=1e-12, atol=1e-12)


def test_pool_after_relu_zero_windows():
    """A ReLU-style window of zeros plus a later positive value: the gradient goes only there."""
    x = np.array([[[[0.0, 0.0], [0.0, 2.0]], [[0.0, 0.0], [0.0, 0.0]]]])  # (1, 2, 2, 2)
    pool = MaxPool2d(2)
    pool.forward(x)
    dx = pool.backward(np.array([[[[3.0]], [[5.0]]]]))
    np.testing.assert_array_equal(dx[0, 0], [[0, 0], [0, 3]])
    np.testing.assert_array_equal(dx[0, 1], [[5, 0], [0, 0]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pool_keeps_dtype(dtype):
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 4)).astype(dtype)
    pool = MaxPool2d(2)
    y = pool.forward(x)
    assert y.dtype == dtype and pool.backward(np.ones_like(y)).dtype == dtype


@pytest.mark.parametrize("args,match", [((0,), "kernel_size"), ((2, 0), "stride"), (("2",), "kernel_size")])
def test_pool_constructor_rejects_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        MaxPool2d(*args)
