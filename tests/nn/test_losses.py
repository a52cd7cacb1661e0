"""CrossEntropyLoss and MSELoss: gradient checks, reference values, stability, bad input."""

import numpy as np
import pytest

from npddp.nn import CrossEntropyLoss, MSELoss
from npddp.nn.gradcheck import check_loss


def reference_xent(logits, target):
    """Textbook formula in extended precision (fine for moderate logits)."""
    z = logits.astype(np.longdouble)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return float(-logp[np.arange(len(target)), target].mean())


@pytest.mark.parametrize("trial", range(5))
def test_cross_entropy_gradient_and_value(trial):
    rng = np.random.default_rng(trial)
    b, c = int(rng.integers(1, 9)), int(rng.integers(2, 8))
    logits = rng.standard_normal((b, c)) * 3
    target = rng.integers(0, c, b)
    lossfn = CrossEntropyLoss()
    assert abs(lossfn.forward(logits, target) - reference_xent(logits, target)) < 1e-12
    err = check_loss(lossfn, logits, target)
    assert err < 1e-6, f"CrossEntropyLoss B={b} C={c}: max relative error {err:.3g}"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cross_entropy_is_stable_for_huge_logits(dtype):
    rng = np.random.default_rng(1)
    base = rng.standard_normal((4, 5))
    target = np.array([0, 1, 2, 3])
    lossfn = CrossEntropyLoss()
    small = lossfn.forward(base.astype(dtype), target)
    shifted = lossfn.forward((base + 1e4).astype(dtype), target)    # exp(1e4) would overflow
    assert np.isfinite(shifted)
    assert abs(shifted - small) < (1e-2 if dtype == np.float32 else 1e-9)
    big = np.array([[1000.0, 0.0], [0.0, -1000.0]], dtype)
    assert lossfn.forward(big, np.array([1, 0])) == pytest.approx(500.0, rel=1e-6)
    d = lossfn.backward()
    assert d.dtype == dtype and np.all(np.isfinite(d))


def test_cross_entropy_backward_is_softmax_minus_onehot_over_batch():
    logits = np.array([[0.0, 0.0], [np.log(3.0), 0.0]])
    lossfn = CrossEntropyLoss()
    lossfn.forward(logits, np.array([0, 1]))
    np.testing.assert_allclose(lossfn.backward(), [[-0.25, 0.25], [0.375, -0.375]], rtol=1e-12)


def test_cross_entropy_float32_stays_float32():
    lossfn = CrossEntropyLoss()
    out = lossfn.forward(np.zeros((3, 4), np.float32), np.array([0, 1, 2]))
    assert isinstance(out, float) and out == pytest.approx(np.log(4), rel=1e-6)
    assert lossfn.backward().dtype == np.float32


def test_correct_counts_argmax_hits():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((50, 7))
    target = rng.integers(0, 7, 50)
    assert CrossEntropyLoss().correct(logits, target) == int((logits.argmax(1) == target).sum())
    assert CrossEntropyLoss().correct(logits, logits.argmax(1)) == 50


@pytest.mark.parametrize("logits,target,match", [
    (np.zeros((3, 4)), np.array([0, 1, 4]), r"\[0, 4\)"),
    (np.zeros((3, 4)), np.array([0, -1, 2]), r"\[0, 4\)"),
    (np.zeros((3, 4)), np.array([0.0, 1.0, 2.0]), "integer targets"),
    (np.zeros((3, 4)), np.array([0, 1]), r"shape \(3,\)"),
    (np.zeros(4), np.array([0]), r"\(B, C\)"),
    (np.zeros((3, 4), np.int64), np.array([0, 1, 2]), "floating"),
    (np.zeros((0, 4)), np.array([], np.int64), "empty"),
])
def test_cross_entropy_rejects_bad_input(logits, target, match):
    with pytest.raises(ValueError, match=match):
        CrossEntropyLoss().forward(logits, target)


@pytest.mark.parametrize("shape", [(3,), (4, 2), (2, 3, 2)])
def test_mse_gradient_and_value(shape):
    rng = np.random.default_rng(len(shape))
    pred, target = rng.standard_normal(shape), rng.standard_normal(shape)
    lossfn = MSELoss()
    assert lossfn.forward(pred, target) == pytest.approx(np.mean((pred - target) ** 2), rel=1e-13)
    err = check_loss(lossfn, pred, target)
    assert err < 1e-6, f"MSELoss {shape}: max relative error {err:.3g}"


def test_mse_rejects_mismatched_shapes_and_keeps_float32():
    with pytest.raises(ValueError, match=r"target of shape \(2, 3\)"):
        MSELoss().forward(np.zeros((2, 3)), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="floating"):
        MSELoss().forward(np.zeros((2, 3), np.int32), np.zeros((2, 3)))
    lossfn = MSELoss()
    lossfn.forward(np.ones((2, 2), np.float32), np.zeros((2, 2), np.float32))
    assert lossfn.backward().dtype == np.float32


def test_backward_before_forward_raises():
    for lossfn in (CrossEntropyLoss(), MSELoss()):
        with pytest.raises(RuntimeError, match="before forward"):
            lossfn.backward()
