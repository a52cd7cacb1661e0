"""Sampling from a language model: determinism, greedy = argmax, temperature and top-k, bad arguments."""

import numpy as np
import pytest

from npddp.nn import gpt
from npddp.nn.sample import generate, next_token_probs

VOCAB, CONTEXT = 17, 8


@pytest.fixture(scope="module")
def model():
    return gpt(VOCAB, CONTEXT, d_model=16, num_layers=1, num_heads=2, d_ff=32, seed=3).eval()


def greedy_by_hand(model, prompt, n):
    """Argmax of the last position, one token at a time, over the last CONTEXT tokens."""
    out = list(prompt)
    for _ in range(n):
        logits = model.forward(np.array([out[-CONTEXT:]]))
        out.append(int(np.argmax(logits[0, -1])))
    return out


@pytest.mark.parametrize("temperature", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("top_k", [0, 3, VOCAB])
def test_the_same_seed_gives_the_same_tokens_and_another_seed_differs(model, temperature, top_k):
    prompt = np.array([1, 2, 3])
    a = generate(model, prompt, 20, temperature, top_k, seed=5)
    b = generate(model, prompt, 20, temperature, top_k, seed=5)
    assert a.dtype == np.int64 and a.shape == (23,)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a[:3], prompt)
    assert ((0 <= a) & (a < VOCAB)).all()
    others = [generate(model, prompt, 20, temperature, top_k, seed=s) for s in range(6, 10)]
    if top_k != 1:
        assert any(not np.array_equal(a, o) for o in others)


@pytest.mark.parametrize("prompt_len", [1, 5, CONTEXT, CONTEXT + 4])
@pytest.mark.parametrize("temperature", [0.3, 1.0, 7.0])
def test_top_k_1_is_greedy_decoding_whatever_the_seed_and_temperature(model, prompt_len, temperature):
    prompt = np.arange(prompt_len) % VOCAB
    want = greedy_by_hand(model, prompt, 12)
    for seed in (0, 1):
        assert generate(model, prompt, 12, temperature, 1, seed=seed).tolist() == want


@pytest.mark.parametrize("k", [1, 2, 5, 16])
@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_top_k_keeps_exactly_the_k_most_likely_and_temperature_reshapes_them(k, temperature):
    logits = np.random.default_rng(k).normal(size=16).astype(np.float32) * 3
    p = next_token_probs(logits, temperature, k)
    assert p.dtype == np.float64 and abs(p.sum() - 1) < 1e-12
    kept = np.argsort(logits)[::-1][:k]
    assert set(np.flatnonzero(p)) == set(kept)
    z = logits[kept].astype(np.float64) / temperature
    want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    np.testing.assert_allclose(p[kept], want, rtol=1e-12)


def test_low_temperature_concentrates_and_high_flattens():
    logits = np.array([2.0, 1.0, 0.0, -1.0])
    cold, warm, hot = (next_token_probs(logits, t) for t in (0.1, 1.0, 10.0))
    assert cold[0] > warm[0] > hot[0] > 0.25
    assert cold[0] > 0.99 and hot.max() - hot.min() < 0.1


def test_sampled_frequencies_follow_the_distribution():
    """A one-token 'model' whose next-token distribution is known: counts match it."""
    class Fixed:
        vocab_size, context_length = 4, 4

        def forward(self, idx):
            return np.broadcast_to(np.log([0.5, 0.3, 0.15, 0.05]), (*idx.shape, 4))

    tokens = generate(Fixed(), np.array([0]), 4000, seed=0)[1:]
    freq = np.bincount(tokens, minlength=4) / tokens.size
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.03)


@pytest.mark.parametrize("kwargs, text", [
    ({"num_tokens": -1}, "num_tokens must be an integer >= 0"),
    ({"num_tokens": 2.5}, "num_tokens must be an integer >= 0"),
    ({"temperature": 0.0}, "temperature must be a finite number > 0"),
    ({"temperature": -1.0}, "temperature must be a finite number > 0"),
    ({"temperature": float("nan")}, "temperature must be a finite number > 0"),
    ({"top_k": -1}, f"top_k must be an integer in [0, {VOCAB}]"),
    ({"top_k": VOCAB + 1}, f"top_k must be an integer in [0, {VOCAB}]"),
    ({"prompt": np.array([], dtype=np.int64)}, "prompt must be a non-empty 1-D array"),
    ({"prompt": np.array([0.5])}, "prompt must be a non-empty 1-D array"),
    ({"prompt": np.array([[1, 2]])}, "prompt must be a non-empty 1-D array"),
    ({"prompt": np.array([VOCAB])}, f"prompt tokens must be in [0, {VOCAB - 1}]"),
])
def test_bad_arguments_name_the_value_and_the_valid_range(model, kwargs, text):
    args = {"prompt": np.array([1]), "num_tokens": 3, **kwargs}
    with pytest.raises(ValueError) as e:
        generate(model, **args)
    assert text in str(e.value)
