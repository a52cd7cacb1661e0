"""Call hooks of one module instance (PyTorch's module hooks, for a module's own ``forward``/``backward``).

``register_forward_pre_hook(fn)`` runs ``fn(module, args)`` before each ``forward(*args)``,
``register_forward_hook(fn)`` runs ``fn(module, args, output)`` after it, and
``register_backward_pre_hook``/``register_backward_hook`` do the same around ``backward``
(``args`` the tuple it was called with, ``output`` what it returned). Pre-hooks run in
registration order, post-hooks in reverse, so a pair registered together brackets every pair
registered after it (as nested context managers do). Each returns a :class:`HookHandle`
whose ``remove()`` takes the hook off; return values are ignored. A module without such hooks
is not touched: its calls cost nothing extra. The tracer (:meth:`Module.trace_layers
<npddp.nn.module.Module.trace_layers>`, through :func:`timing_hooks`) and ZeRO-3's gather/free
schedule are both built on them.
"""

from __future__ import annotations

import itertools
from typing import Callable


class HookHandle:
    """What a ``register_*_hook`` returns: ``remove()`` takes that hook off its module (again: nothing)."""

    __slots__ = ("_table", "_key")

    def __init__(self, table: "CallHooks", key: int):
        self._table, self._key = table, key

    def remove(self) -> None:
        """Take the hook off; the module's own method is back once it has no hooks left."""
        self._table.remove(self._key)


class CallHooks:
    """The pre- and post-hooks of one method (``forward`` or ``backward``) of one module instance.

    While any hook is registered the instance attribute of that name is a dispatcher running
    them around the method found before (the class's, or one the instance already had); with the
    last hook removed that earlier state comes back.
    """

    __slots__ = ("module", "kind", "pre", "post", "keys", "saved", "dispatcher")

    def __init__(self, module, kind: str):
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


def timing_hooks(tracer, event: int, track: int) -> tuple[Callable, Callable]:
    """A pre-hook reading ``tracer``'s clock and a post-hook recording ``event`` from it (calls may nest)."""
    starts: list[int] = []

    def start(module, args) -> None:
        starts.append(tracer.clock())

    def end(module, args, out) -> None:
        tracer.add(starts.pop(), event, track)
    return start, end
