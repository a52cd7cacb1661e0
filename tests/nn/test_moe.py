"""The mixture-of-experts block alone: gradients, routing, capacity, the load-balancing loss."""

import numpy as np
import pytest

from npddp.nn import MoE, gpt
from npddp.nn.gradcheck import numerical_grad, rel_error
from npddp.nn.moe import capacity, route


def _moe(e=4, k=2, cf=1.25, aux=0.1, d=6, seed=0):
    return MoE(d, 8, e, k, capacity_factor=cf, aux_coef=aux, dtype=np.float64, rng=seed, init_std=0.5)


def _loss(m, x, r):
    return float(np.sum(m.forward(x) * r)) + m.aux_loss


@pytest.mark.parametrize("e,k,cf", [(4, 1, 1.0), (4, 2, 1.25), (3, 3, 0.5), (2, 1, 4.0)])
def test_gradients_match_central_differences_including_aux_loss(e, k, cf):
    rng = np.random.default_rng(e * 10 + k)
    m = _moe(e, k, cf)
    x = rng.standard_normal((2, 5, 6))
    r = rng.standard_normal((2, 5, 6))
    m.zero_grad()
    m.forward(x)
    dx = m.backward(r)
    assert rel_error(dx, numerical_grad(lambda: _loss(m, x, r), x)) < 1e-6
    for name, p in m.named_parameters():
        assert rel_error(p.grad, numerical_grad(lambda: _loss(m, x, r), p.data)) < 1e-6, name


def test_route_takes_top_k_in_order_and_drops_past_capacity_first_choices_first():
    logits = np.array([[[3., 2., 1.], [3., 1., 2.], [3., 2., 1.], [1., 3., 2.]]])   # 1 group, T=4, E=3
    choice, kept = route(logits, 2, cap=2)
    assert choice[0].tolist() == [[0, 1], [0, 2], [0, 1], [1, 2]]
    # expert 0: tokens 0, 1 first choices kept, token 2's dropped; second choices: expert 1 <- token 0
    # (after token 3's first choice), expert 2 <- tokens 1, 3 (2 fit); expert 1 <- token 2 is the third: dropped
    assert kept[0].tolist() == [[True, True], [True, True], [False, False], [True, True]]


def test_ties_go_to_the_lower_expert_index():
    choice, _ = route(np.zeros((1, 2, 4)), 2, cap=4)
    assert choice.tolist() == [[[0, 1], [0, 1]]]


@pytest.mark.parametrize("cf,t,k,e,want", [(1.0, 8, 1, 4, 2), (1.25, 8, 2, 4, 5), (0.1, 8, 1, 4, 1), (2.0, 3, 1, 2, 3)])
def test_capacity_formula(cf, t, k, e, want):
    assert capacity(cf, k, t, e) == want


def test_dropped_tokens_get_zero_from_the_block_and_count():
    m = _moe(e=2, k=1, cf=1 / 3)                    # capacity 1 per expert of T=6: at most 2 tokens served
    x = np.random.default_rng(1).standard_normal((1, 6, 6))
    y = m.forward(x)
    served = np.abs(y[0]).sum(axis=1) > 0
    assert served.sum() <= 2 and m.dropped == 6 - served.sum()


def test_aux_loss_is_switch_formula_per_group():
    m = _moe(e=4, k=1, aux=0.5)
    x = np.random.default_rng(2).standard_normal((3, 7, 6))
    m.forward(x)
    logits = x @ m.router.weight.data.T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    f = np.stack([np.bincount(np.argmax(logits[g], -1), minlength=4) / 7 for g in range(3)])
    want = 0.5 * 4 * np.mean(np.sum(f * p.mean(axis=1), axis=-1))
    assert m.aux_loss == pytest.approx(want, rel=1e-12)
    assert m.aux_loss >= 0.5 - 1e-12           # E * sum f P >= 1 when f = P, the balanced minimum is coef


def test_groups_are_independent_so_a_batch_splits_exactly():
    m = _moe()
    x = np.random.default_rng(3).standard_normal((4, 5, 6))
    whole = m.forward(x)
    aux = m.aux_loss
    first = m.forward(x[:2])
    a0 = m.aux_loss
    second = m.forward(x[2:])
    np.testing.assert_allclose(np.concatenate([first, second]), whole, rtol=0, atol=1e-14)
    assert (a0 + m.aux_loss) / 2 == pytest.approx(aux, rel=1e-12)


def test_bad_arguments_name_the_range():
    with pytest.raises(ValueError, match=r"top_k must be in \[1, 2\]"):
        MoE(4, 8, 2, 3)
    with pytest.raises(ValueError, match="capacity_factor must be > 0"):
        MoE(4, 8, 2, 1, capacity_factor=0)
    with pytest.raises(ValueError, match="aux_coef must be >= 0"):
        MoE(4, 8, 2, 1, aux_coef=-1)


def test_gpt_with_experts_trains_end_to_end_and_names_experts_by_index():
    net = gpt(11, 8, 8, 2, 2, 16, dtype=np.float64, moe={"num_experts": 4, "top_k": 2})
    names = [n for n, _ in net.named_parameters()]
    assert "blocks.0.mlp.router.weight" in names and "blocks.1.mlp.experts.3.2.bias" in names
    idx = np.random.default_rng(0).integers(0, 11, (2, 8))
    logits = net.forward(idx)
    assert logits.shape == (2, 8, 11)
    net.zero_grad()
    net.backward(np.ones_like(logits))
    assert np.abs(net.blocks[0].mlp.router.weight.grad).sum() > 0
