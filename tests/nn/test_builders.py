"""mlp / cnn builders: structure, whole-model gradient checks, learning smoke tests, summary."""

import numpy as np
import pytest

from npddp.nn import Conv2d, CrossEntropyLoss, Flatten, Linear, MaxPool2d, ReLU, cnn, mlp, summary
from npddp.nn.gradcheck import check_module
from npddp.optim import SGD, AdamW


def test_mlp_structure_and_parameter_count():
    model = mlp(784, [1024, 1024, 1024], 10)
    kinds = [type(m) for m in model.layers]
    assert kinds == [Linear, ReLU, Linear, ReLU, Linear, ReLU, Linear]
    assert model.num_parameters() == 784 * 1024 + 1024 + 2 * (1024 * 1024 + 1024) + 1024 * 10 + 10
    assert model.num_bytes() == 4 * model.num_parameters()
    assert [p.dtype for p in model.parameters()] == [np.float32] * 8
    assert [model.layers[i].input_grad for i in (0, 2, 4, 6)] == [False, True, True, True]


def test_cnn_structure_and_shapes():
    model = cnn((1, 28, 28), (32, 64), (128,), 10, dtype=np.float64)
    kinds = [type(m) for m in model.layers]
    assert kinds == [Conv2d, ReLU, MaxPool2d, Conv2d, ReLU, MaxPool2d, Flatten, Linear, ReLU, Linear]
    assert model.layers[7].in_features == 64 * 7 * 7
    y = model.forward(np.zeros((3, 1, 28, 28)))
    assert y.shape == (3, 10) and y.dtype == np.float64
    odd = cnn((3, 9, 11), (4, 5, 6), (8, 7), 2)              # 9x11 -> 4x5 -> 2x2 -> 1x1
    assert odd.layers[10].in_features == 6 and odd.forward(np.zeros((2, 3, 9, 11), np.float32)).shape == (2, 2)


@pytest.mark.parametrize("builder", ["mlp", "cnn"])
def test_same_seed_same_model_other_seed_differs(builder):
    make = {"mlp": lambda s: mlp(5, [4, 3], 2, seed=s), "cnn": lambda s: cnn((1, 4, 4), (2,), (3,), 2, seed=s)}[builder]
    a, b, c = make(0), make(0), make(1)
    for pa, pb in zip(a.parameters(), b.parameters()):
        np.testing.assert_array_equal(pa.data, pb.data)
    assert any(not np.array_equal(pa.data, pc.data) for pa, pc in zip(a.parameters(), c.parameters()))


def nonzero_biases(model, rng):
    for p in model.parameters():
        if p.data.ndim == 1:
            p.data[:] = rng.standard_normal(p.data.shape) * 0.1


@pytest.mark.parametrize("trial", range(2))
def test_whole_mlp_gradients(trial):
    rng = np.random.default_rng(trial)
    model = mlp(6, [5, 4], 3, dtype=np.float64, seed=trial, input_grad=True)
    nonzero_biases(model, rng)
    errors = check_module(model, rng.standard_normal((4, 6)), rng)
    assert len(errors) == 1 + 6
    assert max(errors.values()) < 1e-6, f"MLP: {errors}"


def test_whole_cnn_gradients():
    rng = np.random.default_rng(5)
    model = cnn((2, 8, 6), (3, 4), (5,), 3, dtype=np.float64, seed=2, input_grad=True)
    nonzero_biases(model, rng)
    errors = check_module(model, rng.standard_normal((2, 2, 8, 6)), rng)
    assert len(errors) == 1 + 8
    assert max(errors.values()) < 1e-6, f"CNN: {errors}"


def test_first_layer_skips_input_gradient_by_default():
    model = mlp(3, [4], 2, dtype=np.float64)
    model.forward(np.ones((2, 3)))
    assert model.backward(np.ones((2, 2))) is None
    assert np.any(model.layers[0].weight.grad != 0)


def train(model, opt, x, t, steps):
    lossfn = CrossEntropyLoss()
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        losses.append(lossfn.forward(model.forward(x), t))
        model.backward(lossfn.backward())
        opt.step()
    return losses, lossfn.correct(model.forward(x), t)


def test_mlp_learns_a_teacher_problem():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 10)).astype(np.float32)
    t = (x @ rng.standard_normal((10, 3))).argmax(axis=1)
    model = mlp(10, [64], 3, seed=1)
    losses, correct = train(model, SGD(model.parameters(), lr=0.1, momentum=0.9), x, t, 300)
    assert losses[-1] < losses[0] / 10, f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    assert correct >= 250


def test_cnn_learns_bar_orientation():
    """Vertical vs horizontal bars in noise."""
    rng = np.random.default_rng(1)
    n = 64
    x = 0.3 * rng.standard_normal((n, 1, 8, 8)).astype(np.float32)
    t = rng.integers(0, 2, n)
    pos = rng.integers(1, 7, n)
    for i in range(n):
        if t[i]:
            x[i, 0, :, pos[i]] += 1.0
        else:
            x[i, 0, pos[i], :] += 1.0
    model = cnn((1, 8, 8), (4, 8), (16,), 2, seed=0)
    losses, correct = train(model, AdamW(model.parameters(), lr=1e-2, weight_decay=0.0), x, t, 60)
    assert losses[-1] < losses[0] / 10, f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"
    assert correct == n


def test_summary_lists_layers_and_totals():
    model = cnn((1, 8, 8), (2,), (3,), 2)
    text = summary(model)
    assert "Conv2d(1->2" in text and "MaxPool2d" in text and "(2, 1, 3, 3)" in text
    assert f"{model.num_parameters():,} parameters" in text
    assert f"{model.num_bytes():,} bytes" in text
    assert len(text.splitlines()) == 2 + len(model.layers) + 1


@pytest.mark.parametrize("call,match", [
    (lambda: mlp(0, [3], 2), "in_features"),
    (lambda: mlp(3, [3, 0], 2), r"hidden\[1\]"),
    (lambda: mlp(3, "12", 2), "hidden"),
    (lambda: mlp(3, [3], 2, dtype=np.int64), "dtype"),
    (lambda: cnn((1, 28), (4,), (3,), 2), "in_shape"),
    (lambda: cnn((1, 3, 3), (4, 4), (3,), 2), "too small"),
    (lambda: cnn((1, 8, 8), (), (3,), 2), "channels"),
    (lambda: cnn((1, 8, 8), (4,), (3,), 0), "num_classes"),
])
def test_builders_reject_bad_arguments(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


@pytest.mark.parametrize("builder", ["mlp", "cnn"])
def test_hidden_layers_he_output_layer_lecun_biases_zero(builder):
    model = (mlp(400, [300, 300], 200, dtype=np.float64) if builder == "mlp"
             else cnn((8, 8, 8), (16,), (300,), 200, dtype=np.float64))
    weighted = [m for m in model.layers if isinstance(m, (Linear, Conv2d))]
    for i, layer in enumerate(weighted):
        fan_in = layer.weight.data[0].size
        gain = 1.0 if i == len(weighted) - 1 else 2.0
        assert layer.weight.data.var() == pytest.approx(gain / fan_in, rel=0.1), repr(layer)
        assert not np.any(layer.bias.data)
