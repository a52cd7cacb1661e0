"""The gradient contract DDP relies on: accumulate in place (or overwrite after a lazy zero_grad), never rebind, hooks per leaf."""

import numpy as np
import pytest

from npddp.nn import Conv2d, Linear, MaxPool2d, ReLU, Sequential, cnn, mlp
from npddp.nn.parameter import settle_grads

MODELS = {
    "linear": lambda dt: Sequential(Linear(5, 4, dtype=dt, rng=np.random.default_rng(0))),
    "mlp": lambda dt: mlp(5, [6, 4], 3, dtype=dt, seed=1),
    "conv": lambda dt: Sequential(Conv2d(2, 3, 3, 2, 1, dtype=dt, rng=np.random.default_rng(0))),
    "cnn": lambda dt: cnn((2, 8, 8), (3, 4), (5,), 3, dtype=dt, seed=2),
}
INPUTS = {"linear": (4, 5), "mlp": (4, 5), "conv": (2, 2, 6, 7), "cnn": (2, 2, 8, 8)}


def run_backward(model, x, dout):
    model.forward(x)
    model.backward(dout)


def setup(name, dtype=np.float64):
    rng = np.random.default_rng(42)
    model = MODELS[name](dtype)
    x = rng.standard_normal(INPUTS[name]).astype(dtype)
    dout = rng.standard_normal(model.forward(x).shape).astype(dtype)
    return model, x, dout


@pytest.mark.parametrize("name", sorted(MODELS))
def test_two_backward_passes_accumulate_the_sum_in_the_same_arrays(name):
    model, x, dout = setup(name)
    grads = [p.grad for p in model.parameters()]
    run_backward(model, x, dout)
    once = [g.copy() for g in grads]
    assert any(np.any(g != 0) for g in once)
    run_backward(model, x, dout)
    for p, g, g1 in zip(model.parameters(), grads, once):
        assert p.grad is g and np.shares_memory(p.grad, g)
        np.testing.assert_allclose(g, 2 * g1, rtol=1e-13, atol=1e-15)
    model.zero_grad()
    assert all(p.grad is g and not np.any(g) for p, g in zip(model.parameters(), grads))


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_backward_writes_into_grads_swapped_for_views_of_a_flat_buffer(name, dtype):
    """What DDP does: every .grad becomes a view into one flat buffer, after construction."""
    model, x, dout = setup(name, dtype)
    reference = MODELS[name](dtype)
    run_backward(reference, x, dout)
    params = model.parameters()
    flat = np.full(sum(p.data.size for p in params) + 3, 7.0, dtype)      # guard values at the end
    offset = 0
    for p in reversed(params):
        p.grad = flat[offset:offset + p.data.size].reshape(p.data.shape)
        p.grad[...] = 0
        offset += p.data.size
    run_backward(model, x, dout)
    offset = 0
    for p, r in zip(reversed(params), reversed(reference.parameters())):
        assert np.shares_memory(p.grad, flat)
        np.testing.assert_array_equal(flat[offset:offset + p.data.size], r.grad.reshape(-1))
        offset += p.data.size
    np.testing.assert_array_equal(flat[offset:], 7.0)


@pytest.mark.parametrize("lazy", [False, True])
def test_strided_non_contiguous_grad_view_still_receives_the_gradient(lazy):
    """Zeros in the view, or stale values and a lazy zero_grad: the backward leaves the gradient."""
    rng = np.random.default_rng(3)
    layer = Conv2d(2, 2, 3, dtype=np.float64, rng=rng)
    backing = np.full((2, 2, 3, 3, 2), 7.0 if lazy else 0.0)
    layer.weight.grad = backing[..., 0]                                    # not contiguous
    if lazy:
        layer.zero_grad()
    x = rng.standard_normal((1, 2, 4, 4))
    y = layer.forward(x)
    layer.backward(np.ones_like(y))
    ref = Conv2d(2, 2, 3, dtype=np.float64, rng=np.random.default_rng(3))
    ref.forward(x)
    ref.backward(np.ones_like(y))
    np.testing.assert_array_equal(backing[..., 0], ref.weight.grad)
    np.testing.assert_array_equal(backing[..., 1], 7.0 if lazy else 0.0)   # the other half untouched


@pytest.mark.parametrize("name", sorted(MODELS))
def test_hooks_called_once_per_leaf_in_reverse_order(name):
    model, x, dout = setup(name)
    calls = []
    model.register_grad_hook(calls.append)
    seen_grads = []
    model.register_grad_hook(lambda layer: seen_grads.append([p.grad.copy() for p in layer.parameters()]))
    run_backward(model, x, dout)
    assert [id(m) for m in calls] == [id(m) for m in reversed(model.layers)]
    # when a hook fires, that layer's gradients are already final
    for layer, grads in zip(calls, seen_grads):
        for g, p in zip(grads, layer.parameters()):
            np.testing.assert_array_equal(g, p.grad)
    model.clear_grad_hooks()
    run_backward(model, x, dout)
    assert len(calls) == len(model.layers)


def test_nested_sequential_reports_leaves_only():
    inner = Sequential(Linear(3, 3, dtype=np.float64, rng=np.random.default_rng(0)), ReLU())
    model = Sequential(inner, Linear(3, 2, dtype=np.float64, rng=np.random.default_rng(1)))
    calls = []
    model.register_grad_hook(calls.append)
    model.forward(np.ones((2, 3)))
    model.backward(np.ones((2, 2)))
    assert calls == [model.layers[1], inner.layers[1], inner.layers[0]]


def test_named_parameters_order_is_definition_order():
    model = cnn((1, 8, 8), (2, 3), (4,), 2)
    names = [n for n, _ in model.named_parameters()]
    assert names == ["0.weight", "0.bias", "3.weight", "3.bias", "7.weight", "7.bias", "9.weight", "9.bias"]
    assert not any(isinstance(m, MaxPool2d) and m.parameters() for m in model.layers)


def tied(dtype=np.float64):
    """One Linear used twice: its gradient is the sum over both uses."""
    layer = Linear(5, 5, dtype=dtype, rng=np.random.default_rng(4))
    return Sequential(layer, ReLU(), layer)


def backward_grads(model, x, dout, settle_first):
    """Gradients of one backward after zero_grad; ``settle_first`` reads them first (the zeros written eagerly)."""
    model.zero_grad()
    if settle_first:
        settle_grads(model.parameters())
    run_backward(model, x, dout)
    return [p.grad.copy() for p in model.parameters()]


@pytest.mark.parametrize("name", sorted(MODELS) + ["tied"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lazy_zero_grad_gives_the_gradients_of_eager_zeroing(name, dtype):
    """zero_grad marks, backward overwrites: the same bits as writing zeros and adding, including tied weights."""
    if name == "tied":
        model = tied(dtype)
        rng = np.random.default_rng(5)
        x, dout = rng.standard_normal((4, 5)).astype(dtype), rng.standard_normal((4, 5)).astype(dtype)
    else:
        model, x, dout = setup(name, dtype)
    for p in model.parameters():
        p.grad[...] = 3                                               # stale values zero_grad must hide
    arrays = [p.grad for p in model.parameters()]
    model.zero_grad()
    assert all(np.all(g == 3) for g in arrays)                       # no pass of zeros yet
    lazy = backward_grads(model, x, dout, settle_first=False)
    eager = backward_grads(model, x, dout, settle_first=True)
    assert all(p.grad is g for p, g in zip(model.parameters(), arrays))
    for a, b in zip(lazy, eager):
        np.testing.assert_array_equal(a, b)
        assert np.all(np.isfinite(a)) and np.any(a != 3)
    run_backward(model, x, dout)                                      # a second backward adds
    for p, g in zip(model.parameters(), lazy):
        np.testing.assert_allclose(p.grad, 2 * g, rtol=1e-6 if dtype == np.float32 else 1e-13)


def test_zero_grad_then_read_or_write_means_what_it_did_eagerly():
    model, x, dout = setup("mlp")
    model.zero_grad()
    first = model.parameters()[0]
    assert not np.any(first.grad)                                     # reading writes the zeros
    written = model.parameters()[1]
    written.grad[...] = 2.0                                           # a write after zero_grad is kept
    reference = MODELS["mlp"](np.float64)
    run_backward(reference, x, dout)
    run_backward(model, x, dout)
    np.testing.assert_array_equal(first.grad, reference.parameters()[0].grad)
    np.testing.assert_allclose(written.grad, reference.parameters()[1].grad + 2.0, rtol=1e-13)

