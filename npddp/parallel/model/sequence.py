"""Sequence parallelism (Megatron-LM style) for a tensor-parallel GPT: the replicated regions split along T.

Plain tensor parallelism leaves every rank of the tensor group holding the whole (B, T, d)
activation between the split layers: LayerNorms and residual additions are computed ``tp``
times over. With sequence parallelism rank ``r`` holds only block ``r`` of the sequence there
(positions ``r*T/tp .. (r+1)*T/tp - 1``; ``T`` must divide by ``tp``), and the two conjugate
operators of tensor parallelism become an all-gather / reduce-scatter pair:

* before each column-parallel layer (attention's ``qkv``, the MLP's first Linear):
  all-gather of the sequence forward, reduce-scatter of dL/dx backward (:class:`GatherSequence`);
* after each row-parallel layer (attention's ``proj``, the MLP's second Linear):
  reduce-scatter of the partial sums forward (instead of the all-reduce), all-gather of
  dL/dy backward (:class:`ScatterSequence`).

The bytes moved are those of plain tensor parallelism (an all-reduce is a reduce-scatter and
an all-gather); the activation memory of the LayerNorm and residual regions is divided by
``tp``. Parameters used on a sequence block only (every LayerNorm's, the row-parallel
layers' biases) see a part of the rows: their gradients are all-reduced over the tensor group
inside their own backward, so a gradient hook sees the final value. The first block takes its
sequence block of the (replicated) embedding output, its backward all-gathers dL/dx; the final
LayerNorm all-gathers its input, so the output head stays replicated.
"""

from __future__ import annotations

import numpy as np

from npddp.nn.gpt import Block
from npddp.nn.module import Module
from npddp.nn.norm import LayerNorm
from npddp.parallel.model.tensor import AddBias, ColumnParallelLinear, RowParallelLinear, TracedCollective


def _block_length(comm, t: int) -> int:
    """``t / tp``; ValueError naming ``t`` unless the sequence splits evenly (raised before any message)."""
    if t % comm.size:
        raise ValueError(f"sequence parallelism: sequence length {t} is not divisible by the tensor-parallel "
                         f"size {comm.size}; use a length that is a multiple of {comm.size}")
    return t // comm.size


def own_block(comm, x: np.ndarray) -> np.ndarray:
    """This rank's block of the sequence axis (1) of ``x`` (B, T, ...), a copy."""
    n = _block_length(comm, x.shape[1])
    return x[:, comm.rank * n:(comm.rank + 1) * n].copy()


def gathered(gather: TracedCollective, x: np.ndarray) -> np.ndarray:
    """(B, T/tp, ...) blocks of every rank -> (B, T, ...), ranks in order along the sequence."""
    parts = gather(np.ascontiguousarray(x))                      # (tp, B, T/tp, ...)
    return np.concatenate(list(parts), axis=1)


def scattered(reduce: TracedCollective, comm, x: np.ndarray) -> np.ndarray:
    """(B, T, ...) partial sums -> this rank's (B, T/tp, ...) block of their sum over the group."""
    n = _block_length(comm, x.shape[1])
    seq_first = np.ascontiguousarray(np.moveaxis(x, 1, 0))       # (T, B, ...): block r of the ravel is block r of T
    part = reduce(seq_first).reshape((n,) + seq_first.shape[1:])
    return np.ascontiguousarray(np.moveaxis(part, 0, 1))


class GatherSequence(Module):
    """Before a column-parallel layer: all-gather of the sequence forward, reduce-scatter of dL/dx backward."""

    def __init__(self, comm, tracer=None):
        super().__init__()
        self.comm = comm
        self.gather = TracedCollective(comm, tracer, "sequence-parallel all-gather (forward)", "allgather")
        self.reduce = TracedCollective(comm, tracer, "sequence-parallel reduce-scatter (backward)", "reduce_scatter")

    def forward(self, x):
        return gathered(self.gather, x)

    def backward(self, dout):
        return None if dout is None else scattered(self.reduce, self.comm, dout)


class ScatterSequence(Module):
    """After a row-parallel layer: reduce-scatter of the partial sums forward, all-gather of dL/dy backward."""

    def __init__(self, comm, tracer=None):
        super().__init__()
        self.comm = comm
        self.reduce = TracedCollective(comm, tracer, "sequence-parallel reduce-scatter (forward)", "reduce_scatter")
        self.gather = TracedCollective(comm, tracer, "sequence-parallel all-gather (backward)", "allgather")

    def forward(self, x):
        return scattered(self.reduce, self.comm, x)

    def backward(self, dout):
        return gathered(self.gather, dout)


def _summed_over_group(params, allreduce: TracedCollective, run):
    """``run()`` with ``params``' gradients written into fresh buffers, all-reduced as one, then added to theirs."""
    saved = [(p, *p.grad_to_write()) for p in params]
    for p in params:
        p.grad = np.zeros_like(p.data)
    out = run()
    flat = allreduce(np.concatenate([p.grad.ravel() for p in params]))
    at = 0
    for p, grad, overwrite in saved:
        part = flat[at:at + p.data.size].reshape(p.data.shape)
        at += p.data.size
        if overwrite:
            np.copyto(grad, part)
        else:
            grad += part
        p.grad = grad
    return out


class SequenceLayerNorm(LayerNorm):
    """A LayerNorm on a sequence block: its parameters' gradients are summed over the tensor group.

    ``gather_input``: all-gather the sequence before normalising (forward) and keep this rank's
    block of dL/dx (backward): the final LayerNorm, whose output feeds the replicated head.
    """

    def __init__(self, norm: LayerNorm, comm, tracer=None, gather_input: bool = False):
        Module.__init__(self)
        self.d, self.eps, self.dtype = norm.d, norm.eps, norm.dtype
        self.weight, self.bias = norm.weight, norm.bias            # the same Parameters: names and values kept
        self._xhat = self._rstd = None
        self.comm, self.gather_input = comm, gather_input
        self.allreduce = TracedCollective(comm, tracer, "sequence-parallel LayerNorm gradient all-reduce", "allreduce")
        self.gather = TracedCollective(comm, tracer, "sequence-parallel all-gather (final LayerNorm)", "allgather")

    def forward(self, x):
        if self.gather_input:
            x = gathered(self.gather, x)
        return super().forward(x)

    def backward(self, dout):
        if self.gather_input:          # the input was the whole sequence: every rank has the full gradient
            return own_block(self.comm, super().backward(dout))
        return _summed_over_group([self.weight, self.bias], self.allreduce, lambda: super(SequenceLayerNorm, self)
                                  .backward(dout))


class SequenceAddBias(AddBias):
    """A row-parallel layer's bias added on a sequence block; its gradient summed over the tensor group."""

    def __init__(self, add: AddBias, comm, tracer=None):
        super().__init__(add.bias)
        self.allreduce = TracedCollective(comm, tracer, "sequence-parallel bias gradient all-reduce", "allreduce")

    def backward(self, dout):
        return _summed_over_group([self.bias], self.allreduce, lambda: super(SequenceAddBias, self).backward(dout))


class SequenceParallelBlock(Block):
    """A tensor-parallel Block run on a sequence block; the first one takes its block of the embedding output."""

    def __init__(self, block: Block, comm, tracer=None, first: bool = False):
        Module.__init__(self)
        self.ln1 = SequenceLayerNorm(block.ln1, comm, tracer)
        self.attn = block.attn
        self.ln2 = SequenceLayerNorm(block.ln2, comm, tracer)
        self.mlp = block.mlp
        self.comm, self.first = comm, first
        self.gather = TracedCollective(comm, tracer, "sequence-parallel all-gather (embedding gradient)", "allgather")
        for _, m in list(self.attn.named_modules()) + list(self.mlp.named_modules()):
            if isinstance(m, ColumnParallelLinear):
                m.enter = GatherSequence(comm, tracer)
            elif isinstance(m, RowParallelLinear):
                m.reduce = ScatterSequence(comm, tracer)
                if m.add_bias is not None:
                    m.add_bias = SequenceAddBias(m.add_bias, comm, tracer)

    def forward(self, x):
        return super().forward(own_block(self.comm, x) if self.first else x)

    def backward(self, dout):
        dx = super().backward(dout)
        return gathered(self.gather, dx) if self.first else dx


def sequence_parallel(model, comm, tracer=None):
    """A tensor-parallel GPT (from :func:`tensor_parallel`) changed in place to run sequence-parallel over ``comm``."""
    blocks = model.blocks.layers
    for i, blk in enumerate(blocks):
        blocks[i] = SequenceParallelBlock(blk, comm, tracer, first=i == 0)
        setattr(model.blocks, str(i), blocks[i])
    model.ln_f = SequenceLayerNorm(model.ln_f, comm, tracer, gather_input=True)
    return model
