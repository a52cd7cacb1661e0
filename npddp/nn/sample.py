"""Text generation from a language model: autoregressive sampling with temperature and top-k.

``generate(model, prompt, num_tokens, temperature=1.0, top_k=0, seed=0)`` feeds the last
``model.context_length`` tokens, scales the last position's logits by ``1 / temperature``,
keeps the ``top_k`` largest (0: all), and draws the next token from their softmax with
``np.random.default_rng(seed)``; the same arguments give the same tokens. ``top_k=1`` is
greedy decoding (the argmax at every step).
"""

from __future__ import annotations

import math

import numpy as np


def check_sampling(num_tokens, temperature, top_k, vocab_size: int) -> None:
    """Raise ValueError/TypeError naming a bad sampling argument and its valid range."""
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)) or num_tokens < 0:
        raise ValueError(f"num_tokens must be an integer >= 0, got {num_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.floating)) \
            or not math.isfinite(temperature) or temperature <= 0:
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r} "
                         "(top_k=1 gives greedy decoding)")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or not 0 <= top_k <= vocab_size:
        raise ValueError(f"top_k must be an integer in [0, {vocab_size}] (0: every token), got {top_k!r}")


def next_token_probs(logits: np.ndarray, temperature: float = 1.0, top_k: int = 0) -> np.ndarray:
    """Probabilities (V,) float64 of the next token from one position's logits (V,)."""
    z = np.asarray(logits, dtype=np.float64) / temperature                  # (V,)
    if 0 < top_k < z.size:
        kth = np.partition(z, z.size - top_k)[z.size - top_k]               # k-th largest
        z = np.where(z >= kth, z, -np.inf)
    z -= z.max()
    p = np.exp(z)
    return p / p.sum()


def generate(model, prompt, num_tokens: int, temperature: float = 1.0, top_k: int = 0,
             seed: int = 0, on_token=None) -> np.ndarray:
    """``prompt`` (1-D integer tokens, at least one) followed by ``num_tokens`` sampled tokens (int64).

    ``on_token(token)``, when given, is called with each sampled token as soon as it is drawn.
    """
    vocab, context = model.vocab_size, model.context_length
    check_sampling(num_tokens, temperature, top_k, vocab)
    tokens = np.asarray(prompt)
    if tokens.ndim != 1 or tokens.size == 0 or tokens.dtype.kind not in "iu":
        raise ValueError(f"prompt must be a non-empty 1-D array of integer tokens, got shape {tokens.shape} "
                         f"{tokens.dtype.name}")
    if tokens.min() < 0 or tokens.max() >= vocab:
        raise ValueError(f"prompt tokens must be in [0, {vocab - 1}] (the vocabulary), "
                         f"got {int(tokens.min())}..{int(tokens.max())}")
    rng = np.random.default_rng(seed)
    out = np.empty(tokens.size + num_tokens, dtype=np.int64)
    out[:tokens.size] = tokens
    for n in range(tokens.size, out.size):
        window = out[max(0, n - context):n][None]                          # (1, T)
        logits = model.forward(window)[0, -1]                              # (V,)
        p = next_token_probs(logits, temperature, top_k)
        out[n] = int(np.argmax(p)) if top_k == 1 else int(rng.choice(vocab, p=p))
        if on_token is not None:
            on_token(int(out[n]))
    return out
