"""A GPT-style decoder-only Transformer language model: pre-norm blocks, learned positions, tied head.

``gpt(vocab_size, context_length, d_model, num_layers, num_heads, d_ff)`` builds::

    tokens (B, T) int -> tok_emb (B, T, d) + pos_emb (T, d)
      -> num_layers x Block: x + attn(ln1(x)); x + mlp(ln2(x)), mlp = Linear(d, d_ff), GELU, Linear(d_ff, d)
      -> ln_f -> head: Linear(d, V, no bias) -> logits (B, T, V)

With ``tie_weights=True`` (the default) ``head.weight`` *is* ``tok_emb.weight``: one
Parameter used by two layers, listed once by ``named_parameters`` (as ``tok_emb.weight``),
whose gradient is the sum of both layers' contributions and so is final only after the
embedding's backward, the last one. Initial weights follow GPT-2: N(0, 0.02) for embeddings
and linear layers, N(0, 0.02 / sqrt(2 num_layers)) for the two projections that feed the
residual stream, zero biases, LayerNorm weight 1; all drawn from one
``np.random.default_rng(seed)`` in layer order, so every rank builds the same model.

``PRESETS`` names the sizes the DDP coursework uses (``tiny`` is for tests); ``gpt_preset``
builds one and ``gpt_num_parameters`` counts without building.
"""

from __future__ import annotations

import math

import numpy as np

from npddp.nn._check import check_dtype_arg, check_positive_int
from npddp.nn.attention import CausalSelfAttention
from npddp.nn.embedding import Embedding
from npddp.nn.gelu import GELU
from npddp.nn.layers import Linear
from npddp.nn.module import Module, Sequential
from npddp.nn.moe import MoE
from npddp.nn.norm import LayerNorm

#: name -> (d_model, d_ff, num_layers, num_heads)
PRESETS = {
    "tiny": (64, 256, 2, 4),
    "small": (768, 3072, 12, 12),
    "medium": (1024, 4096, 24, 16),
    "large": (1280, 5120, 36, 20),
    "xl": (1600, 6400, 48, 25),
    "2.7B": (2560, 10240, 32, 32),
}
INIT_STD = 0.02


class Block(Module):
    """Pre-norm Transformer block: ``x + attn(ln1(x))``, then ``h + mlp(ln2(h))``; (B, T, d) -> (B, T, d)."""

    def __init__(self, d_model: int, num_heads: int, d_ff: int, *, dtype=np.float32, rng=None,
                 init_std: float | None = INIT_STD, proj_std: float | None = None,
                 gelu: str = "none", moe: dict | None = None):
        super().__init__()
        proj_std = init_std if proj_std is None else proj_std
        self.ln1 = LayerNorm(d_model, dtype=dtype)
        self.attn = CausalSelfAttention(d_model, num_heads, dtype=dtype, rng=rng, init_std=init_std,
                                        proj_std=proj_std)
        self.ln2 = LayerNorm(d_model, dtype=dtype)
        if moe:   # a mixture of experts in the MLP's place: {"num_experts", "top_k", ...} (see MoE)
            self.mlp = MoE(d_model, d_ff, **moe, dtype=dtype, rng=rng, init_std=init_std, proj_std=proj_std,
                           gelu=gelu)
        else:
            self.mlp = Sequential(Linear(d_model, d_ff, dtype=dtype, rng=rng, init_std=init_std),
                                  GELU(gelu),
                                  Linear(d_ff, d_model, dtype=dtype, rng=rng, init_std=proj_std))

    def forward(self, x: np.ndarray) -> np.ndarray:
        h = self.attn.forward(self.ln1.forward(x))             # (B, T, d)
        h += x                                                 # residual
        out = self.mlp.forward(self.ln2.forward(h))            # (B, T, d)
        out += h                                               # residual
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        dh = self._backward_child(self.ln2, self._backward_child(self.mlp, dout))  # (B, T, d)
        dh += dout
        dx = self._backward_child(self.ln1, self._backward_child(self.attn, dh))   # (B, T, d)
        dx += dh
        return dx


class GPT(Module):
    """Token and position embeddings, ``num_layers`` Blocks, final LayerNorm and the LM head."""

    def __init__(self, vocab_size: int, context_length: int, d_model: int, num_layers: int,
                 num_heads: int, d_ff: int, *, dtype=np.float32, seed: int = 0,
                 tie_weights: bool = True, gelu: str = "none", moe: dict | None = None):
        super().__init__()
        self.vocab_size = check_positive_int("vocab_size", vocab_size)
        self.context_length = check_positive_int("context_length", context_length)
        d_model = check_positive_int("d_model", d_model)
        num_layers = check_positive_int("num_layers", num_layers)
        num_heads = check_positive_int("num_heads", num_heads)
        d_ff = check_positive_int("d_ff", d_ff)
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} must be a multiple of num_heads {num_heads}")
        dtype = check_dtype_arg(dtype)
        self.config = {"vocab_size": vocab_size, "context_length": context_length, "d_model": d_model,
                       "num_layers": num_layers, "num_heads": num_heads, "d_ff": d_ff,
                       "tie_weights": bool(tie_weights), "gelu": gelu}
        if moe:
            self.config["moe"] = dict(moe)
        rng = np.random.default_rng(seed)
        proj_std = INIT_STD / math.sqrt(2 * num_layers)
        self.tok_emb = Embedding(vocab_size, d_model, dtype=dtype, rng=rng, init_std=INIT_STD)
        self.pos_emb = Embedding(context_length, d_model, dtype=dtype, rng=rng, init_std=INIT_STD)
        self.blocks = Sequential(*[Block(d_model, num_heads, d_ff, dtype=dtype, rng=rng, init_std=INIT_STD,
                                         proj_std=proj_std, gelu=gelu, moe=moe) for _ in range(num_layers)])
        self.ln_f = LayerNorm(d_model, dtype=dtype)
        self.head = Linear(d_model, vocab_size, bias=False, dtype=dtype, rng=rng, init_std=INIT_STD,
                           weight=self.tok_emb.weight if tie_weights else None)
        self._positions = np.arange(context_length)            # (context_length,)

    def forward(self, idx: np.ndarray) -> np.ndarray:
        if not isinstance(idx, np.ndarray) or idx.ndim != 2 or idx.dtype.kind not in "iu":
            got = f"{idx.shape} {idx.dtype.name}" if isinstance(idx, np.ndarray) else type(idx).__name__
            raise ValueError(f"GPT: expected integer tokens of shape (B, T), got {got}")
        t = idx.shape[1]
        if not 1 <= t <= self.context_length:
            raise ValueError(f"GPT: sequence length T must be in [1, {self.context_length}] "
                             f"(the context length), got {t}")
        x = self.tok_emb.forward(idx)                          # (B, T, d)
        x += self.pos_emb.forward(self._positions[:t])         # (T, d) broadcast over B
        x = self.blocks.forward(x)                             # (B, T, d)
        return self.head.forward(self.ln_f.forward(x))         # (B, T, V)

    def backward(self, dout: np.ndarray) -> None:
        """Gradients of every parameter from dL/dlogits (B, T, V); tokens have none, so returns None."""
        d = self._backward_child(self.head, dout)              # (B, T, d)
        d = self._backward_child(self.ln_f, d)
        d = self._backward_child(self.blocks, d)
        self._backward_child(self.pos_emb, d.sum(axis=0))      # (T, d)
        self._backward_child(self.tok_emb, d)
        return None


def gpt(vocab_size: int, context_length: int, d_model: int, num_layers: int, num_heads: int, d_ff: int,
        *, dtype=np.float32, seed: int = 0, tie_weights: bool = True, gelu: str = "none",
        moe: dict | None = None) -> GPT:
    """A GPT language model returning logits (B, T, V) for tokens (B, T); see the module docstring.

    ``moe={"num_experts": E, "top_k": K, ...}`` puts a :class:`~npddp.nn.moe.MoE` in every block's MLP place.
    """
    return GPT(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, dtype=dtype, seed=seed,
               tie_weights=tie_weights, gelu=gelu, moe=moe)


def preset(name: str) -> dict:
    """The architecture of preset ``name`` as gpt() keyword arguments; ValueError naming the valid ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown GPT size {name!r}; valid: {', '.join(PRESETS)}")
    d_model, d_ff, num_layers, num_heads = PRESETS[name]
    return {"d_model": d_model, "d_ff": d_ff, "num_layers": num_layers, "num_heads": num_heads}


def gpt_preset(name: str, vocab_size: int, context_length: int, **kwargs) -> GPT:
    """``gpt`` at the size called ``name`` (see ``PRESETS``)."""
    return gpt(vocab_size, context_length, **preset(name), **kwargs)


def gpt_num_parameters(vocab_size: int, context_length: int, d_model: int, num_layers: int,
                       num_heads: int, d_ff: int, tie_weights: bool = True) -> int:
    """Parameters ``gpt`` would hold with these arguments (shared ones counted once)."""
    del num_heads  # heads split d_model; they add no parameters
    d = d_model
    block = 4 * d + (3 * d * d + 3 * d) + (d * d + d) + (d * d_ff + d_ff) + (d_ff * d + d)
    head = 0 if tie_weights else vocab_size * d
    return vocab_size * d + context_length * d + num_layers * block + 2 * d + head
