"""``tensor_parallel(model, comm)``: an nn MLP or GPT turned into its tensor-parallel form over ``comm``.

* MLP (a ``Sequential`` of ``Linear`` and elementwise layers, as :func:`npddp.nn.mlp` builds):
  Linear layers are paired in order, the first of each pair column-parallel, the second
  row-parallel; what lies between (ReLU, Tanh, GELU, Dropout) runs on the split activation
  (a Dropout as :class:`SplitDropout`, so its mask is the one process's). An odd last Linear
  stays whole on every rank: its input is the full activation the row layer's all-reduce gave.
* GPT (:class:`npddp.nn.gpt.GPT`): in every block, attention heads split across the group
  (:class:`HeadParallelAttention`) and the MLP column/row. The token and position embeddings,
  the LayerNorms and the output head (tied to the token embedding) stay replicated: their
  inputs and the gradients reaching them are the same bits on every rank (every split
  stretch ends in an all-reduce, whose result is bit-identical everywhere), so each rank
  computes the same gradient for them and no extra all-reduce is needed. A vocabulary-
  parallel head would save memory for large vocabularies but needs a parallel
  cross-entropy; replicated is simpler and exact.

Every check runs before anything is built or sent: a size not divisible by the group's size
is one ValueError naming it. The model passed in is consumed (replicated layers move into the
result, the GPT is changed in place); use the returned model.
"""

from __future__ import annotations

from npddp.nn.attention import CausalSelfAttention
from npddp.nn.dropout import Dropout
from npddp.nn.gelu import GELU
from npddp.nn.gpt import GPT
from npddp.nn.layers import Linear, ReLU, Tanh
from npddp.nn.module import Module, Sequential
from npddp.parallel.model.attention import HeadParallelAttention
from npddp.parallel.model.sequence import sequence_parallel
from npddp.parallel.model.tensor import (ColumnParallelLinear, RowParallelLinear, SplitDropout, block,
                                         check_divisible)

ELEMENTWISE = (ReLU, Tanh, GELU, Dropout)


def _mlp_plan(net: Sequential, tp: int, where: str) -> list[str]:
    """For each layer: ``column``, ``row``, ``split`` (between a pair) or ``whole``; ValueError if it cannot split."""
    plan, open_pair = [], None
    for i, layer in enumerate(net.layers):
        name = f"{where}{i}"
        if isinstance(layer, Linear):
            if open_pair is None and any(isinstance(m, Linear) for m in net.layers[i + 1:]):
                check_divisible(f"layer {name!r} (Linear {layer.in_features} -> {layer.out_features}): out_features",
                                layer.out_features, tp)        # a layer's name such as '0' alone reads as a count
                plan.append("column")
                open_pair = layer
            elif open_pair is not None:
                plan.append("row")
                open_pair = None
            else:
                plan.append("whole")
        elif isinstance(layer, ELEMENTWISE):
            plan.append("split" if open_pair is not None else "whole")
        else:
            raise ValueError(f"tensor_parallel: layer {name} is {type(layer).__name__}; an MLP for tensor "
                             f"parallelism holds only Linear, {', '.join(t.__name__ for t in ELEMENTWISE)}")
    return plan


def _split_mlp(net: Sequential, plan: list[str], comm, tracer) -> Sequential:
    """The layers of ``net`` following ``plan``."""
    layers, width = [], 0
    for layer, how in zip(net.layers, plan):
        if how == "column":
            layers.append(ColumnParallelLinear(layer, comm, tracer=tracer))
            width = layer.out_features
        elif how == "row":
            layers.append(RowParallelLinear(layer, comm, tracer=tracer))
        elif how == "split" and isinstance(layer, Dropout):
            layers.append(SplitDropout(layer, block(width, comm.rank, comm.size), width))
        else:
            layers.append(layer)
    return Sequential(*layers)


def tensor_parallel(model: Module, comm, tracer=None, sequence: bool = False) -> Module:
    """The tensor-parallel form of ``model`` (MLP Sequential or GPT) over the tensor group ``comm``;
    ``sequence``: a GPT's LayerNorm regions split along the sequence too (:mod:`npddp.parallel.model.sequence`)."""
    tp = comm.size
    if sequence and not isinstance(model, GPT):
        raise ValueError(f"sequence parallelism splits a GPT's sequence, got {type(model).__name__}")
    if isinstance(model, GPT):
        cfg = model.config
        check_divisible("num_heads", cfg["num_heads"], tp)
        check_divisible("d_ff", cfg["d_ff"], tp)
        for blk in model.blocks.layers:
            if not isinstance(blk.attn, CausalSelfAttention):
                raise ValueError("tensor_parallel: this GPT is split already")
        plans = [_mlp_plan(blk.mlp, tp, "mlp.") for blk in model.blocks.layers]
        for blk, plan in zip(model.blocks.layers, plans):
            blk.attn = HeadParallelAttention(blk.attn, comm, tracer)
            blk.mlp = _split_mlp(blk.mlp, plan, comm, tracer)
        return sequence_parallel(model, comm, tracer) if sequence else model
    if isinstance(model, Sequential):
        return _split_mlp(model, _mlp_plan(model, tp, ""), comm, tracer)
    raise ValueError(f"tensor_parallel: expected an MLP Sequential or a GPT, got {type(model).__name__}")
