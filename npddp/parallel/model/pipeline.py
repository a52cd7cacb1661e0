"""Pipeline parallelism: one stage per rank of a pipeline group, micro-batches under GPipe or 1F1B.

Per training step, with ``M`` micro-batches (``np.array_split`` of this rank's rows) and ``K``
stages: stage ``s`` receives each micro-batch's activation from stage ``s-1`` (an int64 shape
header of 8 words, then the array: no pickling), runs its layers, and sends the result to
stage ``s+1``; the last stage computes the loss. Backward runs the other way: the gradient
of the activation a stage received goes back to the stage it came from. The order is the
schedule's (:mod:`npddp.parallel.model.schedules`); the idle share of a stage is the bubble
``(K-1)/(M+K-1)`` under both.

Exactness: the loss gradient of micro-batch ``i`` is scaled by ``m_i / B`` (its rows over this
rank's rows), so the accumulated gradient is the whole batch's mean gradient; a data group
(``data=``) wraps the stage in DDP, which accumulates under ``no_sync`` and averages over the
data ranks with the last backward. Dropout masks are positioned by global sample row
(:class:`RowAlignedDropout`), so micro-batches, data shards and recomputed forwards all get
the one process's bits. Layers keep the input of their latest forward only, so a stage keeps
each in-flight micro-batch's input and, before a backward, re-runs the forward of that
micro-batch when another ran since (activation recomputation, as GPipe does); the last stage
under 1F1B never needs it. A GPT's tied embedding gradient is summed between the first and
last stage after the last backward (see :mod:`npddp.parallel.model.stages`).

Tracing (``tracer=``): each micro-batch's forward and backward, the sends and receives and the
idle stretches (the bubble) go on the timeline (:mod:`npddp.parallel.model.pipetrace`), each
layer's forward and backward inside them, and the data group's DDP records its all-reduces there.
"""

from __future__ import annotations

import numpy as np

from npddp.parallel.model.pipetrace import PipelineTrace
from npddp.parallel.model.randomness import RowAlignedDropout
from npddp.parallel.model.schedules import schedule
from npddp.parallel.model.stages import PipelineStage
from npddp.util import tracing

HEADER_WORDS = 8
DTYPES = ("float16", "float32", "float64", "int32", "int64")
TAG_HEADER, TAG_ACTIVATION, TAG_GRADIENT, TAG_TIED, TAG_ROWS = 1, 2, 3, 4, 5


def _header(a: np.ndarray) -> np.ndarray:
    """[dtype index, ndim, shape...] as int64 words."""
    if a.dtype.name not in DTYPES or a.ndim > HEADER_WORDS - 2:
        raise ValueError(f"pipeline: cannot send an activation of {a.dtype.name} {a.shape}; "
                         f"dtypes {', '.join(DTYPES)}, at most {HEADER_WORDS - 2} dimensions")
    words = np.zeros(HEADER_WORDS, dtype=np.int64)
    words[0], words[1] = DTYPES.index(a.dtype.name), a.ndim
    words[2:2 + a.ndim] = a.shape
    return words


class Pipeline:
    """Train ``stage`` (a :class:`PipelineStage`) over the pipeline group ``comm`` (its rank = stage index)."""

    def __init__(self, stage: PipelineStage, comm, loss, micro_batches: int, schedule_name: str = "1f1b",
                 data=None, tracer=None, **ddp_args):
        if not isinstance(stage, PipelineStage):
            raise TypeError(f"stage must be a PipelineStage, got {type(stage).__name__}")
        if comm.size != stage.stages or comm.rank != stage.stage:
            raise ValueError(f"stage {stage.stage} of {stage.stages} does not fit rank {comm.rank} of a "
                             f"pipeline group of {comm.size}")
        schedule(schedule_name, stage.stage, stage.stages, micro_batches)      # checks the arguments
        self.stage, self.comm, self.loss = stage, comm, loss
        self.micro_batches, self.schedule_name = micro_batches, schedule_name
        self.first, self.last = stage.stage == 0, stage.stage == stage.stages - 1
        self.dropout = RowAlignedDropout(stage)
        self.tracer = tracing.NULL if tracer is None else tracer
        self.trace = PipelineTrace(self.tracer, stage.stage, stage.stages, schedule_name)
        stage.trace_layers(self.tracer, tracing.COMPUTE)
        self.ddp = None
        if data is not None:
            from npddp.parallel.ddp import DistributedDataParallel
            traced = {} if tracer is None else {"tracer": tracer}
            self.ddp = DistributedDataParallel(stage, data, **traced, **ddp_args)
        self.module = stage if self.ddp is None else self.ddp

    def parameters(self):
        """This stage's parameters."""
        return self.stage.parameters()

    def zero_grad(self) -> None:
        """Zero this stage's gradients."""
        self.module.zero_grad()

    def step(self, optimizer) -> None:
        """Step ``optimizer`` on this stage's (reduced) gradients."""
        if self.ddp is None:
            t0 = self.tracer.clock()
            optimizer.step()
            self.tracer.add(t0, self.tracer.name("optimizer step"), tracing.OPTIMIZER)
        else:
            self.ddp.step(optimizer)

    def train_step(self, x, y, first_row: int = 0, global_rows: int | None = None,
                   row_stride: int = 1) -> float | None:
        """Forward and backward of one batch; returns its mean loss on the last stage, None elsewhere.

        ``x`` (first stage) and ``y`` (last stage) are this rank's rows; other stages may pass
        None. ``first_row``: the global index of this rank's first row (data parallelism), and
        ``global_rows`` the global batch size, which position the dropout streams; row ``k`` of
        this rank is global row ``first_row + k * row_stride`` (a DistributedSampler's shard: the
        replica's index and the number of replicas).
        """
        rows = len(x) if self.first else len(y) if self.last else self._agreed_rows()
        if not 1 <= self.micro_batches <= rows:
            raise ValueError(f"micro_batches must be in [1, {rows}] (the rows per step), got {self.micro_batches}")
        self._share_rows(rows)
        bounds = np.cumsum([0] + [len(p) for p in np.array_split(np.arange(rows), self.micro_batches)])
        ops = schedule(self.schedule_name, self.stage.stage, self.stage.stages, self.micro_batches)
        last_bwd = max(i for kind, i in ops if kind == "bwd")
        inputs, outputs, grads, dx = {}, {}, {}, {}
        latest, losses = None, 0.0
        self.dropout.begin_step()
        self.trace.begin(self.micro_batches)
        for kind, i in ops:
            lo, hi = bounds[i], bounds[i + 1]
            t0, nbytes = self.trace.clock(), 0
            if kind == "recv_act":
                inputs[i] = self._recv_activation()
                nbytes = inputs[i].nbytes
            elif kind == "fwd":
                if self.first:
                    inputs[i] = x[lo:hi]
                self.dropout.at_rows(first_row + lo * row_stride, row_stride)
                out = self.module.forward(inputs[i])
                latest = i
                if self.last:
                    losses += self.loss.forward(out, y[lo:hi]) * (hi - lo) / rows
                    grads[i] = self.loss.backward()
                    grads[i] *= (hi - lo) / rows
                else:
                    outputs[i] = out
            elif kind == "send_act":
                out = self._send_activation(outputs.pop(i))
                outputs[i], nbytes = (out.shape, out.dtype), out.nbytes
            elif kind == "recv_grad":
                shape, dtype = outputs.pop(i)
                grads[i] = self.comm.recv(np.empty(shape, dtype), self.stage.stage + 1, TAG_GRADIENT)
                nbytes = grads[i].nbytes
            elif kind == "bwd":
                if latest != i:                            # recompute: layers keep their latest input only
                    self._recompute(i, inputs[i], first_row + lo * row_stride, row_stride)
                dx[i] = self._backward(grads.pop(i), last=i == last_bwd)
                inputs.pop(i)
                latest = None
            elif kind == "send_grad":
                nbytes = self._send_gradient(dx.pop(i))
            self.trace.op(kind, i, t0, nbytes)
        self.dropout.end_step(rows if global_rows is None else global_rows)
        self._sum_tied()
        self.trace.end()
        return losses if self.last else None

    def predict(self, x) -> np.ndarray | None:
        """Forward only, the whole batch at once (validation): the output on the last stage, None elsewhere.

        ``x``: this rank's rows on the first stage (others may pass None).
        """
        if not self.first:
            x = self._recv_activation()
        out = self.stage.forward(x)
        if self.last:
            return out
        self._send_activation(out)
        return None

    def _backward(self, dout, last: bool):
        """Backward of one micro-batch; under DDP only the last one of the step averages."""
        if self.ddp is None or last:
            return self.module.backward(dout)
        with self.ddp.no_sync():
            return self.module.backward(dout)

    def _recompute(self, i: int, x: np.ndarray, first_row: int, row_stride: int) -> None:
        """Run micro-batch ``i``'s forward again (its input ``x``, its rows' dropout bits) before its backward."""
        t0 = self.trace.clock()
        self.dropout.at_rows(first_row, row_stride)
        self.module.forward(x)
        self.trace.op("recompute", i, t0)

    def _send_activation(self, out: np.ndarray) -> np.ndarray:
        """Send an activation to the next stage: its header, then the array (returned, contiguous)."""
        out = np.ascontiguousarray(out)
        self.comm.send(_header(out), self.stage.stage + 1, TAG_HEADER)
        self.comm.send(out, self.stage.stage + 1, TAG_ACTIVATION)
        return out

    def _send_gradient(self, grad: np.ndarray) -> int:
        """Send the gradient of a received activation back to the previous stage; its bytes."""
        grad = np.ascontiguousarray(grad)
        self.comm.send(grad, self.stage.stage - 1, TAG_GRADIENT)
        return grad.nbytes

    def _recv_activation(self) -> np.ndarray:
        """An activation from the previous stage: its header, then the array."""
        words = self.comm.recv(np.empty(HEADER_WORDS, np.int64), self.stage.stage - 1, TAG_HEADER)
        shape = tuple(int(v) for v in words[2:2 + int(words[1])])
        return self.comm.recv(np.empty(shape, DTYPES[int(words[0])]), self.stage.stage - 1, TAG_ACTIVATION)

    def _share_rows(self, rows: int) -> None:
        """The first stage tells the middle ones how many rows this step has (the last knows from ``y``)."""
        if self.first:
            for peer in range(1, self.stage.stages - 1):
                self.comm.send(np.array([rows], np.int64), peer, TAG_ROWS)

    def _agreed_rows(self) -> int:
        """A middle stage's row count, from the first stage."""
        return int(self.comm.recv(np.empty(1, np.int64), 0, TAG_ROWS)[0])

    def _sum_tied(self) -> None:
        """First and last stage add each other's gradient of the tied embedding (the first sends first)."""
        tied = self.stage.tied
        if tied is None:
            return
        grad = tied.grad
        t0 = self.trace.clock()
        theirs = np.empty_like(grad)
        peer = self.stage.stages - 1 if self.first else 0
        if self.first:
            self.comm.send(grad, peer, TAG_TIED)
            self.comm.recv(theirs, peer, TAG_TIED)
        else:
            self.comm.recv(theirs, peer, TAG_TIED)
            self.comm.send(grad, peer, TAG_TIED)
        grad += theirs
        self.trace.tied(t0, grad.nbytes)
