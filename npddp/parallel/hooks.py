"""DDP communication hooks: how a bucket of gradients becomes the rank-averaged gradient.

A hook is a plain function ``hook(state, bucket) -> handle`` (the :class:`CommHook` protocol, the
handle a :class:`HookWork`): ``bucket`` is a
:class:`GradBucket` (index, flat buffer, parameters, is_last), ``state`` whatever the hook
needs (the communicator, or a small state object), and the handle's ``wait()`` returns the
bucket's averaged gradient (DDP copies it into the bucket if it is another array). Register one
with ``ddp.register_comm_hook(state, hook)``; without one DDP runs :func:`allreduce_hook`.
The built-in hooks follow PyTorch's ``default_hooks.py`` and ``powerSGD_hook.py``:

* :func:`allreduce_hook` (state: the communicator): the average over ranks (``op="avg"``).
* :func:`fp16_compress_hook` (state: the communicator): cast to float16, divide by the size,
  sum in float16, cast back; :func:`fp16_compress_wrapper` does the same around any hook.
* :func:`topk_hook` (state: :class:`TopKState`): each rank sends the ``ratio`` largest entries
  of gradient plus carried error; what it did not send stays in its error (error feedback).
* :func:`npddp.parallel.powersgd.powersgd_hook` (state: ``PowerSGDState``): low-rank matrices.

A state a checkpoint saves derives from the abstract :class:`HookState`. Hooks by name, as the
CLI's ``--comm-hook`` builds them (a ``--plugin`` adds its own): :mod:`npddp.parallel.hook_registry`.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from npddp.util.shown import shown

__all__ = ["CommHook", "GradBucket", "Handle", "HookState", "HookWork", "TopKState", "allreduce_hook",
           "allreduce_prescaled", "fp16_compress_hook", "fp16_compress_wrapper", "topk_hook"]


class GradBucket:
    """One bucket as a hook sees it: ``index``, flat ``buffer``, ``parameters`` and ``is_last``."""

    __slots__ = ("index", "buffer", "parameters", "is_last")

    def __init__(self, index: int, buffer: np.ndarray, parameters: list, is_last: bool):
        self.index, self.buffer, self.parameters, self.is_last = index, buffer, parameters, is_last

    def gradients(self) -> list[np.ndarray]:
        """Views of ``buffer`` shaped like each parameter, in bucket order."""
        out, offset = [], 0
        for p in self.parameters:
            out.append(self.buffer[offset:offset + p.data.size].reshape(p.data.shape))
            offset += p.data.size
        return out

    def with_buffer(self, buffer: np.ndarray) -> "GradBucket":
        """The same bucket over another flat buffer (e.g. a float16 copy)."""
        return GradBucket(self.index, buffer, self.parameters, self.is_last)


class HookWork(Protocol):
    """What a comm hook returns: polled between layers, waited for after backward (:class:`Handle` is one)."""

    def test(self) -> bool:
        """True once the bucket's communication has completed."""

    def wait(self) -> np.ndarray:
        """Finish; return the bucket's averaged gradient (the bucket's buffer or another array)."""


class CommHook(Protocol):
    """A comm hook: ``hook(state, bucket)`` starts reducing ``bucket`` on every rank alike."""

    def __call__(self, state: Any, bucket: GradBucket) -> HookWork:
        """Start the bucket's reduction; the handle's ``wait()`` gives the averaged gradient."""


class Handle:
    """A hook's result in progress: ``test()`` polls, ``wait()`` finishes and returns the averaged gradient.

    ``works``: the communicator's Work handles it waits on; ``finish()`` runs once they are
    complete and returns the result. ``nbytes``: bytes this rank handed to collectives.
    """

    __slots__ = ("works", "finish", "nbytes", "_result", "_done")

    def __init__(self, works, finish: Callable[[], np.ndarray], nbytes: int):
        self.works, self.finish, self.nbytes = list(works), finish, int(nbytes)
        self._result, self._done = None, False

    def test(self) -> bool:
        """True once every collective of this handle has completed (the finish step may remain)."""
        return self._done or all([w.test() for w in self.works])

    def wait(self) -> np.ndarray:
        """Complete the collectives, run the finish step once, return the result."""
        if not self._done:
            for w in self.works:
                w.wait()
            self._result, self._done = self.finish(), True
        return self._result

    def then(self, fn: Callable[[np.ndarray], np.ndarray]) -> "Handle":
        """A handle whose result is ``fn(this handle's result)``."""
        return Handle(self.works, lambda: fn(self.wait()), self.nbytes)


def allreduce_hook(comm, bucket: GradBucket) -> Handle:
    """Average the bucket over ranks (DDP's default): ``op="avg"`` scales the sum inside the reduction."""
    buf = bucket.buffer
    return Handle([comm.iallreduce(buf, "avg")], lambda: buf, buf.nbytes)


def fp16_compress_hook(comm, bucket: GradBucket) -> Handle:
    """Cast to float16 and divide by the size, sum the halves over ranks, cast back into the bucket."""
    return _fp16_allreduce(comm, bucket)


def allreduce_prescaled(comm, bucket: GradBucket) -> Handle:
    """Divide by the world size first, then sum over ranks (so float16 cannot overflow): PyTorch's order."""
    buf = bucket.buffer
    np.divide(buf, comm.size, out=buf, casting="same_kind")
    return Handle([comm.iallreduce(buf)], lambda: buf, buf.nbytes)


def fp16_compress_wrapper(hook: Callable) -> Callable:
    """Run ``hook`` on a float16 copy of the bucket; cast its result back into the bucket's buffer."""

    halves: dict = {}  # (id, size) of a bucket's buffer -> its float16 copy, reused every step

    def fp16_hook(state, bucket: GradBucket) -> Handle:
        buffer = bucket.buffer
        key = (id(buffer), buffer.size)
        half = halves.get(key)
        if half is None:
            if len(halves) >= _MAX_HALVES:  # buffers that come and go: forget them (one in flight keeps its own)
                halves.clear()
            half = halves[key] = np.empty(buffer.size, dtype=np.float16)
        np.copyto(half, buffer.ravel(), casting="same_kind")
        inner = hook(state, bucket.with_buffer(half))
        return inner.then(lambda result: _copy_back(buffer, result))

    fp16_hook.__name__ = f"fp16_{getattr(hook, '__name__', 'hook')}"
    return fp16_hook


#: Float16 copies one fp16 wrapper keeps (one per bucket of every model it serves).
_MAX_HALVES = 256
_fp16_allreduce = fp16_compress_wrapper(allreduce_prescaled)


def _copy_back(buffer: np.ndarray, result: np.ndarray) -> np.ndarray:
    np.copyto(buffer, result, casting="same_kind")
    return buffer


class HookState(abc.ABC):
    """Base of hook states that a checkpoint saves: ``state_dict()`` -> {name: array}, ``load_state_dict``.

    Every rank's arrays have the same names and shapes (a checkpoint stacks them by rank); the
    dtypes are the communicator's (float16/32/64, int32/64).
    """

    __slots__ = ()

    @abc.abstractmethod
    def state_dict(self) -> dict:
        """{name: array} to save."""

    @abc.abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Restore what :meth:`state_dict` returned."""


class TopKState(HookState):
    """State of :func:`topk_hook`: the communicator, the fraction sent, and each bucket's carried error."""

    __slots__ = ("comm", "ratio", "errors")

    def __init__(self, comm, ratio: float = 0.01):
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 < ratio <= 1.0:
            raise ValueError(f"topk ratio must be in (0, 1], got {shown(ratio)}")
        self.comm, self.ratio = comm, float(ratio)
        self.errors: dict[int, np.ndarray] = {}  # bucket index -> (n,) what was not sent yet

    def state_dict(self) -> dict:
        """The carried errors, by bucket index (what a checkpoint holds)."""
        return {f"error.{i}": e.copy() for i, e in self.errors.items()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.errors = {int(k.split(".")[1]): np.array(v) for k, v in state.items() if k.startswith("error.")}


def topk_hook(state: TopKState, bucket: GradBucket) -> Handle:
    """Exchange the ``ratio`` largest entries of gradient + error; keep the rest as error; average."""
    comm, buf = state.comm, bucket.buffer
    acc = state.errors.get(bucket.index)
    if acc is None:
        acc = state.errors[bucket.index] = np.zeros_like(buf)
    acc += buf                                                   # (n,) gradient plus carried error
    k = max(1, int(math.ceil(state.ratio * buf.size)))
    idx = np.argpartition(np.abs(acc), buf.size - k)[buf.size - k:].astype(np.int64)  # (k,)
    idx.sort()
    values = acc[idx]                                            # (k,)
    acc[idx] = 0                                                 # what is sent leaves the error
    all_idx, all_values = comm.allgather(idx), comm.allgather(values)  # (size, k) each
    buf[...] = 0
    for r in range(comm.size):                                   # fixed rank order: same bits everywhere
        np.add.at(buf, all_idx[r], all_values[r])
    np.divide(buf, comm.size, out=buf, casting="same_kind")
    return Handle([], lambda: buf, idx.nbytes + values.nbytes)
