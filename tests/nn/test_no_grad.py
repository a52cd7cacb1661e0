"""Forward without gradients (``Module.no_grad``): the training bits, no activations kept, no gradient touched."""

import tracemalloc

import numpy as np
import pytest

from npddp.nn import (GELU, CausalSelfAttention, Conv2d, CrossEntropyLoss, Dropout, Embedding, Flatten, LayerNorm,
                      Linear, MaxPool2d, ReLU, Tanh, cnn, gpt, mlp)

#: Every attribute a layer fills in forward for its backward.
CACHES = ("_x", "_y", "_shape", "_phi", "_xhat", "_rstd", "_idx", "_qkv", "_e", "_r", "_mask", "_x_shape")


def _float(shape, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _tokens(shape, vocab, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, shape)


LAYERS = {
    "linear": (lambda: Linear(6, 5, rng=0), lambda: _float((3, 4, 6))),
    "relu": (ReLU, lambda: _float((3, 6))),
    "tanh": (Tanh, lambda: _float((3, 6))),
    "flatten": (Flatten, lambda: _float((3, 2, 4))),
    "gelu": (GELU, lambda: _float((5, 70000 // 5))),                  # more than one pointwise chunk
    "gelu-tanh": (lambda: GELU("tanh"), lambda: _float((3, 6))),
    "gelu-float64": (GELU, lambda: _float((3, 6), dtype=np.float64)),
    "layernorm": (lambda: LayerNorm(6), lambda: _float((3, 4, 6))),
    "embedding": (lambda: Embedding(9, 4, rng=0), lambda: _tokens((3, 5), 9)),
    "attention": (lambda: CausalSelfAttention(8, 2, rng=0), lambda: _float((2, 5, 8))),
    "dropout": (lambda: Dropout(0.3, seed=1), lambda: _float((4, 6))),
    "conv": (lambda: Conv2d(2, 3, 3, padding=1, rng=0), lambda: _float((2, 2, 5, 5))),
    "maxpool": (lambda: MaxPool2d(2), lambda: _float((2, 2, 4, 4))),
}
MODELS = {
    "mlp": (lambda: mlp(6, [8, 7], 3, seed=1), lambda: _float((4, 6)), lambda: _tokens((4,), 3)),
    "cnn": (lambda: cnn((1, 6, 6), [2], [5], 3, seed=1), lambda: _float((4, 1, 6, 6)), lambda: _tokens((4,), 3)),
    "gpt": (lambda: gpt(13, 8, d_model=8, num_layers=2, num_heads=2, d_ff=12, seed=1),
            lambda: _tokens((3, 8), 13), lambda: _tokens((3, 8), 13, seed=1)),
}


def _caches(model):
    """(module name, attribute) of every forward cache still holding something."""
    return [(name, key) for name, m in model.named_modules() for key in CACHES
            if vars(m).get(key) is not None]


@pytest.mark.parametrize("name", LAYERS)
def test_a_layer_under_no_grad_gives_the_same_bits_and_keeps_nothing(name):
    make, data = LAYERS[name]
    x = data()
    trained, forward_only = make(), make()
    want = trained.forward(x.copy())
    assert _caches(trained), "the training forward keeps what backward needs"
    with forward_only.no_grad():
        got = forward_only.forward(x.copy())
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    assert _caches(forward_only) == []
    with pytest.raises(RuntimeError, match="no_grad"):
        forward_only.backward(np.ones_like(want))


@pytest.mark.parametrize("kind", MODELS)
def test_a_model_under_no_grad_gives_the_training_logits_and_loss_and_touches_no_gradient(kind):
    make, data, target = MODELS[kind]
    x, y = data(), target()
    trained, forward_only = make(), make()
    loss = CrossEntropyLoss()
    logits = trained.forward(x)
    want = loss.forward(logits, y)
    for i, p in enumerate(forward_only.parameters()):
        p.grad[...] = i + 0.5                                   # gradients a forward must leave alone
    forward_only.parameters()[0].zero_grad()                    # and a pending lazy zero stays pending
    with forward_only.no_grad():
        got_logits = forward_only.forward(x)
    got, correct = loss.score(got_logits, y)
    assert got_logits.tobytes() == logits.tobytes()
    assert got == want and correct == loss.correct(logits, y)
    assert _caches(forward_only) == [] and _caches(trained) != []
    first, *rest = forward_only.parameters()
    assert first._zero and not any(p._zero for p in rest)
    assert all((p.grad == i + 1.5).all() for i, p in enumerate(rest))


def test_a_gpt_forward_under_no_grad_leaves_no_memory_behind_where_training_keeps_megabytes():
    net = gpt(64, 32, d_model=32, num_layers=2, num_heads=2, d_ff=64, seed=0)
    x = _tokens((16, 32), 64)
    net.forward(x[:1])                                          # first-call allocations (masks, scratch) out of the way
    with net.no_grad():
        net.forward(x[:1])
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        with net.no_grad():
            out = net.forward(x)
        del out
        forward_only = tracemalloc.get_traced_memory()[0] - base
        out = net.forward(x)
        del out
        training = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    assert forward_only < 4096 and training > 1 << 20, (forward_only, training)


def test_no_grad_restores_each_modules_setting_and_set_grad_enabled_reaches_every_module():
    net = mlp(4, [5], 2, seed=0)
    inner = next(m for _, m in net.named_modules() if isinstance(m, Linear))
    inner.set_grad_enabled(False)
    with net.no_grad() as same:
        assert same is net and not any(m.grad_enabled for _, m in net.named_modules())
    assert [m.grad_enabled for _, m in net.named_modules()] == [m is not inner for _, m in net.named_modules()]
    assert net.set_grad_enabled(True) is net and all(m.grad_enabled for _, m in net.named_modules())
    with pytest.raises(ZeroDivisionError), net.no_grad():
        1 / 0
    assert all(m.grad_enabled for _, m in net.named_modules())


def test_a_training_forward_after_no_grad_trains_as_before():
    make, data, target = MODELS["gpt"]
    x, y = data(), target()
    a, b, loss = make(), make(), CrossEntropyLoss()
    with b.no_grad():
        b.forward(x)
    for net in (a, b):
        loss.forward(net.forward(x), y)
        net.backward(loss.backward())
    assert all(pa.grad.tobytes() == pb.grad.tobytes() for pa, pb in zip(a.parameters(), b.parameters()))


@pytest.mark.parametrize("shape", [(7, 5), (2, 3, 5)])
def test_score_is_the_forward_loss_bit_for_bit_and_the_correct_count(shape):
    rng = np.random.default_rng(2)
    logits = (rng.standard_normal(shape) * 4).astype(np.float32)
    target = rng.integers(0, shape[-1], shape[:-1])
    a, b = CrossEntropyLoss(), CrossEntropyLoss()
    assert b.score(logits, target) == (a.forward(logits, target), a.correct(logits, target))
    with pytest.raises(RuntimeError, match="before forward"):
        b.backward()                                            # score keeps nothing for a backward
    with pytest.raises(ValueError, match="targets must be in"):
        b.score(logits, np.full(shape[:-1], shape[-1]))
