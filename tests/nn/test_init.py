"""Initialisers: variance per scheme, determinism, float32 = rounded float64."""

import numpy as np
import pytest

from npddp.nn.init import INITS, get_init

VARIANCE = {"he_normal": 2.0, "he_uniform": 2.0, "lecun_normal": 1.0, "lecun_uniform": 1.0}


@pytest.mark.parametrize("name", sorted(INITS))
@pytest.mark.parametrize("fan_in", [3, 50, 800])
def test_variance_is_gain_over_fan_in(name, fan_in):
    w = get_init(name)(np.random.default_rng(fan_in), (400, 250), fan_in, np.float64)
    assert abs(w.mean()) < 0.01 * np.sqrt(VARIANCE[name] / fan_in)
    assert w.var() == pytest.approx(VARIANCE[name] / fan_in, rel=0.02)
    if name.endswith("uniform"):
        assert np.abs(w).max() <= np.sqrt(3 * VARIANCE[name] / fan_in)


@pytest.mark.parametrize("name", sorted(INITS))
def test_deterministic_and_float32_is_rounded_float64(name):
    f = get_init(name)
    a = f(np.random.default_rng(7), (5, 6), 6, np.float64)
    b = f(np.random.default_rng(7), (5, 6), 6, np.float64)
    c = f(np.random.default_rng(7), (5, 6), 6, np.float32)
    np.testing.assert_array_equal(a, b)
    assert c.dtype == np.float32
    np.testing.assert_array_equal(a.astype(np.float32), c)


def test_unknown_init_lists_valid_names():
    with pytest.raises(ValueError, match="he_normal"):
        get_init("glorot")
