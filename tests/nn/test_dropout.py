"""Dropout: rate and scaling, same mask in backward, eval identity, saved/restored RNG state."""

import numpy as np
import pytest

from npddp.nn import Dropout, Sequential
from npddp.nn.gradcheck import check_module


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_rate_and_scale(p):
    layer = Dropout(p, seed=3)
    x = np.ones((200, 500), np.float32)
    y = layer.forward(x)
    assert y.dtype == np.float32
    kept = y != 0
    assert abs(kept.mean() - (1 - p)) < 0.01
    np.testing.assert_allclose(y[kept], 1 / (1 - p), rtol=1e-6)
    assert abs(y.mean() - 1.0) < 0.02                     # expectation preserved


def test_dropout_backward_uses_the_forward_mask_and_passes_gradcheck():
    rng = np.random.default_rng(0)
    layer = Dropout(0.3, seed=1)
    x = rng.standard_normal((6, 7))
    y = layer.forward(x)
    dout = rng.standard_normal(y.shape)
    dx = layer.backward(dout)
    np.testing.assert_allclose(dx, dout * (y / x), rtol=1e-12)      # y = x * mask / (1 - p), linear in x
    layer.eval()                                            # eval: identity, so numerics work
    errors = check_module(layer, x, rng)
    assert errors["input"] < 1e-9


def test_dropout_eval_is_identity_and_draws_nothing():
    layer = Dropout(0.5, seed=2)
    before = layer.get_rng_state()
    seq = Sequential(layer).eval()
    x = np.arange(12.0).reshape(3, 4)
    assert seq.forward(x) is x
    assert seq.backward(x) is x
    np.testing.assert_array_equal(layer.get_rng_state(), before)


def test_rng_state_roundtrip_reproduces_masks():
    a = Dropout(0.5, seed=11)
    x = np.ones((8, 16))
    a.forward(x)                                            # advance the stream
    state = a.get_rng_state()
    assert state.dtype == np.uint64 and state.shape == (6,)
    expected = [a.forward(x) for _ in range(3)]
    b = Dropout(0.5, seed=999)
    b.set_rng_state(state)
    for e in expected:
        np.testing.assert_array_equal(b.forward(x), e)
    c = Dropout(0.5, seed=5)
    c.set_rng_state(b._rng.bit_generator.state)             # the dict form works too
    np.testing.assert_array_equal(c.forward(x), b.forward(x))


def test_different_seeds_give_different_masks():
    x = np.ones((10, 10))
    assert not np.array_equal(Dropout(0.5, seed=0).forward(x), Dropout(0.5, seed=1).forward(x))


@pytest.mark.parametrize("kwargs,match", [(dict(p=1.0), r"\[0, 1\)"), (dict(p=-0.1), r"\[0, 1\)"),
                                          (dict(p="a"), "p must"), (dict(p=0.5, seed=-1), "seed")])
def test_dropout_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Dropout(**kwargs)


@pytest.mark.parametrize("state", [np.zeros(5, np.uint64), np.zeros(6, np.float64),
                                   {"bit_generator": "MT19937"}])
def test_set_rng_state_rejects_bad_state(state):
    with pytest.raises(ValueError, match="Dropout"):
        Dropout(0.5).set_rng_state(state)


def test_checkpoint_code_can_find_every_dropout_by_name():
    from npddp.nn import Linear, ReLU
    model = Sequential(Linear(4, 4), ReLU(), Sequential(Dropout(0.2, seed=1), Linear(4, 2)), Dropout(0.1, seed=2))
    names = {name: m for name, m in model.named_modules()}
    assert list(names)[0] == "" and names[""] is model
    drops = {name: m.get_rng_state() for name, m in model.named_modules() if isinstance(m, Dropout)}
    assert sorted(drops) == ["2.0", "3"]
    assert not np.array_equal(drops["2.0"], drops["3"])
