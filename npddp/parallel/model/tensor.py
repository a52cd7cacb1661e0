"""Tensor parallelism (Megatron-LM style): linear layers split across a tensor group, exact.

Two conjugate operators carry all the communication, each a Module over the group's
Communicator (so any backend carries them, and a tracer shows them on the comm track):

* ``CopyToGroup`` (f): identity forward; backward all-reduces dL/dx (each rank holds a part).
* ``ReduceFromGroup`` (g): all-reduce forward (each rank holds a partial sum); identity backward.

``ColumnParallelLinear`` holds a block of the output rows of a full ``Linear`` (f before it);
``RowParallelLinear`` holds the matching block of input columns, sums the partial products with
g and then adds the full bias once. A column layer followed by elementwise layers and a row
layer needs two all-reduces per step (one forward, one backward) whatever lies between.

Both are built FROM a full ``nn.Linear``: every rank of the group slices the same initial
weights, so the split model computes what the full one does. Their parameters are new arrays
(shards, with their own ``.grad``) named as the full layer's (``weight``, ``bias``), so a
tensor-parallel model's ``named_parameters`` carries the original names; :func:`shard_indices`
says which rows or columns of the original each shard is.
"""

from __future__ import annotations

import numpy as np

from npddp.nn.layers import Linear
from npddp.nn.module import Module
from npddp.nn.parameter import Parameter
from npddp.util import tracing


class TracedCollective:
    """One collective of a group (``comm.<call>``), recorded on the tracer's comm track under ``label``, one event
    name per size."""

    __slots__ = ("comm", "tracer", "label", "events", "call")

    def __init__(self, comm, tracer, label: str, call: str = "allreduce"):
        self.comm, self.label, self.call = comm, label, call   # the method is looked up per call: a layout check
        # builds the layers over a stand-in group that has no collectives
        self.tracer = tracing.NULL if tracer is None else tracer
        self.events: dict[int, int] = {}     # bytes -> event id (a layer's buffer has one size per micro-batch shape)

    def __call__(self, buf: np.ndarray) -> np.ndarray:
        t0 = self.tracer.clock()
        out = getattr(self.comm, self.call)(buf)
        event = self.events.get(buf.nbytes)
        if event is None:
            event = self.events[buf.nbytes] = self.tracer.name(
                self.label, backend=self.comm.name, group_size=self.comm.size, bytes=buf.nbytes)
        self.tracer.add(t0, event, tracing.COMM)
        return out


class CopyToGroup(Module):
    """f: identity forward, all-reduce of dL/dx backward (None passes through: a data input)."""

    def __init__(self, comm, tracer=None):
        super().__init__()
        self.allreduce = TracedCollective(comm, tracer, "tensor-parallel all-reduce (backward)")

    def forward(self, x: np.ndarray) -> np.ndarray:
        return x

    def backward(self, dout: np.ndarray | None) -> np.ndarray | None:
        if dout is None:
            return None
        return self.allreduce(np.ascontiguousarray(dout))


class ReduceFromGroup(Module):
    """g: all-reduce forward (partial sums to the full value on every rank), identity backward."""

    def __init__(self, comm, tracer=None):
        super().__init__()
        self.allreduce = TracedCollective(comm, tracer, "tensor-parallel all-reduce (forward)")

    def forward(self, x: np.ndarray) -> np.ndarray:
        return self.allreduce(np.ascontiguousarray(x))

    def backward(self, dout: np.ndarray) -> np.ndarray:
        return dout


def block(size: int, rank: int, parts: int) -> np.ndarray:
    """Indices of block ``rank`` of ``parts`` equal blocks of ``range(size)``."""
    step = size // parts
    return np.arange(rank * step, (rank + 1) * step)


def check_divisible(what: str, size: int, tp: int) -> None:
    """ValueError unless ``size`` splits into ``tp`` equal parts."""
    if size % tp:
        raise ValueError(f"{what} {size} is not divisible by the tensor-parallel size {tp}; "
                         f"tp must divide {size}")


class ColumnParallelLinear(Module):
    """Rows ``rows`` of a full Linear's output: f, then ``x @ W[rows].T + b[rows]``; output stays split."""

    def __init__(self, full: Linear, comm, rows: np.ndarray | None = None, tracer=None):
        super().__init__()
        rows = block(full.out_features, comm.rank, comm.size) if rows is None else np.asarray(rows)
        self.rows = rows
        self.weight = Parameter(full.weight.data[rows].copy())                      # (out/tp, in)
        self.bias = None if full.bias is None else Parameter(full.bias.data[rows].copy())  # (out/tp,)
        self.enter = CopyToGroup(comm, tracer)
        self.local = Linear(full.in_features, len(rows), bias=False, dtype=full.dtype,
                            input_grad=full.input_grad, weight=self.weight)
        self.local.bias = self.bias

    def forward(self, x):
        return self.local.forward(self.enter.forward(x))

    def backward(self, dout):
        return self._backward_child(self.enter, self._backward_child(self.local, dout))

    def extra_repr(self) -> str:
        return f"{self.local.in_features} -> {len(self.rows)} of the full layer's output rows"


class AddBias(Module):
    """``x + bias`` over the last axis; backward sums dL/dy into the bias gradient."""

    def __init__(self, bias: Parameter):
        super().__init__()
        self.bias = bias                                                           # (out,)

    def forward(self, x):
        x += self.bias.data                     # x is the fresh all-reduced array: ours to change
        return x

    def backward(self, dout):
        gb, overwrite = self.bias.grad_to_write()
        d2 = dout.reshape(-1, dout.shape[-1])
        if overwrite:
            np.sum(d2, axis=0, out=gb)
        else:
            gb += d2.sum(axis=0)
        return dout


class RowParallelLinear(Module):
    """Columns ``cols`` of a full Linear's input: ``x_part @ W[:, cols].T``, g, then the full bias once."""

    def __init__(self, full: Linear, comm, tracer=None):
        super().__init__()
        self.cols = block(full.in_features, comm.rank, comm.size)
        self.weight = Parameter(full.weight.data[:, self.cols].copy())             # (out, in/tp)
        self.bias = None if full.bias is None else Parameter(full.bias.data.copy())  # (out,) replicated
        self.local = Linear(len(self.cols), full.out_features, bias=False, dtype=full.dtype,
                            weight=self.weight)
        self.reduce = ReduceFromGroup(comm, tracer)
        self.add_bias = None if self.bias is None else AddBias(self.bias)

    def forward(self, x):
        y = self.reduce.forward(self.local.forward(x))
        return y if self.add_bias is None else self.add_bias.forward(y)

    def backward(self, dout):
        if self.add_bias is not None:
            dout = self._backward_child(self.add_bias, dout)
        return self._backward_child(self.local, self._backward_child(self.reduce, dout))

    def extra_repr(self) -> str:
        return f"columns {self.cols[0]}..{self.cols[-1]} of the input -> {self.local.out_features}"


class SplitDropout(Module):
    """A Dropout on a column-split activation: draws the full-width mask (as one process does), keeps its columns.

    Every rank of the tensor group runs the full layer's stream on a zero-padded full-width
    array, so each element gets the mask bit it gets in one process; the cost is the full
    width of that one activation per rank.
    """

    def __init__(self, dropout: Module, cols: np.ndarray, full_width: int):
        super().__init__()
        self.dropout, self.cols, self.full_width = dropout, cols, full_width

    def _padded(self, x: np.ndarray) -> np.ndarray:
        full = np.zeros(x.shape[:-1] + (self.full_width,), dtype=x.dtype)
        full[..., self.cols[0]:self.cols[-1] + 1] = x
        return full

    def forward(self, x):
        return self.dropout.forward(self._padded(x))[..., self.cols[0]:self.cols[-1] + 1]

    def backward(self, dout):
        return self._backward_child(self.dropout, self._padded(dout))[..., self.cols[0]:self.cols[-1] + 1]


def shard_indices(model: Module) -> dict[str, tuple[int, np.ndarray]]:
    """``name -> (axis, indices)``: which part of the full model's parameter each split one holds.

    Parameters not listed are replicated whole on every rank of the tensor group.
    """
    out = {}
    for prefix, m in model.named_modules():
        dot = f"{prefix}." if prefix else ""
        if isinstance(m, ColumnParallelLinear):
            out[dot + "weight"] = (0, m.rows)
            if m.bias is not None:
                out[dot + "bias"] = (0, m.rows)
        elif isinstance(m, RowParallelLinear):
            out[dot + "weight"] = (1, m.cols)
    return out
