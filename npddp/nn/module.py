"""Parameter, the Module base class and Sequential.

Contract used by DDP:
* ``Parameter.data`` and ``Parameter.grad`` exist from construction; backward only ever
  writes into ``grad`` in place (``+=`` or ``out=``), so DDP may swap ``grad`` for a view into
  a flat bucket once, after construction, and every later backward writes into the bucket.
* ``zero_grad`` zeroes lazily, as PyTorch's ``set_to_none`` does in effect: the gradient is
  marked zero, the next backward overwrites it instead of adding (no pass of zeros, no
  temporary), and reading ``grad`` before that writes the zeros. Code that reads gradient
  memory other than through ``grad`` (a bucket) calls :func:`settle_grads` first.
* ``named_parameters()`` has a fixed order: attribute definition order, depth first; a
  parameter shared by two layers (tied weights) appears once, and its gradient is final
  only after the backward of every layer that uses it.
* ``register_grad_hook(fn)``: during ``backward`` of a container, ``fn(layer)`` is called
  right after each leaf layer's backward returns, at which point that layer's parameter
  gradients are final for this backward pass (layers without parameters report too, so a
  listener can poll outstanding communication between layers).
* Call hooks (PyTorch's module hooks, for a module's own ``forward``/``backward``):
  ``register_forward_pre_hook(fn)`` runs ``fn(module, args)`` before each ``forward(*args)``,
  ``register_forward_hook(fn)`` runs ``fn(module, args, output)`` after it, and
  ``register_backward_pre_hook``/``register_backward_hook`` do the same around ``backward``
  (``args`` the tuple it was called with, ``output`` what it returned). Pre-hooks run in
  registration order, post-hooks in reverse, so a pair registered together brackets every pair
  registered after it (as nested context managers do). Each returns a :class:`HookHandle`
  whose ``remove()`` takes the hook off; return values are ignored. A module without such hooks
  is not touched: its calls cost nothing extra. The tracer (``trace_layers``) and ZeRO-3's
  gather/free schedule are both built on them.
* ``trace_layers(tracer)``: record every module's forward and backward on a timeline (see
  :mod:`npddp.util.tracing`); an untraced model gets no hooks.
* Forward without gradients (PyTorch's ``no_grad``, per model rather than per thread): inside
  ``with model.no_grad():`` (or after ``set_grad_enabled(False)``) every layer's ``forward``
  computes the same bits but keeps nothing for a backward -- its caches are emptied, so each
  activation is freed as soon as the next layer has read it -- and no gradient buffer is
  touched; a ``backward`` then raises. Evaluation runs this way.
* ``building(sink)``: a context within which every Parameter made hands its initial values to
  ``sink(parameter, values)`` instead of keeping them, in the order the parameters are made;
  the sink sets what the parameter holds (ZeRO-3 keeps this rank's part and leaves
  placeholders that occupy no memory, so no rank ever holds the whole model). Scoped to the
  ``with`` block and to the thread or task that entered it.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
from typing import Callable, Iterator

import numpy as np


class Parameter:
    """A trainable array with its gradient buffer, allocated together."""

    __slots__ = ("data", "_grad", "_zero")

    def __init__(self, data: np.ndarray):
        self._zero = False   # zero_grad was called and nothing has written the gradient since
        sink = _SINK.get()
        if sink is not None:   # inside building(sink): the sink sets data and grad
            sink(self, np.asarray(data))
            return
        self.data = np.ascontiguousarray(data)
        self._grad = np.zeros(self.data.shape, self.data.dtype)   # calloc'd: no memory until written

    @property
    def grad(self) -> np.ndarray:
        """The gradient (same shape as ``data``); zeros after ``zero_grad`` until a backward writes it."""
        if self._zero:
            self.settle()
        return self._grad

    def settle(self) -> None:
        """Write the zeros a lazy ``zero_grad`` left pending (nothing if none are)."""
        if self._zero:
            self._zero = False
            if self._grad.flags.writeable:   # a read-only gradient (ZeRO-3's freed one) is zeros already
                self._grad[...] = 0

    @grad.setter
    def grad(self, array: np.ndarray) -> None:
        self._grad, self._zero = array, False

    def zero_grad(self) -> None:
        """Make the gradient zero, lazily: the next backward overwrites it, a read first writes zeros."""
        self._zero = True

    def grad_to_write(self) -> tuple[np.ndarray, bool]:
        """For a backward: ``(gradient, overwrite)``; overwrite when it is zero by ``zero_grad``, else add into it."""
        zero, self._zero = self._zero, False
        return self._grad, zero

    @property
    def shape(self):
        """Shape of ``data``."""
        return self.data.shape

    @property
    def dtype(self):
        """dtype of ``data``."""
        return self.data.dtype

    def __repr__(self) -> str:
        return f"Parameter(shape={self.data.shape}, dtype={self.data.dtype})"


_SINK: contextvars.ContextVar = contextvars.ContextVar("npddp_parameter_sink", default=None)


@contextlib.contextmanager
def building(sink: Callable[[Parameter, np.ndarray], None]):
    """Within this context every new Parameter calls ``sink(parameter, values)``, which sets its data and grad."""
    if not callable(sink):
        raise TypeError(f"building: the sink must be callable, got {type(sink).__name__}")
    token = _SINK.set(sink)
    try:
        yield sink
    finally:
        _SINK.reset(token)


class HookHandle:
    """What a ``register_*_hook`` returns: ``remove()`` takes that hook off its module (again: nothing)."""

    __slots__ = ("_table", "_key")

    def __init__(self, table: "_CallHooks", key: int):
        self._table, self._key = table, key

    def remove(self) -> None:
        """Take the hook off; the module's own method is back once it has no hooks left."""
        self._table.remove(self._key)


class _CallHooks:
    """The pre- and post-hooks of one method (``forward`` or ``backward``) of one module instance.

    While any hook is registered the instance attribute of that name is a dispatcher running
    them around the method found before (the class's, or one the instance already had); with the
    last hook removed that earlier state comes back.
    """

    __slots__ = ("module", "kind", "pre", "post", "keys", "saved", "dispatcher")

    def __init__(self, module: "Module", kind: str):
        self.module, self.kind, self.keys = module, kind, itertools.count()
        self.pre: dict[int, Callable] = {}
        self.post: dict[int, Callable] = {}
        self.saved = None        # the instance attribute the dispatcher replaced (None: the class's method)
        self.dispatcher = None   # installed while any hook is registered

    def add(self, fn: Callable, after: bool) -> HookHandle:
        """Register ``fn`` as a post-hook (``after``) or pre-hook; install the dispatcher if needed."""
        if not callable(fn):
            raise TypeError(f"a {self.kind} hook must be callable, got {type(fn).__name__}")
        key = next(self.keys)
        (self.post if after else self.pre)[key] = fn
        if self.dispatcher is None:
            self._install()
        return HookHandle(self, key)

    def remove(self, key: int) -> None:
        """Drop hook ``key``; with none left put the method back as it was."""
        self.pre.pop(key, None)
        self.post.pop(key, None)
        if not (self.pre or self.post) and self.dispatcher is not None:
            attrs = vars(self.module)
            if attrs.get(self.kind) is self.dispatcher:
                if self.saved is None:
                    del attrs[self.kind]
                else:
                    attrs[self.kind] = self.saved
            self.dispatcher = self.saved = None

    def _install(self) -> None:
        module, pre, post = self.module, self.pre, self.post
        self.saved = vars(module).get(self.kind)
        inner = getattr(module, self.kind)

        def dispatch(*args):
            for fn in tuple(pre.values()):
                fn(module, args)
            out = inner(*args)
            for fn in reversed(tuple(post.values())):
                fn(module, args, out)
            return out
        dispatch.__doc__, dispatch.__wrapped__ = inner.__doc__, inner
        self.dispatcher = dispatch
        setattr(module, self.kind, dispatch)


def settle_grads(params) -> None:
    """Write the zeros of every gradient in ``params`` still zero by ``zero_grad`` (before reading their memory directly)."""
    for p in params:
        p.settle()


class Module:
    """Base class: parameters and sub-modules are found among the instance attributes."""

    def __init__(self):
        self.training = True
        self.grad_enabled = True   # False: forward keeps nothing for a backward (see no_grad)
        self._grad_hooks: list[Callable[[Module], None]] = []

    # --- structure -------------------------------------------------------------------
    def children(self) -> Iterator[tuple[str, "Module"]]:
        """Direct sub-modules with their attribute names, in definition order."""
        for key, value in vars(self).items():
            if isinstance(value, Module):
                yield key, value

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        """This module (named ``prefix``) and every sub-module with a dotted name, depth first."""
        yield prefix, self
        for key, child in self.children():
            yield from child.named_modules(f"{prefix}.{key}" if prefix else key)

    def named_parameters(self, prefix: str = "") -> list[tuple[str, Parameter]]:
        """Every parameter with a dotted name, depth first, in a fixed order.

        A parameter shared by several layers (tied weights) is listed once, under the name
        where it is met first, as in PyTorch.
        """
        seen: set[int] = set()
        return [(name, p) for name, p in self._all_parameters(prefix)
                if not (id(p) in seen or seen.add(id(p)))]

    def _all_parameters(self, prefix: str):
        """Every (name, parameter) pair in definition order, shared ones repeated."""
        for key, value in vars(self).items():
            if isinstance(value, Parameter):
                yield prefix + key, value
            elif isinstance(value, Module):
                yield from value._all_parameters(prefix + key + ".")

    def parameters(self) -> list[Parameter]:
        """Every parameter, in ``named_parameters`` order."""
        return [p for _, p in self.named_parameters()]

    def num_parameters(self) -> int:
        """Total number of scalar parameters."""
        return sum(p.data.size for p in self.parameters())

    def num_bytes(self) -> int:
        """Bytes held by parameter values (gradients take as much again)."""
        return sum(p.data.nbytes for p in self.parameters())

    def state_dict(self) -> dict[str, np.ndarray]:
        """A copy of every parameter's values by name, in ``named_parameters`` order."""
        return {name: p.data.copy() for name, p in self.named_parameters()}

    def load_state_dict(self, state, strict: bool = True) -> tuple[list[str], list[str]]:
        """Copy arrays from ``state`` (name -> array) into the parameters, in place.

        ``strict``: every parameter must be present and nothing else; a ValueError names the
        missing, unexpected and mis-shaped entries, and nothing is changed. Otherwise the
        matching entries are loaded. Returns (missing names, unexpected names).
        """
        named = dict(self.named_parameters())
        missing = [n for n in named if n not in state]
        unexpected = [n for n in state if n not in named]
        wrong = []
        for name, p in named.items():
            if name in state:
                value = np.asarray(state[name])
                if value.shape != p.data.shape or not np.can_cast(value.dtype, p.data.dtype, "same_kind"):
                    wrong.append(f"{name}: {tuple(value.shape)} {value.dtype} given, "
                                 f"{tuple(p.data.shape)} {p.data.dtype} expected")
        if wrong or (strict and (missing or unexpected)):
            parts = [f"missing {missing}" if missing and strict else "",
                     f"unexpected {unexpected}" if unexpected and strict else "",
                     f"mis-shaped: {'; '.join(wrong)}" if wrong else ""]
            raise ValueError(f"{type(self).__name__}.load_state_dict: "
                             + ", ".join(p for p in parts if p))
        for name, p in named.items():
            if name in state:
                np.copyto(p.data, np.asarray(state[name]), casting="same_kind")
        return missing, unexpected

    def zero_grad(self) -> None:
        """Set every gradient to zero (lazily, see :meth:`Parameter.zero_grad`)."""
        for p in self.parameters():
            p.zero_grad()

    def train(self, mode: bool = True) -> "Module":
        """Switch this module and its children to training (or eval) mode."""
        self.training = mode
        for _, child in self.children():
            child.train(mode)
        return self

    def eval(self) -> "Module":
        """Switch to evaluation mode."""
        return self.train(False)

    def set_grad_enabled(self, mode: bool = True) -> "Module":
        """Let forward keep what backward needs (``mode`` True) or nothing (False), here and in every sub-module."""
        for _, module in self.named_modules():
            module.grad_enabled = bool(mode)
        return self

    @contextlib.contextmanager
    def no_grad(self):
        """Within the context forward keeps no activations and backward is refused; each module's setting comes back."""
        saved = [(module, module.grad_enabled) for _, module in self.named_modules()]
        for module, _ in saved:
            module.grad_enabled = False
        try:
            yield self
        finally:
            for module, mode in saved:
                module.grad_enabled = mode

    # --- gradient-ready notifications ------------------------------------------------
    def register_grad_hook(self, fn: Callable[["Module"], None]) -> None:
        """Call ``fn(layer)`` after each leaf layer's backward inside this module."""
        self._grad_hooks.append(fn)
        for _, child in self.children():
            child.register_grad_hook(fn)

    def clear_grad_hooks(self) -> None:
        """Remove every gradient hook from this module and its children."""
        self._grad_hooks.clear()
        for _, child in self.children():
            child.clear_grad_hooks()

    def _backward_child(self, child: "Module", dout: np.ndarray) -> np.ndarray:
        """Run ``child.backward`` and, for a leaf child, tell the hooks its gradients are final."""
        dx = child.backward(dout)
        if self._grad_hooks and next(child.children(), None) is None:
            for fn in self._grad_hooks:
                fn(child)
        return dx

    # --- call hooks -------------------------------------------------------------------
    def register_forward_pre_hook(self, fn: Callable) -> HookHandle:
        """Run ``fn(module, args)`` before each call of this module's ``forward(*args)``."""
        return self._call_hooks("forward").add(fn, after=False)

    def register_forward_hook(self, fn: Callable) -> HookHandle:
        """Run ``fn(module, args, output)`` after each call of this module's ``forward``."""
        return self._call_hooks("forward").add(fn, after=True)

    def register_backward_pre_hook(self, fn: Callable) -> HookHandle:
        """Run ``fn(module, args)`` before each call of this module's ``backward(*args)``."""
        return self._call_hooks("backward").add(fn, after=False)

    def register_backward_hook(self, fn: Callable) -> HookHandle:
        """Run ``fn(module, args, dx)`` after each call of this module's ``backward``."""
        return self._call_hooks("backward").add(fn, after=True)

    def _call_hooks(self, kind: str) -> _CallHooks:
        """This instance's hook table for ``kind``, made on first use."""
        tables = vars(self).setdefault("_call_hook_tables", {})
        if kind not in tables:
            tables[kind] = _CallHooks(self, kind)
        return tables[kind]

    # --- timeline tracing -------------------------------------------------------------
    def trace_layers(self, tracer, track: int) -> None:
        """Record each module's forward and backward as events on ``tracer``'s ``track``.

        This module's events are named ``forward``/``backward``, a sub-module's ``backward
        NAME`` (its dotted name), with its type as argument. Each is a pre/post call-hook pair,
        registered after any hooks already there (so it times the layer inside them); calling it
        again replaces the earlier tracer's hooks, and a disabled tracer (``tracer.enabled``
        false) only removes them.
        """
        for name, module in self.named_modules():
            for handle in vars(module).pop("_trace_hooks", ()):
                handle.remove()
            if not tracer.enabled:
                continue
            handles = []
            for kind in ("forward", "backward"):
                label = f"{kind} {name}" if name else kind
                start, end = _timing_hooks(tracer, tracer.name(label, layer=name, type=type(module).__name__), track)
                add_pre, add_post = ((module.register_forward_pre_hook, module.register_forward_hook)
                                     if kind == "forward" else
                                     (module.register_backward_pre_hook, module.register_backward_hook))
                handles += [add_pre(start), add_post(end)]
            module._trace_hooks = handles

    # --- computation -----------------------------------------------------------------
    def forward(self, x: np.ndarray) -> np.ndarray:
        """Compute the output for ``x`` (and keep what backward needs, unless ``grad_enabled`` is False)."""
        raise NotImplementedError

    def backward(self, dout: np.ndarray) -> np.ndarray:
        """Accumulate parameter gradients for ``dout`` = dL/d(output); return dL/d(input)."""
        raise NotImplementedError

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return self.forward(x)

    def extra_repr(self) -> str:
        """Layer settings shown by repr."""
        return ""

    def __repr__(self) -> str:
        kids = list(self.children())
        if not kids:
            return f"{type(self).__name__}({self.extra_repr()})"
        body = "\n".join(f"  ({k}): " + repr(m).replace("\n", "\n  ") for k, m in kids)
        return f"{type(self).__name__}(\n{body}\n)"


def _timing_hooks(tracer, event: int, track: int) -> tuple[Callable, Callable]:
    """A pre-hook reading ``tracer``'s clock and a post-hook recording ``event`` from it (calls may nest)."""
    starts: list[int] = []

    def start(module, args) -> None:
        starts.append(tracer.clock())

    def end(module, args, out) -> None:
        tracer.add(starts.pop(), event, track)
    return start, end


class Sequential(Module):
    """Layers applied in order; backward runs them in reverse, reporting each leaf to the hooks."""

    def __init__(self, *layers: Module):
        super().__init__()
        for i, layer in enumerate(layers):
            if not isinstance(layer, Module):
                raise TypeError(f"Sequential item {i} is {type(layer).__name__}, not a Module")
            setattr(self, str(i), layer)
        self.layers = list(layers)  # plain list: not an attribute Module walks

    def forward(self, x):
        for layer in self.layers:
            x = layer.forward(x)
        return x

    def backward(self, dout):
        for layer in reversed(self.layers):
            dout = self._backward_child(layer, dout)
        return dout

    def __len__(self) -> int:
        return len(self.layers)

    def __getitem__(self, i: int) -> Module:
        return self.layers[i]
