"""The Transformer layers agree with PyTorch autograd to 1e-10 in float64 (skipped without torch)."""

import numpy as np
import pytest

from npddp.nn import GELU, CausalSelfAttention, CrossEntropyLoss, Embedding, LayerNorm, Linear, gpt

torch = pytest.importorskip("torch")
F = torch.nn.functional
TOL = dict(rtol=1e-10, atol=1e-12)


def compare(layer, torch_fn, x, torch_params, rng, x_grad=True):
    """Forward and backward through ``layer`` and ``torch_fn``; outputs, input and parameter grads agree."""
    tx = torch.tensor(x, requires_grad=x_grad)
    ty = torch_fn(tx)
    y = layer.forward(x)
    np.testing.assert_allclose(y, ty.detach().numpy(), **TOL)
    d = rng.standard_normal(y.shape)
    ty.backward(torch.tensor(d))
    dx = layer.backward(d)
    if x_grad:
        np.testing.assert_allclose(dx, tx.grad.numpy(), **TOL)
    for name, tp in torch_params.items():
        np.testing.assert_allclose(dict(layer.named_parameters())[name].grad, tp.grad.numpy(), **TOL,
                                   err_msg=name)


def tparams(layer):
    """Leaf tensors holding copies of ``layer``'s parameters, by name."""
    return {name: torch.tensor(p.data.copy(), requires_grad=True) for name, p in layer.named_parameters()}


def test_linear_on_three_dimensions():
    rng = np.random.default_rng(0)
    layer = Linear(5, 3, dtype=np.float64, rng=rng)
    layer.bias.data[:] = rng.standard_normal(3)
    tp = tparams(layer)
    compare(layer, lambda t: F.linear(t, tp["weight"], tp["bias"]), rng.standard_normal((2, 4, 5)), tp, rng)


def test_embedding_with_repeats():
    rng = np.random.default_rng(1)
    layer = Embedding(7, 4, dtype=np.float64, rng=rng)
    tp = tparams(layer)
    idx = rng.integers(0, 7, (3, 9))
    compare(layer, lambda t: F.embedding(t, tp["weight"]), idx, tp, rng, x_grad=False)


def test_layernorm():
    rng = np.random.default_rng(2)
    layer = LayerNorm(6, eps=1e-5, dtype=np.float64)
    layer.weight.data[:] = rng.standard_normal(6)
    layer.bias.data[:] = rng.standard_normal(6)
    tp = tparams(layer)
    compare(layer, lambda t: F.layer_norm(t, (6,), tp["weight"], tp["bias"], eps=1e-5),
            rng.standard_normal((2, 3, 6)) * 4 + 2, tp, rng)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    rng = np.random.default_rng(3)
    compare(GELU(approximate), lambda t: F.gelu(t, approximate=approximate),
            rng.standard_normal((3, 4, 5)) * 3, {}, rng)


@pytest.mark.parametrize("b,t,d,h", [(2, 7, 12, 3), (1, 1, 4, 2)])
def test_attention_against_torch_fused_causal_attention(b, t, d, h):
    rng = np.random.default_rng(4)
    layer = CausalSelfAttention(d, h, dtype=np.float64, rng=rng, init_std=0.4)
    for _, p in layer.named_parameters():
        p.data[...] += 0.1 * rng.standard_normal(p.shape)
    tp = tparams(layer)

    def torch_attention(x):
        q, k, v = F.linear(x, tp["qkv.weight"], tp["qkv.bias"]).split(d, dim=2)
        q, k, v = (a.view(b, t, h, d // h).transpose(1, 2) for a in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.linear(y.transpose(1, 2).reshape(b, t, d), tp["proj.weight"], tp["proj.bias"])

    compare(layer, torch_attention, rng.standard_normal((b, t, d)), tp, rng)


def test_cross_entropy_over_tokens():
    rng = np.random.default_rng(5)
    logits, target = rng.standard_normal((2, 5, 7)) * 30, rng.integers(0, 7, (2, 5))
    lossfn = CrossEntropyLoss()
    value = lossfn.forward(logits, target)
    tl = torch.tensor(logits, requires_grad=True)
    tv = F.cross_entropy(tl.reshape(-1, 7), torch.tensor(target).reshape(-1))
    tv.backward()
    assert value == pytest.approx(tv.item(), rel=1e-12)
    np.testing.assert_allclose(lossfn.backward(), tl.grad.numpy(), rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("tie,gelu", [(True, "none"), (False, "tanh")])
def test_whole_gpt_and_loss_match_torch(tie, gelu):
    from benchmarks import torch_gpt

    rng = np.random.default_rng(6)
    model = gpt(23, 9, 16, 2, 4, 24, dtype=np.float64, seed=1, tie_weights=tie, gelu=gelu)
    for _, p in model.named_parameters():
        p.data[...] += 0.05 * rng.standard_normal(p.shape)
    tmodel = torch_gpt.build(torch, model)
    idx, target = rng.integers(0, 23, (3, 9)), rng.integers(0, 23, (3, 9))
    lossfn = CrossEntropyLoss()
    value = lossfn.forward(model.forward(idx), target)
    model.backward(lossfn.backward())
    tv = F.cross_entropy(tmodel(torch.tensor(idx)).reshape(-1, 23), torch.tensor(target).reshape(-1))
    tv.backward()
    assert value == pytest.approx(tv.item(), rel=1e-12)
    theirs = torch_gpt.grads(tmodel)
    ours = dict(model.named_parameters())
    assert set(ours) == set(theirs)
    for name, p in ours.items():
        np.testing.assert_allclose(p.grad, theirs[name], **TOL, err_msg=name)
