"""A mixture-of-experts MLP: a learned router sends each token to its top-K of E expert MLPs.

``MoE(d_model, d_ff, num_experts, top_k)`` maps (..., T, d) -> (..., T, d). Each leading index
is one *group* of T tokens (a sequence of the GPT), and routing, capacity and the auxiliary loss
are computed per group, as GShard does, so the result for a sequence never depends on which
other sequences share its batch (data parallelism splits whole sequences and stays exact).

* Router: ``Linear(d, E, no bias)``; ``probs = softmax(logits)`` over all E experts.
* Top-K (the Switch/GShard convention): a token goes to its K largest logits (ties to the lower
  expert index); the gate of each chosen expert is its full-softmax probability, not
  renormalised over the K, so the router learns from the main loss even at K = 1.
* Capacity: each expert takes at most ``C = ceil(capacity_factor * K * T / E)`` tokens per
  group. Assignments are served first choices first, then second choices, each in token
  order; an assignment past C is dropped (the token gets nothing from that expert; a token with
  every choice dropped passes through the block's residual unchanged).
* Load-balancing loss (Switch Transformer's): per group ``E * sum_i f_i * P_i`` with ``f_i`` the
  fraction of its tokens whose first choice is expert i (before capacity) and ``P_i`` the mean
  router probability of expert i; ``aux_loss`` is ``aux_coef`` times its mean over groups.
  ``backward`` adds its gradient (as if added once to the training loss), so the optimizer sees it.

The experts run through ``dispatcher`` (``forward(experts, inputs)``, ``backward(experts, douts)``,
lists by global expert index): :class:`LocalExperts` runs them here; expert parallelism
(``npddp.parallel.model.experts``) swaps in one that moves tokens to the rank holding each expert.
"""

from __future__ import annotations

import math

import numpy as np

from npddp.nn._check import check_dtype_arg, check_positive_int
from npddp.nn.gelu import GELU
from npddp.nn.layers import Linear
from npddp.nn.module import Module, Sequential


class Experts(Module):
    """E expert MLPs ``Linear(d, d_ff), GELU, Linear(d_ff, d)`` named by global index ("0" .. "E-1")."""

    def __init__(self, num_experts: int, d_model: int, d_ff: int, *, dtype=np.float32, rng=None,
                 init_std: float | None = None, proj_std: float | None = None, gelu: str = "none"):
        super().__init__()
        for i in range(num_experts):
            setattr(self, str(i), Sequential(Linear(d_model, d_ff, dtype=dtype, rng=rng, init_std=init_std),
                                             GELU(gelu),
                                             Linear(d_ff, d_model, dtype=dtype, rng=rng, init_std=proj_std)))
        self.held = list(range(num_experts))   # global indices of the experts this process holds

    def keep(self, indices) -> None:
        """Hold only the experts ``indices`` (global); the others are dropped with their parameters."""
        indices = sorted(int(i) for i in indices)
        for i in self.held:
            if i not in indices:
                delattr(self, str(i))
        self.held = indices

    def __getitem__(self, i: int) -> Module:
        return getattr(self, str(i))


class LocalExperts:
    """Runs every expert in this process: ``inputs[e]`` (n_e, d) -> ``experts[e]``'s output."""

    def forward(self, experts: Experts, inputs: list) -> list:
        """Expert outputs, by global index."""
        return [experts[e].forward(x) for e, x in enumerate(inputs)]

    def backward(self, experts: Experts, douts: list) -> list:
        """Gradients of the expert inputs, by global index."""
        return [experts._backward_child(experts[e], d) for e, d in enumerate(douts)]


def capacity(capacity_factor: float, top_k: int, tokens: int, num_experts: int) -> int:
    """Tokens an expert takes per group of ``tokens``: ``ceil(capacity_factor * top_k * tokens / num_experts)``."""
    return math.ceil(capacity_factor * top_k * tokens / num_experts)


def route(logits: np.ndarray, top_k: int, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """``(choice, kept)`` for logits (G, T, E): the top-K experts (G, T, K) and which assignments fit."""
    g, t, e = logits.shape
    choice = np.argsort(-logits, axis=-1, kind="stable")[..., :top_k]   # (G, T, K)
    order = choice.transpose(0, 2, 1).reshape(g, top_k * t)             # (G, K*T): first choices first
    onehot = order[..., None] == np.arange(e)                           # (G, K*T, E)
    position = np.take_along_axis(np.cumsum(onehot, axis=1), order[..., None], axis=2)[..., 0]
    kept = (position <= cap).reshape(g, top_k, t).transpose(0, 2, 1)   # (G, T, K)
    return choice, kept


class MoE(Module):
    """Top-K mixture of ``num_experts`` MLPs with capacity and a load-balancing loss; see the module docstring."""

    def __init__(self, d_model: int, d_ff: int, num_experts: int, top_k: int = 1, *,
                 capacity_factor: float = 1.25, aux_coef: float = 0.01, dtype=np.float32, rng=None,
                 init_std: float | None = None, proj_std: float | None = None, gelu: str = "none"):
        super().__init__()
        self.d_model = check_positive_int("d_model", d_model)
        self.num_experts = check_positive_int("num_experts", num_experts)
        self.top_k = check_positive_int("top_k", top_k)
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k must be in [1, {num_experts}] (num_experts), got {top_k}")
        if not capacity_factor > 0:
            raise ValueError(f"capacity_factor must be > 0, got {capacity_factor!r}")
        if not aux_coef >= 0:
            raise ValueError(f"aux_coef must be >= 0, got {aux_coef!r}")
        self.capacity_factor, self.aux_coef = float(capacity_factor), float(aux_coef)
        dtype = check_dtype_arg(dtype)
        self.router = Linear(d_model, num_experts, bias=False, dtype=dtype, rng=rng, init_std=init_std)
        self.experts = Experts(num_experts, d_model, d_ff, dtype=dtype, rng=rng, init_std=init_std,
                               proj_std=proj_std, gelu=gelu)
        self.dispatcher = LocalExperts()
        self.aux_loss = 0.0        # of the latest forward
        self.dropped = 0           # assignments dropped by capacity in the latest forward
        self._saved = None

    def forward(self, x: np.ndarray) -> np.ndarray:
        if not isinstance(x, np.ndarray) or x.ndim < 2 or x.shape[-1] != self.d_model:
            got = x.shape if isinstance(x, np.ndarray) else type(x).__name__
            raise ValueError(f"MoE: expected (..., T, {self.d_model}), got {got}")
        t, e = x.shape[-2], self.num_experts
        x2 = x.reshape(-1, self.d_model)                                    # (N, d)
        logits = self.router.forward(x).reshape(-1, t, e)                  # (G, T, E)
        z = logits - logits.max(axis=-1, keepdims=True)
        probs = np.exp(z)
        probs /= probs.sum(axis=-1, keepdims=True)                          # (G, T, E)
        choice, kept = route(logits, self.top_k, capacity(self.capacity_factor, self.top_k, t, e))
        g = logits.shape[0]
        frac = np.zeros((g, e))                                             # f: first choices per group
        np.add.at(frac, (np.repeat(np.arange(g), t), choice[..., 0].reshape(-1)), 1.0 / t)
        self.aux_loss = self.aux_coef * e * float(np.mean(np.sum(frac * probs.mean(axis=1), axis=-1)))
        self.dropped = int(kept.size - kept.sum())
        token, slot = np.nonzero(kept.reshape(-1, self.top_k))              # (b, t) order, then k
        expert = choice.reshape(-1, self.top_k)[token, slot]
        rows = [token[expert == i] for i in range(e)]                       # per expert, token order
        flat_probs = probs.reshape(-1, e)
        gates = [flat_probs[r, i] for i, r in enumerate(rows)]
        outs = self.dispatcher.forward(self.experts, [x2[r] for r in rows])
        y = np.zeros_like(x2)
        for r, gate, out in zip(rows, gates, outs):
            y[r] += gate[:, None] * out
        if self.grad_enabled:
            self._saved = (x.shape, probs, frac, rows, gates, outs)
        return y.reshape(x.shape)

    def backward(self, dout: np.ndarray) -> np.ndarray:
        if self._saved is None:
            raise RuntimeError("MoE.backward called without a forward that kept its inputs")
        shape, probs, frac, rows, gates, outs = self._saved
        g, t, e = probs.shape
        d2 = dout.reshape(-1, self.d_model)
        dprobs = np.zeros((g * t, e))
        for i, (r, out) in enumerate(zip(rows, outs)):
            dprobs[r, i] = np.einsum("nd,nd->n", d2[r], out)
        dxs = self.dispatcher.backward(self.experts, [gate[:, None] * d2[r] for r, gate in zip(rows, gates)])
        dx = np.zeros_like(d2)
        for r, d in zip(rows, dxs):
            dx[r] += d
        dprobs = dprobs.reshape(g, t, e) + self.aux_coef * e / (g * t) * frac[:, None, :]
        dlogits = probs * (dprobs - np.sum(dprobs * probs, axis=-1, keepdims=True))
        dx += self._backward_child(self.router, dlogits.astype(d2.dtype).reshape(shape[:-1] + (e,))
                                   ).reshape(dx.shape)
        return dx.reshape(shape)

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, top_k={self.top_k}, capacity_factor={self.capacity_factor}, "
                f"aux_coef={self.aux_coef}")
