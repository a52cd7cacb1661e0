"""SGD and AdamW: hand-computed steps, PyTorch's update rules, in-place updates, state dicts."""

import itertools
import math
import tracemalloc

import numpy as np
import pytest

from npddp.nn import CrossEntropyLoss, Parameter, mlp
from npddp.optim import SGD, AdamW


def run(opt, param, grads):
    """Apply ``opt`` once per gradient in ``grads``; return the parameter after each step."""
    out = []
    for g in grads:
        param.grad[...] = g
        opt.step()
        out.append(param.data.copy())
    return out


# --- hand-computed sequences: p = 1, constant gradient 0.5, lr = 0.1 -----------------------
@pytest.mark.parametrize("kwargs,expected", [
    (dict(), [0.95, 0.90, 0.85]),
    (dict(momentum=0.9), [0.95, 0.855, 0.7195]),                       # b: 0.5, 0.95, 1.355
    (dict(momentum=0.9, nesterov=True), [0.905, 0.7695, 0.59755]),     # g + 0.9 b: 0.95, 1.355, 1.7195
    (dict(weight_decay=0.1), [0.94, 0.8806, 0.821794]),                # g = 0.5 + 0.1 p: 0.6, 0.594, 0.58806
    (dict(momentum=0.5, weight_decay=0.1), [0.94, 0.8506, 0.747394]),  # b: 0.6, 0.894, 1.03206
])
def test_sgd_hand_computed(kwargs, expected):
    p = Parameter(np.array([1.0]))
    got = run(SGD([p], lr=0.1, **kwargs), p, [0.5] * 3)
    np.testing.assert_allclose(np.concatenate(got), expected, rtol=1e-12)


def test_adamw_hand_computed_first_steps():
    p = Parameter(np.array([1.0]))
    got = run(AdamW([p], lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1), p, [0.5, 0.5])
    # step 1: p = 0.99 - 0.1 * 0.5 / (0.5 + 1e-8)   (m_hat = g, sqrt(v_hat) = |g|)
    step1 = 0.99 - 0.1 * 0.5 / (0.5 + 1e-8)
    assert got[0][0] == pytest.approx(step1, rel=1e-14)
    # step 2: constant gradient again, so m_hat = 0.5 and v_hat = 0.25 exactly as well
    step2 = step1 * (1 - 0.01) - 0.1 * 0.5 / (0.5 + 1e-8)
    assert got[1][0] == pytest.approx(step2, rel=1e-14)


# --- reference implementations, written out from the formulas ------------------------------
def sgd_reference(p, grads, lr, momentum, nesterov, wd):
    p, buf, out = p.copy(), None, []
    for g in grads:
        g = g + wd * p
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * g
        out.append(p)
    return out


def adamw_reference(p, grads, lr, b1, b2, eps, wd):
    p, m, v, out = p.copy(), np.zeros_like(p), np.zeros_like(p), []
    for t, g in enumerate(grads, 1):
        p = p * (1 - lr * wd)
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        p = p - lr * m_hat / (np.sqrt(v_hat) + eps)
        out.append(p)
    return out


SGD_SETTINGS = [dict(lr=lr, momentum=mu, nesterov=nest, weight_decay=wd)
                for lr, mu, nest, wd in itertools.product((0.05, 0.3), (0.0, 0.9), (False, True), (0.0, 0.01))
                if not (nest and mu == 0)]
ADAMW_SETTINGS = [dict(lr=lr, betas=b, eps=eps, weight_decay=wd)
                  for lr, b, eps, wd in itertools.product((1e-3, 0.1), ((0.9, 0.999), (0.5, 0.9)),
                                                          (1e-8, 1e-3), (0.0, 0.1))]


@pytest.mark.parametrize("settings", SGD_SETTINGS, ids=str)
def test_sgd_matches_reference_over_several_steps(settings):
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal((3, 4))
    grads = [rng.standard_normal((3, 4)) for _ in range(5)]
    p = Parameter(p0.copy())
    got = run(SGD([p], **settings), p, grads)
    ref = sgd_reference(p0, grads, settings["lr"], settings["momentum"], settings["nesterov"],
                        settings["weight_decay"])
    for step, (a, b) in enumerate(zip(got, ref)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14, err_msg=f"step {step + 1}")


@pytest.mark.parametrize("settings", ADAMW_SETTINGS, ids=str)
def test_adamw_matches_reference_over_several_steps(settings):
    rng = np.random.default_rng(1)
    p0 = rng.standard_normal(7)
    grads = [rng.standard_normal(7) * 10 ** rng.uniform(-3, 1) for _ in range(6)]
    p = Parameter(p0.copy())
    got = run(AdamW([p], **settings), p, grads)
    (b1, b2) = settings["betas"]
    ref = adamw_reference(p0, grads, settings["lr"], b1, b2, settings["eps"], settings["weight_decay"])
    for step, (a, b) in enumerate(zip(got, ref)):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-14, err_msg=f"step {step + 1}")


@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
                                  lambda ps: AdamW(ps, lr=1e-2)])
def test_updates_in_place_keep_float32_and_leave_grads_alone(make):
    rng = np.random.default_rng(2)
    ps = [Parameter(rng.standard_normal(s).astype(np.float32)) for s in ((4, 3), (3,))]
    for p in ps:
        p.grad[...] = rng.standard_normal(p.shape)
    datas, grads = [p.data for p in ps], [p.grad.copy() for p in ps]
    opt = make(ps)
    ref = [Parameter(p.data.astype(np.float64)) for p in ps]
    ref_opt = make(ref)
    for _ in range(3):
        for r, g in zip(ref, grads):
            r.grad[...] = g
        opt.step()
        ref_opt.step()
    for p, d, g, r in zip(ps, datas, grads, ref):
        assert p.data is d and p.data.dtype == np.float32
        np.testing.assert_array_equal(p.grad, g)
        np.testing.assert_allclose(p.data, r.data, rtol=1e-5, atol=1e-6)
    for state in opt.state.values():
        assert all(a.dtype == np.float32 for a in state)


@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
                                  lambda ps: AdamW(ps, lr=1e-2)])
def test_step_allocates_no_parameter_sized_arrays(make):
    ps = [Parameter(np.ones((512, 512), np.float32)) for _ in range(2)]
    for p in ps:
        p.grad[...] = 0.5
    opt = make(ps)
    opt.step()
    tracemalloc.start()
    try:
        opt.step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, f"step allocated up to {peak} bytes"


@pytest.mark.parametrize("make", [lambda ps: SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2),
                                  lambda ps: AdamW(ps, lr=1e-2)])
def test_scratch_is_one_buffer_per_dtype_the_size_of_the_largest_parameter(make):
    """Construction allocates state and one shared scratch, not a scratch per parameter; steps stay the per-parameter
    arithmetic bit for bit (each parameter stepped alone by its own optimizer gives the same values)."""
    rng = np.random.default_rng(3)
    shapes = [(64, 32), (32,), (16, 16), (64,), (48, 32), (40, 40)]
    ps = [Parameter(rng.standard_normal(s)) for s in shapes]
    alone = [Parameter(p.data.copy()) for p in ps]
    tracemalloc.start()
    try:
        opt = make(ps)
        built, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    state = sum(a.nbytes for arrays in opt.state.values() for a in arrays)
    largest, total = max(p.data.nbytes for p in ps), sum(p.data.nbytes for p in ps)
    scratch = built - state
    assert largest <= scratch < largest + 8 * 1024 < total, (scratch, largest, total)
    singles = [make([a]) for a in alone]
    for _ in range(3):
        for p, a in zip(ps, alone):
            p.grad[...] = a.grad[...] = rng.standard_normal(p.shape)
        opt.step()
        for single in singles:
            single.step()
    for p, a in zip(ps, alone):
        assert p.data.tobytes() == a.data.tobytes()


def test_zero_grad_and_lr_setting():
    p = Parameter(np.ones(3))
    g = p.grad
    g[...] = 2.0
    opt = SGD([p], lr=0.5)
    opt.lr = 0.0
    opt.step()
    np.testing.assert_array_equal(p.data, 1.0)
    opt.lr = 0.25
    opt.step()
    np.testing.assert_array_equal(p.data, 0.5)
    opt.zero_grad()
    assert p.grad is g and not np.any(g)
    with pytest.raises(ValueError, match=r"lr must be a finite number in \[0.0, inf\]"):
        opt.lr = -1.0
    assert opt.lr == 0.25


@pytest.mark.parametrize("call,error,match", [
    (lambda p: SGD([p], lr=-0.1), ValueError, "lr"),
    (lambda p: SGD([p], lr=0.1, momentum=-1), ValueError, "momentum"),
    (lambda p: SGD([p], lr=0.1, nesterov=True), ValueError, "nesterov"),
    (lambda p: SGD([p], lr=0.1, weight_decay=float("nan")), ValueError, "weight_decay"),
    (lambda p: SGD([], lr=0.1), ValueError, "empty"),
    (lambda p: SGD([p.data], lr=0.1), TypeError, "not a Parameter"),
    (lambda p: SGD([p, p], lr=0.1), ValueError, "more than once"),
    (lambda p: AdamW([p], betas=(0.9,)), ValueError, "betas"),
    (lambda p: AdamW([p], betas=(1.0, 0.999)), ValueError, "beta1"),
    (lambda p: AdamW([p], eps=-1e-8), ValueError, "eps"),
])
def test_constructor_rejects_bad_arguments(call, error, match):
    with pytest.raises(error, match=match):
        call(Parameter(np.zeros(2)))


# --- state dicts -----------------------------------------------------------------------------
OPTIMIZERS = {
    "sgd": lambda ps: SGD(ps, lr=0.05, momentum=0.9),
    "sgd_nesterov_wd": lambda ps: SGD(ps, lr=0.05, momentum=0.8, nesterov=True, weight_decay=1e-3),
    "sgd_plain": lambda ps: SGD(ps, lr=0.05),
    "adamw": lambda ps: AdamW(ps, lr=3e-3, weight_decay=0.05),
}


def train_steps(model, opt, data, steps):
    lossfn = CrossEntropyLoss()
    for x, t in data[:steps]:
        opt.zero_grad()
        lossfn.forward(model.forward(x), t)
        model.backward(lossfn.backward())
        opt.step()


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_resume_from_state_dict_is_bitwise_identical(name, dtype):
    rng = np.random.default_rng(3)
    data = [(rng.standard_normal((8, 6)).astype(dtype), rng.integers(0, 3, 8)) for _ in range(7)]
    straight = mlp(6, [5], 3, dtype=dtype, seed=4)
    opt = OPTIMIZERS[name](straight.parameters())
    train_steps(straight, opt, data, 7)

    first = mlp(6, [5], 3, dtype=dtype, seed=4)
    opt1 = OPTIMIZERS[name](first.parameters())
    train_steps(first, opt1, data, 3)
    saved_params = [p.data.copy() for p in first.parameters()]
    state = opt1.state_dict()
    for k, v in state.items():
        assert isinstance(v, (np.ndarray, np.generic, int, float, bool)), (k, type(v))
        if isinstance(v, np.ndarray):
            assert all(not np.shares_memory(v, a) for arrs in opt1.state.values() for a in arrs)
    assert int(state["step"]) == 3

    resumed = mlp(6, [5], 3, dtype=dtype, seed=99)                     # different init, overwritten
    for p, saved in zip(resumed.parameters(), saved_params):
        p.data[...] = saved
    opt2 = OPTIMIZERS[name](resumed.parameters())
    opt2.load_state_dict({k: (np.asarray(v) if not isinstance(v, np.ndarray) else v) for k, v in state.items()})
    train_steps(resumed, opt2, data[3:], 4)
    for a, b in zip(straight.parameters(), resumed.parameters()):
        np.testing.assert_array_equal(a.data, b.data)
    assert opt2.state_dict().keys() == opt.state_dict().keys()


def test_state_dict_keys_are_flat_and_named():
    ps = [Parameter(np.zeros(2)), Parameter(np.zeros((2, 3)))]
    assert set(AdamW(ps).state_dict()) == {"step", "lr", "beta1", "beta2", "eps", "weight_decay",
                                           "exp_avg.0", "exp_avg.1", "exp_avg_sq.0", "exp_avg_sq.1"}
    assert set(SGD(ps, lr=0.1, momentum=0.9).state_dict()) == {
        "step", "lr", "momentum", "nesterov", "weight_decay", "momentum_buffer.0", "momentum_buffer.1"}
    assert set(SGD(ps, lr=0.1).state_dict()) == {"step", "lr", "momentum", "nesterov", "weight_decay"}


def bad_state(change):
    ps = [Parameter(np.zeros(2)), Parameter(np.zeros((2, 3)))]
    d = SGD(ps, lr=0.1, momentum=0.9).state_dict()
    change(d)
    return ps, d


@pytest.mark.parametrize("change,match", [
    (lambda d: d.pop("momentum_buffer.1"), r"missing \['momentum_buffer.1'\]"),
    (lambda d: d.update({"exp_avg.0": np.zeros(2)}), r"unexpected \['exp_avg.0'\]"),
    (lambda d: d.update({"momentum_buffer.1": np.zeros((3, 2))}), r"momentum_buffer.1 has \(3, 2\)"),
    (lambda d: d.update({"momentum_buffer.0": np.zeros(2, np.float32)}), "float32"),
    (lambda d: d.update({"step": -1}), "step"),
    (lambda d: d.update({"step": 1.5}), "step"),
    (lambda d: d.update({"lr": -3.0}), "lr"),
    (lambda d: d.update({"momentum": 0.0}), "other state buffers"),
    (lambda d: d.update({"nesterov": 2}), "nesterov"),
])
def test_load_state_dict_rejects_mismatches_and_changes_nothing(change, match):
    ps, d = bad_state(change)
    opt = SGD(ps, lr=0.1, momentum=0.9)
    opt.state["momentum_buffer"][0][...] = 5.0
    before = opt.state_dict()
    with pytest.raises(ValueError, match=match):
        opt.load_state_dict(d)
    after = opt.state_dict()
    assert before.keys() == after.keys()
    for k in before:
        np.testing.assert_array_equal(before[k], after[k])


def test_loaded_hyperparameters_take_effect():
    p = Parameter(np.ones(1))
    src = SGD([p], lr=0.5, momentum=0.9)
    dst = SGD([Parameter(np.ones(1))], lr=0.1, momentum=0.1)
    dst.load_state_dict(src.state_dict())
    assert (dst.lr, dst.momentum, dst.step_count) == (0.5, 0.9, 0)
    assert math.isclose(AdamW([p], lr=0.2, betas=(0.8, 0.9)).state_dict()["beta1"], 0.8)
