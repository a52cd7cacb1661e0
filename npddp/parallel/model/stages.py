"""A model cut into pipeline stages, balanced by parameter count.

A model is first read as a chain of units: an MLP ``Sequential``'s layers, or a GPT's
embeddings (token + position), its blocks, and its head (final LayerNorm + output projection).
The chain is cut into ``K`` contiguous, non-empty stretches so that the largest stretch holds
as few parameters as possible (parameters stand in for compute: a Linear's work is
proportional to its weights); every rank computes the same cut. ``pipeline_stage`` keeps the
units of one stage, which keep their original parameters, so ``original_names`` maps a
stage's parameter names back to the full model's.

Tied weights: a GPT's head shares the token embedding. When both land on one stage they stay
one Parameter; otherwise the last stage's head gets a copy of its own (same initial values)
and the stage's ``tied`` names it: after backward the first and last stage exchange the two
gradients and both add them (a + b equals b + a bit for bit), so both copies step alike.
"""

from __future__ import annotations

import numpy as np

from npddp.nn.gpt import GPT
from npddp.nn.layers import Linear
from npddp.nn.module import Module, Sequential
from npddp.nn.parameter import Parameter


class GPTEmbedding(Module):
    """A GPT's input end: token embedding plus position embedding; (B, T) tokens -> (B, T, d)."""

    def __init__(self, gpt: GPT):
        super().__init__()
        self.tok_emb, self.pos_emb = gpt.tok_emb, gpt.pos_emb
        self.context_length = gpt.context_length
        self._positions = np.arange(gpt.context_length)

    def forward(self, idx):
        if not isinstance(idx, np.ndarray) or idx.ndim != 2 or idx.dtype.kind not in "iu":
            got = f"{idx.shape} {idx.dtype.name}" if isinstance(idx, np.ndarray) else type(idx).__name__
            raise ValueError(f"GPT: expected integer tokens of shape (B, T), got {got}")
        if not 1 <= idx.shape[1] <= self.context_length:
            raise ValueError(f"GPT: sequence length T must be in [1, {self.context_length}] "
                             f"(the context length), got {idx.shape[1]}")
        x = self.tok_emb.forward(idx)                                   # (B, T, d)
        x += self.pos_emb.forward(self._positions[:idx.shape[1]])       # (T, d) broadcast over B
        return x

    def backward(self, dout):
        self._backward_child(self.pos_emb, dout.sum(axis=0))
        self._backward_child(self.tok_emb, dout)
        return None


class GPTHead(Module):
    """A GPT's output end: final LayerNorm and the LM head; (B, T, d) -> logits (B, T, V)."""

    def __init__(self, gpt: GPT, head: Linear):
        super().__init__()
        self.ln_f, self.head = gpt.ln_f, head

    def forward(self, x):
        return self.head.forward(self.ln_f.forward(x))

    def backward(self, dout):
        return self._backward_child(self.ln_f, self._backward_child(self.head, dout))


def units(model: Module) -> list[tuple[str, Module]]:
    """The chain a pipeline cuts: (name, module) in forward order."""
    if isinstance(model, GPT):
        return ([("embedding", GPTEmbedding(model))] + [(f"blocks.{i}", b) for i, b in enumerate(model.blocks.layers)]
                + [("head", GPTHead(model, model.head))])
    if isinstance(model, Sequential):
        return [(str(i), layer) for i, layer in enumerate(model.layers)]
    raise ValueError(f"pipeline: expected a Sequential or a GPT, got {type(model).__name__}")


def balanced_cut(counts: list[int], stages: int) -> list[int]:
    """Start index of each of ``stages`` contiguous parts of ``counts``, each holding parameters,
    minimising the largest sum (ties: the earliest cuts)."""
    n, holding = len(counts), sum(1 for c in counts if c > 0)
    if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= max(holding, 1):
        raise ValueError(f"cannot cut a chain of {n} layers, {holding} of them with parameters, into "
                         f"{stages!r} pipeline stages; stages must be an integer in [1, {max(holding, 1)}]")
    prefix = np.concatenate([[0], np.cumsum(counts)])
    best = {(0, 0): (0, 0)}                    # (stages used, units used) -> (largest part, previous cut)
    for k in range(1, stages + 1):
        for j in range(k, n + 1):
            options = [(max(best[(k - 1, i)][0], prefix[j] - prefix[i]), i) for i in range(k - 1, j)
                       if (k - 1, i) in best and (prefix[j] > prefix[i] or stages == 1)]
            if options:
                best[(k, j)] = min(options)
    starts, j = [], n
    for k in range(stages, 0, -1):
        j = best[(k, j)][1]
        starts.append(j)
    return starts[::-1]


class PipelineStage(Module):
    """Stage ``stage`` of ``stages``: its units run in order; see the module docstring."""

    def __init__(self, model: Module, stages: int, stage: int):
        super().__init__()
        chain = units(model)
        starts = balanced_cut([m.num_parameters() for _, m in chain], stages)
        if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < stages:
            raise ValueError(f"stage must be an integer in [0, {stages}), got {stage!r}")
        stop = starts[stage + 1] if stage + 1 < stages else len(chain)
        names = {id(p): n for n, p in model.named_parameters()}
        self.stage, self.stages = stage, stages
        self.tied: Parameter | None = None
        mine = chain[starts[stage]:stop]
        if isinstance(model, GPT) and model.config["tie_weights"] and stages > 1:
            if stage == stages - 1:           # the head's own copy of the token embedding
                head = model.head
                copy = Linear(head.in_features, head.out_features, bias=False, dtype=head.dtype,
                              weight=Parameter(head.weight.data.copy()))
                names[id(copy.weight)] = names[id(head.weight)]
                mine[-1] = ("head", GPTHead(model, copy))
                self.tied = copy.weight
            if stage == 0:
                self.tied = model.tok_emb.weight
        self.units = [m for _, m in mine]      # a plain list: Module walks the attributes below
        for name, unit in mine:
            setattr(self, name, unit)
        self._original = {n: names[id(p)] for n, p in self.named_parameters()}

    def original_names(self) -> dict[str, str]:
        """This stage's parameter names -> the full model's names for the same parameters."""
        return dict(self._original)

    def forward(self, x):
        for unit in self.units:
            x = unit.forward(x)
        return x

    def backward(self, dout):
        for unit in reversed(self.units):
            dout = self._backward_child(unit, dout)
        return dout
