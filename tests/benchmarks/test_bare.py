"""The bare-NumPy MLP step (benchmarks/_bare.py) does the work of npddp's step: the same weights after each step."""

import numpy as np
import pytest

from benchmarks import _common as bc
from benchmarks._bare import BareMLP
from npddp.nn import CrossEntropyLoss, Linear, mlp
from npddp.optim import SGD


@pytest.mark.parametrize("hidden", [(32,), (48, 16, 24)])
def test_bare_step_matches_npddps_step(hidden):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, bc.IN_FEATURES))                 # (B, 784)
    y = rng.integers(0, bc.OUT_FEATURES, size=8)                 # (B,)
    model = mlp(bc.IN_FEATURES, hidden, bc.OUT_FEATURES, dtype=np.float64, seed=3)
    bare = BareMLP(model, 8, bc.LR, bc.MOMENTUM)
    opt, lossfn = SGD(model.parameters(), lr=bc.LR, momentum=bc.MOMENTUM), CrossEntropyLoss()
    layers = [m for _, m in model.named_modules() if isinstance(m, Linear)]
    for _ in range(3):  # the first step seeds the momentum buffers, the later ones use them
        model.zero_grad()
        lossfn.forward(model.forward(x), y)
        model.backward(lossfn.backward())
        opt.step()
        parts = bare.step(x, y)
        assert len(parts) == 3 and all(t >= 0 for t in parts)
        for layer, w, b in zip(layers, bare.w, bare.b):
            np.testing.assert_allclose(w, layer.weight.data, rtol=0, atol=1e-12)
            np.testing.assert_allclose(b, layer.bias.data, rtol=0, atol=1e-12)
