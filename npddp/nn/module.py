"""The Module base class and Sequential.

Contract used by DDP (the parameters' own is :mod:`npddp.nn.parameter`):
* ``named_parameters()`` has a fixed order: attribute definition order, depth first; a
  parameter shared by two layers (tied weights) appears once, and its gradient is final
  only after the backward of every layer that uses it.
* ``register_grad_hook(fn)``: during ``backward`` of a container, ``fn(layer)`` is called
  right after each leaf layer's backward returns, at which point that layer's parameter
  gradients are final for this backward pass (layers without parameters report too, so a
  listener can poll outstanding communication between layers).
* Call hooks around a module's own ``forward``/``backward`` (``register_forward_pre_hook`` and
  its kin) are :mod:`npddp.nn.callhooks`.
* ``trace_layers(tracer)``: record every module's forward and backward on a timeline (see
  :mod:`npddp.util.tracing`); an untraced model gets no hooks.
* Forward without gradients (PyTorch's ``no_grad``, per model rather than per thread): inside
  ``with model.no_grad():`` (or after ``set_grad_enabled(False)``) every layer's ``forward``
  computes the same bits but keeps nothing for a backward -- its caches are emptied, so each
  activation is freed as soon as the next layer has read it -- and no gradient buffer is
  touched; a ``backward`` then raises. Evaluation runs this way.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import numpy as np

from npddp.nn.callhooks import CallHooks, HookHandle, timing_hooks
from npddp.nn.parameter import Parameter


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

    def _call_hooks(self, kind: str) -> CallHooks:
        """This instance's hook table for ``kind``, made on first use."""
        tables = vars(self).setdefault("_call_hook_tables", {})
        if kind not in tables:
            tables[kind] = CallHooks(self, kind)
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
                start, end = timing_hooks(tracer, tracer.name(label, layer=name, type=type(module).__name__), track)
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
