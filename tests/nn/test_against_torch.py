"""Cross-check against PyTorch (the optional ``torch`` extra), in float64: layers, losses, optimizers.

The float64 finite-difference checks elsewhere are the primary tests; these confirm that the
conventions (weight layout, max-pool tie routing, optimizer update rules) are PyTorch's.
"""

import numpy as np
import pytest

from npddp.nn import Conv2d, CrossEntropyLoss, Linear, MaxPool2d, Parameter
from npddp.optim import SGD, AdamW

torch = pytest.importorskip("torch")


def run_both(layer, tlayer, x, rng):
    """Forward and backward through both; returns (ours, theirs) for output and input grad."""
    tx = torch.tensor(x, requires_grad=True)
    ty = tlayer(tx)
    y = layer.forward(x)
    d = rng.standard_normal(y.shape)
    ty.backward(torch.tensor(d))
    return (y, layer.backward(d)), (ty.detach().numpy(), tx.grad.numpy())


@pytest.mark.parametrize("kernel,stride,padding",
                         [(3, 1, 1), (3, 2, 1), (5, 2, 2), (1, 1, 0), ((2, 3), (2, 1), (1, 0))])
def test_conv_and_linear_match_torch(kernel, stride, padding):
    rng = np.random.default_rng(0)
    conv = Conv2d(3, 4, kernel, stride, padding, dtype=np.float64, rng=rng)
    conv.bias.data[:] = rng.standard_normal(4)
    tconv = torch.nn.Conv2d(3, 4, kernel, stride, padding, dtype=torch.float64)
    with torch.no_grad():
        tconv.weight.copy_(torch.tensor(conv.weight.data))
        tconv.bias.copy_(torch.tensor(conv.bias.data))
    ours, theirs = run_both(conv, tconv, rng.standard_normal((2, 3, 9, 7)), rng)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(conv.weight.grad, tconv.weight.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(conv.bias.grad, tconv.bias.grad.numpy(), rtol=1e-12, atol=1e-12)

    lin = Linear(7, 5, dtype=np.float64, rng=rng)
    tlin = torch.nn.Linear(7, 5, dtype=torch.float64)
    with torch.no_grad():
        tlin.weight.copy_(torch.tensor(lin.weight.data))
        tlin.bias.zero_()
    ours, theirs = run_both(lin, tlin, rng.standard_normal((4, 7)), rng)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lin.weight.grad, tlin.weight.grad.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kernel,stride", [(2, 2), (3, 2), (2, 1), (3, 3)])
def test_maxpool_with_many_ties_matches_torch(kernel, stride):
    rng = np.random.default_rng(1)
    x = np.round(rng.standard_normal((2, 3, 9, 7)))            # small integers: ties everywhere
    ours, theirs = run_both(MaxPool2d(kernel, stride),
                            lambda t: torch.nn.functional.max_pool2d(t, kernel, stride), x, rng)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_cross_entropy_matches_torch_for_large_logits():
    rng = np.random.default_rng(2)
    logits, target = rng.standard_normal((6, 5)) * 300, rng.integers(0, 5, 6)
    lossfn = CrossEntropyLoss()
    value = lossfn.forward(logits, target)
    tl = torch.tensor(logits, requires_grad=True)
    tv = torch.nn.functional.cross_entropy(tl, torch.tensor(target))
    tv.backward()
    assert value == pytest.approx(tv.item(), rel=1e-12)
    np.testing.assert_allclose(lossfn.backward(), tl.grad.numpy(), rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("ours,theirs", [
    (lambda p: SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (lambda p: SGD(p, lr=0.1, momentum=0.5, weight_decay=0.1),
     lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5, weight_decay=0.1)),
    (lambda p: AdamW(p, lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
     lambda p: torch.optim.AdamW(p, lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)),
], ids=["sgd-nesterov", "sgd-momentum", "adamw"])
def test_optimizers_match_torch_over_ten_steps(ours, theirs):
    rng = np.random.default_rng(3)
    p0 = rng.standard_normal((5, 4))
    p, tp = Parameter(p0.copy()), torch.nn.Parameter(torch.tensor(p0.copy()))
    opt, topt = ours([p]), theirs([tp])
    for _ in range(10):
        g = rng.standard_normal((5, 4))
        p.grad[...] = g
        tp.grad = torch.tensor(g)
        opt.step()
        topt.step()
    np.testing.assert_allclose(p.data, tp.detach().numpy(), rtol=1e-12, atol=1e-14)
