"""Transformer layers and the GPT builder: float64 gradient checks, dtypes, causality, tied weights."""

import numpy as np
import pytest

from npddp.nn import GELU, PRESETS, Block, CausalSelfAttention, CrossEntropyLoss, Embedding, LayerNorm, Linear, gpt, gpt_num_parameters, gpt_preset, summary
from npddp.nn.gradcheck import check_loss, check_module, numerical_grad, rel_error

TOL = 1e-6


def assert_grads_ok(errors, what):
    worst = max(errors.values())
    assert worst < TOL, f"{what}: max relative error {worst:.3g} per array: {errors}"


def randomise(module, rng, scale=0.3):
    """Give every parameter (LayerNorm's ones and zeros, zero biases) generic values."""
    for _, p in module.named_parameters():
        p.data[...] = p.data + scale * rng.standard_normal(p.shape)


@pytest.mark.parametrize("shape", [(5,), (2, 5), (2, 3, 5), (2, 1, 3, 5)])
def test_linear_accepts_leading_dimensions(shape):
    rng = np.random.default_rng(len(shape))
    layer = Linear(5, 4, dtype=np.float64, rng=rng)
    randomise(layer, rng)
    x = rng.standard_normal(shape)
    y = layer.forward(x)
    assert y.shape == shape[:-1] + (4,)
    np.testing.assert_allclose(y, x @ layer.weight.data.T + layer.bias.data, rtol=1e-13)
    assert_grads_ok(check_module(layer, x, rng), f"Linear on {shape}")


@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 4)])
def test_embedding_gradient_with_repeated_indices(shape):
    rng = np.random.default_rng(1)
    layer = Embedding(6, 3, dtype=np.float64, rng=rng)
    idx = rng.integers(0, 6, shape)
    idx.reshape(-1)[:2] = 4                                  # a repeated index for certain
    np.testing.assert_array_equal(layer.forward(idx), layer.weight.data[idx])
    assert_grads_ok(check_module(layer, idx, rng), f"Embedding {shape}")
    # exact scatter-add: the gradient row of index i is the sum of the dout rows that read it
    layer.zero_grad()
    dout = rng.standard_normal(shape + (3,))
    layer.forward(idx)
    assert layer.backward(dout) is None
    want = np.zeros_like(layer.weight.data)
    for i, row in zip(idx.reshape(-1), dout.reshape(-1, 3)):
        want[i] += row
    np.testing.assert_allclose(layer.weight.grad, want, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("shape", [(4, 6), (2, 3, 6), (1, 6)])
def test_layernorm_gradients_and_formula(shape):
    rng = np.random.default_rng(2)
    layer = LayerNorm(6, eps=1e-5, dtype=np.float64)
    randomise(layer, rng)
    x = rng.standard_normal(shape) * 3 + 1
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)        # biased variance
    want = (x - mean) / np.sqrt(var + 1e-5) * layer.weight.data + layer.bias.data
    np.testing.assert_allclose(layer.forward(x), want, rtol=1e-12, atol=1e-13)
    assert_grads_ok(check_module(layer, x, rng), f"LayerNorm {shape}")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4)])
def test_gelu_gradients(approximate, shape):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape) * 2
    assert_grads_ok(check_module(GELU(approximate), x, rng), f"GELU({approximate}) {shape}")


def test_gelu_values_float64_and_fast_float32():
    from scipy.special import erf, erfc
    x64 = np.linspace(-12, 12, 200_001)
    exact = 0.5 * x64 * erfc(-x64 / np.sqrt(2))                # 1 + erf(z) without cancellation
    np.testing.assert_allclose(GELU().forward(x64), exact, rtol=1e-13, atol=1e-300)
    tanh = 0.5 * x64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (x64 + 0.044715 * x64 ** 3)))
    np.testing.assert_allclose(GELU("tanh").forward(x64), tanh, rtol=1e-13, atol=1e-15)
    # float32 (chunked polynomial path, several chunks): |Phi error| < 2e-7 everywhere
    x32 = x64.astype(np.float32)
    layer = GELU()
    y32 = layer.forward(x32)
    assert y32.dtype == np.float32
    phi = 0.5 * (1 + erf(x32.astype(np.float64) / np.sqrt(2)))
    assert np.abs(layer._phi - phi).max() < 2e-7
    assert np.abs(y32 - x32 * phi).max() <= 2e-7 * 12
    dx = layer.backward(np.ones_like(x32))
    dexact = phi + x32 * np.exp(-0.5 * x32.astype(np.float64) ** 2) / np.sqrt(2 * np.pi)
    assert dx.dtype == np.float32 and np.abs(dx - dexact).max() < 1e-6


@pytest.mark.parametrize("b,t,d,h", [(2, 5, 8, 2), (1, 1, 6, 3), (3, 4, 4, 1)])
def test_attention_gradients(b, t, d, h):
    rng = np.random.default_rng(4)
    layer = CausalSelfAttention(d, h, dtype=np.float64, rng=rng, init_std=0.5)
    randomise(layer, rng)
    assert_grads_ok(check_module(layer, rng.standard_normal((b, t, d)), rng), f"attention {(b, t, d, h)}")


def test_attention_matches_a_loop_over_heads_and_is_causal():
    rng = np.random.default_rng(5)
    b, t, d, h = 2, 6, 8, 2
    layer = CausalSelfAttention(d, h, dtype=np.float64, rng=rng, init_std=0.5)
    randomise(layer, rng)
    x = rng.standard_normal((b, t, d))
    y = layer.forward(x)
    qkv = x @ layer.qkv.weight.data.T + layer.qkv.bias.data
    heads = []
    for i in range(h):
        q, k, v = (qkv[..., j * d + i * d // h: j * d + (i + 1) * d // h] for j in range(3))
        s = q @ k.transpose(0, 2, 1) / np.sqrt(d // h)
        s[:, np.triu_indices(t, 1)[0], np.triu_indices(t, 1)[1]] = -np.inf
        p = np.exp(s - s.max(-1, keepdims=True))
        heads.append((p / p.sum(-1, keepdims=True)) @ v)
    want = np.concatenate(heads, axis=-1) @ layer.proj.weight.data.T + layer.proj.bias.data
    np.testing.assert_allclose(y, want, rtol=1e-12, atol=1e-13)
    x2 = x.copy()
    x2[:, 4:] += 10.0                                          # change the future: the past is unchanged
    y2 = layer.forward(x2)
    np.testing.assert_array_equal(y2[:, :4], y[:, :4])
    assert not np.allclose(y2[:, 4:], y[:, 4:])


def test_block_gradients():
    rng = np.random.default_rng(6)
    block = Block(8, 2, 12, dtype=np.float64, rng=rng, init_std=0.4)
    randomise(block, rng)
    assert_grads_ok(check_module(block, rng.standard_normal((2, 4, 8)), rng), "Block")


def tiny_gpt(tie=True, dtype=np.float64, gelu="none", seed=0):
    return gpt(vocab_size=11, context_length=6, d_model=8, num_layers=2, num_heads=2, d_ff=12, dtype=dtype,
               seed=seed, tie_weights=tie, gelu=gelu)


@pytest.mark.parametrize("tie,gelu", [(True, "none"), (False, "tanh")])
def test_whole_gpt_gradients_through_the_loss(tie, gelu):
    rng = np.random.default_rng(7)
    model = tiny_gpt(tie, gelu=gelu)
    randomise(model, rng, scale=0.2)
    idx, target = rng.integers(0, 11, (2, 5)), rng.integers(0, 11, (2, 5))
    lossfn = CrossEntropyLoss()

    def loss():
        return lossfn.forward(model.forward(idx), target)

    model.zero_grad()
    loss()
    assert model.backward(lossfn.backward()) is None
    errors = {name: rel_error(p.grad.copy(), numerical_grad(loss, p.data)) for name, p in model.named_parameters()}
    assert_grads_ok(errors, f"GPT tie={tie}")


def test_tied_head_shares_one_parameter_and_sums_both_gradients():
    tied, untied = tiny_gpt(True), tiny_gpt(False)
    assert tied.head.weight is tied.tok_emb.weight
    names = [n for n, _ in tied.named_parameters()]
    assert "head.weight" not in names and names.count("tok_emb.weight") == 1
    assert len(tied.parameters()) == len(untied.parameters()) - 1
    assert tied.num_parameters() == untied.num_parameters() - 11 * 8
    table = summary(tied).splitlines()
    head = next(line for line in table if line.startswith("head "))
    assert "(11, 8) shared with tok_emb" in head and head.split()[-1] == "0"
    assert sum(int(line.split()[-1]) for line in table[2:-1]) == tied.num_parameters()
    # same weights in both (head of the untied one set to the embedding): the tied gradient is the sum
    untied.head.weight.data[...] = untied.tok_emb.weight.data
    for name, p in tied.named_parameters():
        dict(untied.named_parameters())[name].data[...] = p.data
    rng = np.random.default_rng(8)
    idx, dout = rng.integers(0, 11, (2, 6)), rng.standard_normal((2, 6, 11))
    for m in (tied, untied):
        m.zero_grad()
        m.forward(idx)
        m.backward(dout)
    want = untied.tok_emb.weight.grad + untied.head.weight.grad
    np.testing.assert_allclose(tied.tok_emb.weight.grad, want, rtol=1e-12, atol=1e-15)


def test_gpt_reports_every_leaf_once_and_the_tied_weight_last():
    model = tiny_gpt(True)
    seen = []
    model.register_grad_hook(lambda layer: seen.append(layer))
    idx = np.zeros((1, 3), np.int64)
    model.backward(np.ones_like(model.forward(idx)))
    leaves = [m for _, m in model.named_modules() if next(m.children(), None) is None]
    assert sorted(map(id, seen)) == sorted(map(id, leaves))
    assert seen[0] is model.head and seen[-1] is model.tok_emb


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_dtype_is_kept_everywhere(dtype):
    model = gpt(13, 8, 16, 2, 4, 24, dtype=dtype, seed=1)
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 13, (2, 8)).astype(np.uint16)            # token files are uint16
    lossfn = CrossEntropyLoss()
    logits = model.forward(idx)
    assert logits.dtype == dtype
    lossfn.forward(logits, idx)
    assert lossfn.backward().dtype == dtype
    model.backward(lossfn.backward())
    for name, p in model.named_parameters():
        assert p.data.dtype == dtype and p.grad.dtype == dtype, name
        assert np.all(np.isfinite(p.grad)) and np.any(p.grad != 0), name


def test_presets_have_the_coursework_shapes_and_counted_parameters():
    assert PRESETS["small"] == (768, 3072, 12, 12) and PRESETS["medium"] == (1024, 4096, 24, 16)
    assert PRESETS["large"] == (1280, 5120, 36, 20) and PRESETS["xl"] == (1600, 6400, 48, 25)
    assert PRESETS["2.7B"] == (2560, 10240, 32, 32)
    m = gpt_preset("tiny", 50, 16, seed=0)
    d, ff, layers, heads = PRESETS["tiny"]
    assert m.num_parameters() == gpt_num_parameters(50, 16, d, layers, heads, ff)
    untied = gpt(50, 16, d, layers, heads, ff, tie_weights=False)
    assert untied.num_parameters() == gpt_num_parameters(50, 16, d, layers, heads, ff, tie_weights=False)
    # GPT-2 small with its 50257-token vocabulary and 1024 positions: the published 124M
    assert gpt_num_parameters(50257, 1024, 768, 12, 12, 3072) == 124_439_808


def test_same_seed_same_model_and_gpt2_initialisation():
    a, b = gpt_preset("tiny", 64, 8, seed=3), gpt_preset("tiny", 64, 8, seed=3)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        np.testing.assert_array_equal(p.data, q.data, err_msg=n)
    assert abs(a.tok_emb.weight.data.std() - 0.02) < 0.002
    proj = a.blocks[0].mlp[2].weight.data
    assert abs(proj.std() - 0.02 / np.sqrt(2 * 2)) < 0.002
    assert np.all(a.blocks[0].ln1.weight.data == 1) and np.all(a.blocks[0].attn.qkv.bias.data == 0)


def test_cross_entropy_over_tokens_is_the_mean_over_every_position():
    rng = np.random.default_rng(9)
    logits, target = rng.standard_normal((2, 3, 5)), rng.integers(0, 5, (2, 3))
    lossfn = CrossEntropyLoss()
    flat = CrossEntropyLoss().forward(logits.reshape(6, 5), target.reshape(6))
    assert lossfn.forward(logits, target) == pytest.approx(flat, rel=1e-14)
    assert check_loss(lossfn, logits, target) < TOL
    assert lossfn.correct(logits, logits.argmax(-1)) == 6
    with pytest.raises(ValueError, match=r"targets of shape \(2, 3\)"):
        lossfn.forward(logits, target[:, :2])


@pytest.mark.parametrize("make,x,error,text", [
    (lambda: Embedding(5, 2), np.array([0, 5]), ValueError, "indices must lie in [0, 5), got values in [0, 5]"),
    (lambda: Embedding(5, 2), np.array([0.0, 1.0]), TypeError, "integer index array"),
    (lambda: LayerNorm(4), np.zeros((2, 3), np.float32), ValueError, "expected input of shape (..., 4)"),
    (lambda: LayerNorm(4), np.zeros((2, 4)), TypeError, "dtype float32, got (2, 4) float64"),
    (lambda: GELU(), np.zeros(3, np.int64), TypeError, "floating dtype"),
    (lambda: CausalSelfAttention(4, 2), np.zeros((2, 4), np.float32), ValueError, "(B, T, 4)"),
    (lambda: tiny_gpt(), np.zeros((2, 7), np.int64), ValueError, "T must be in [1, 6]"),
    (lambda: tiny_gpt(), np.zeros((2, 3)), ValueError, "integer tokens of shape (B, T)"),
])
def test_bad_input_is_a_clear_error(make, x, error, text):
    with pytest.raises(error) as info:
        make().forward(x)
    assert text in str(info.value)


@pytest.mark.parametrize("call,text", [
    (lambda: GELU("fast"), "'none', 'tanh'"),
    (lambda: CausalSelfAttention(6, 4), "multiple of num_heads"),
    (lambda: gpt(10, 4, 6, 1, 4, 8), "multiple of num_heads"),
    (lambda: gpt(0, 4, 8, 1, 2, 8), "vocab_size"),
    (lambda: gpt_preset("huge", 10, 4), "small, medium, large, xl, 2.7B"),
    (lambda: LayerNorm(4, eps=0), "eps"),
    (lambda: Linear(3, 2, weight=Embedding(3, 3).weight), "shape (2, 3)"),
])
def test_bad_arguments_name_the_valid_range(call, text):
    with pytest.raises(ValueError) as info:
        call()
    assert text in str(info.value)
