"""Linear, ReLU, Tanh, Flatten: gradient checks, reference values, dtype preservation."""

import numpy as np
import pytest

from npddp.nn import Flatten, Linear, ReLU, Tanh
from npddp.nn.gradcheck import check_module

TOL = 1e-6


def away_from_zero(rng, shape, gap=1e-2):
    """Normal samples with |x| >= gap, so a ReLU kink is never within eps of one."""
    x = rng.standard_normal(shape)
    return x + np.copysign(gap, x)


def assert_grads_ok(errors, what):
    worst = max(errors.values())
    assert worst < TOL, f"{what}: max relative error {worst:.3g} per array: {errors}"


@pytest.mark.parametrize("trial", range(4))
def test_linear_gradients(trial):
    rng = np.random.default_rng(100 + trial)
    b, n_in, n_out = rng.integers(1, 6), rng.integers(1, 9), rng.integers(1, 9)
    layer = Linear(int(n_in), int(n_out), bias=trial != 3, dtype=np.float64, rng=rng)
    if layer.bias is not None:
        layer.bias.data[:] = rng.standard_normal(int(n_out))
    errors = check_module(layer, rng.standard_normal((b, n_in)), rng)
    assert set(errors) == {"input", "weight"} | ({"bias"} if trial != 3 else set())
    assert_grads_ok(errors, f"Linear({n_in}->{n_out}), batch {b}")


@pytest.mark.parametrize("layer_cls", [ReLU, Tanh])
@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4, 5), (1, 1)])
def test_activation_gradients(layer_cls, shape):
    rng = np.random.default_rng(7)
    errors = check_module(layer_cls(), away_from_zero(rng, shape), rng)
    assert_grads_ok(errors, f"{layer_cls.__name__} {shape}")


@pytest.mark.parametrize("shape", [(2, 3), (2, 3, 4), (3, 2, 1, 5)])
def test_flatten_gradients_and_shape(shape):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape)
    layer = Flatten()
    y = layer.forward(x)
    assert y.shape == (shape[0], int(np.prod(shape[1:])))
    assert_grads_ok(check_module(layer, x, rng), f"Flatten {shape}")


def test_linear_matches_reference_and_pytorch_layout():
    rng = np.random.default_rng(0)
    layer = Linear(4, 3, dtype=np.float64, rng=rng)
    layer.bias.data[:] = [1.0, -2.0, 0.5]
    x = rng.standard_normal((5, 4))
    assert layer.weight.shape == (3, 4)
    np.testing.assert_allclose(layer.forward(x), x @ layer.weight.data.T + layer.bias.data, rtol=1e-14)


def test_relu_and_tanh_values():
    x = np.array([[-2.0, -0.0, 0.0, 3.0]])
    np.testing.assert_array_equal(ReLU().forward(x), [[0, 0, 0, 3]])
    relu = ReLU()
    relu.forward(x)
    np.testing.assert_array_equal(relu.backward(np.ones_like(x)), [[0, 0, 0, 1]])  # gradient at 0 is 0
    np.testing.assert_allclose(Tanh().forward(x), np.tanh(x))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_dtype_is_kept_through_forward_and_backward(dtype):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 6)).astype(dtype)
    for layer in (Linear(6, 6, dtype=dtype, rng=rng), ReLU(), Tanh(), Flatten()):
        y = layer.forward(x)
        dx = layer.backward(np.ones_like(y))
        assert y.dtype == dtype and dx.dtype == dtype, repr(layer)
        for _, p in layer.named_parameters():
            assert p.data.dtype == dtype and p.grad.dtype == dtype


def test_linear_input_grad_off_returns_none_but_fills_param_grads():
    rng = np.random.default_rng(2)
    on = Linear(3, 2, dtype=np.float64, rng=np.random.default_rng(5))
    off = Linear(3, 2, dtype=np.float64, rng=np.random.default_rng(5), input_grad=False)
    x, d = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    on.forward(x)
    off.forward(x)
    assert isinstance(on.backward(d), np.ndarray)
    assert off.backward(d) is None
    np.testing.assert_array_equal(on.weight.grad, off.weight.grad)
    np.testing.assert_array_equal(on.bias.grad, off.bias.grad)


def test_same_rng_seed_gives_same_weights_and_float32_is_rounded_float64():
    a = Linear(5, 7, dtype=np.float64, rng=np.random.default_rng(9))
    b = Linear(5, 7, dtype=np.float32, rng=np.random.default_rng(9))
    np.testing.assert_array_equal(a.weight.data.astype(np.float32), b.weight.data)
    assert np.all(a.bias.data == 0)


def test_backward_before_forward_and_wrong_dout_raise():
    layer = Linear(3, 2)
    with pytest.raises(RuntimeError, match="before forward"):
        layer.backward(np.zeros((1, 2), np.float32))
    layer.forward(np.zeros((4, 3), np.float32))
    with pytest.raises(ValueError, match=r"dout of shape \(4, 2\)"):
        layer.backward(np.zeros((4, 3), np.float32))


@pytest.mark.parametrize("kwargs,match", [
    (dict(in_features=0, out_features=2), "in_features"),
    (dict(in_features=2, out_features=-1), "out_features"),
    (dict(in_features=2.5, out_features=2), "in_features"),
    (dict(in_features=2, out_features=2, dtype=np.int32), "dtype"),
    (dict(in_features=2, out_features=2, init="nope"), "init"),
    (dict(in_features=2, out_features=2, rng="seed"), "rng"),
])
def test_linear_constructor_rejects_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        Linear(**kwargs)
