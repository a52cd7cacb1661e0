"""Conv2d: values against a direct loop, gradient checks over stride/padding/kernel/shape."""

import itertools

import numpy as np
import pytest

from npddp.nn import Conv2d
from npddp.nn.gradcheck import check_module

TOL = 1e-6


def reference_conv(x, w, b, stride, padding):
    """Direct definition, one output pixel at a time."""
    (sh, sw), (ph, pw) = stride, padding
    bsz, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.zeros((bsz, x.shape[1], h + 2 * ph, wd + 2 * pw))
    xp[:, :, ph:ph + h, pw:pw + wd] = x
    ho, wo = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    y = np.zeros((bsz, o, ho, wo))
    for i in range(ho):
        for j in range(wo):
            patch = xp[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw]   # (B, C, kh, kw)
            y[:, :, i, j] = np.tensordot(patch, w, axes=([1, 2, 3], [1, 2, 3]))
    return y + (0 if b is None else b[None, :, None, None])


CONFIGS = [  # (kernel, stride, padding, H, W)
    (k, s, p, h, w)
    for k, s, p in itertools.product((1, 3, 5), (1, 2), (0, 1, 2))
    for h, w in ((7, 9),)
    if h + 2 * p >= k
] + [((3, 2), (2, 1), (1, 0), 6, 5), (2, 3, 0, 8, 4), (3, 1, 1, 1, 1)]


@pytest.mark.parametrize("kernel,stride,padding,h,w", CONFIGS)
def test_conv_forward_matches_direct_loop(kernel, stride, padding, h, w):
    rng = np.random.default_rng(CONFIGS.index((kernel, stride, padding, h, w)))
    conv = Conv2d(2, 3, kernel, stride, padding, dtype=np.float64, rng=rng)
    conv.bias.data[:] = rng.standard_normal(3)
    x = rng.standard_normal((2, 2, h, w))
    y = conv.forward(x)
    ref = reference_conv(x, conv.weight.data, conv.bias.data, conv.stride, conv.padding)
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel,stride,padding,h,w", CONFIGS)
def test_conv_gradients(kernel, stride, padding, h, w):
    rng = np.random.default_rng(1000 + CONFIGS.index((kernel, stride, padding, h, w)))
    conv = Conv2d(2, 3, kernel, stride, padding, dtype=np.float64, rng=rng)
    conv.bias.data[:] = rng.standard_normal(3)
    errors = check_module(conv, rng.standard_normal((2, 2, h, w)), rng)
    assert set(errors) == {"input", "weight", "bias"}
    worst = max(errors.values())
    assert worst < TOL, f"Conv2d k={kernel} s={stride} p={padding} {h}x{w}: max rel error {worst:.3g} {errors}"


@pytest.mark.parametrize("trial", range(3))
def test_conv_gradients_random_shapes_no_bias(trial):
    rng = np.random.default_rng(500 + trial)
    c, o = (int(v) for v in rng.integers(1, 4, 2))
    k, s, p = int(rng.integers(1, 4)), int(rng.integers(1, 3)), int(rng.integers(0, 2))
    h, w = (int(v) for v in rng.integers(k, k + 5, 2))
    conv = Conv2d(c, o, k, s, p, bias=False, dtype=np.float64, rng=rng)
    errors = check_module(conv, rng.standard_normal((int(rng.integers(1, 4)), c, h, w)), rng)
    assert set(errors) == {"input", "weight"}
    assert max(errors.values()) < TOL, f"Conv2d({c}->{o}, k={k}, s={s}, p={p}) on {h}x{w}: {errors}"


def test_conv_buffers_follow_the_input_shape():
    """A second batch size reallocates the work buffers; results stay exact."""
    rng = np.random.default_rng(4)
    conv = Conv2d(2, 2, 3, padding=1, dtype=np.float64, rng=rng)
    for bsz, h in ((3, 5), (1, 6), (3, 5)):
        x = rng.standard_normal((bsz, 2, h, h))
        ref = reference_conv(x, conv.weight.data, conv.bias.data, (1, 1), (1, 1))
        np.testing.assert_allclose(conv.forward(x), ref, rtol=1e-12, atol=1e-12)


def test_conv_input_grad_off_gives_same_param_grads():
    rng = np.random.default_rng(8)
    a = Conv2d(2, 3, 3, 1, 1, dtype=np.float64, rng=np.random.default_rng(1))
    b = Conv2d(2, 3, 3, 1, 1, dtype=np.float64, rng=np.random.default_rng(1), input_grad=False)
    x, d = rng.standard_normal((2, 2, 5, 5)), rng.standard_normal((2, 3, 5, 5))
    a.forward(x)
    b.forward(x)
    assert a.backward(d).shape == x.shape
    assert b.backward(d) is None
    np.testing.assert_array_equal(a.weight.grad, b.weight.grad)
    np.testing.assert_array_equal(a.bias.grad, b.bias.grad)
    b.input_grad = True                                     # switched on later: works from then on
    b.forward(x)
    np.testing.assert_array_equal(b.backward(d), a.backward(d))


def test_conv_float32_stays_float32():
    rng = np.random.default_rng(2)
    conv = Conv2d(3, 4, 3, 2, 1, rng=rng)
    y = conv.forward(rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
    dx = conv.backward(np.ones_like(y))
    assert y.dtype == dx.dtype == conv.weight.grad.dtype == conv.bias.grad.dtype == np.float32


def test_conv_he_init_scale():
    conv = Conv2d(16, 64, 3, dtype=np.float64, rng=np.random.default_rng(0))
    std = conv.weight.data.std()
    assert abs(std - np.sqrt(2 / (16 * 9))) < 0.05 * np.sqrt(2 / (16 * 9))
    assert np.all(conv.bias.data == 0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(in_channels=0, out_channels=2, kernel_size=3), "in_channels"),
    (dict(in_channels=1, out_channels=2, kernel_size=0), "kernel_size"),
    (dict(in_channels=1, out_channels=2, kernel_size=3, stride=0), "stride"),
    (dict(in_channels=1, out_channels=2, kernel_size=3, padding=-1), "padding"),
    (dict(in_channels=1, out_channels=2, kernel_size=(3, 3, 3)), "kernel_size"),
])
def test_conv_constructor_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Conv2d(**kwargs)
