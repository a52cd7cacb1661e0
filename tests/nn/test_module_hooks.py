"""Module call hooks: order (pre in registration order, post in reverse), removal, arguments and results."""

import numpy as np
import pytest

from npddp.nn import Linear, mlp
from npddp.util import tracing


def test_hooks_run_around_forward_and_backward_in_nesting_order():
    layer = Linear(3, 2, dtype=np.float64)
    calls = []
    for tag in ("outer", "inner"):
        layer.register_forward_pre_hook(lambda m, args, tag=tag: calls.append(("pre", tag, m, args[0].shape)))
        layer.register_forward_hook(lambda m, args, out, tag=tag: calls.append(("post", tag, m, out.shape)))
        layer.register_backward_pre_hook(lambda m, args, tag=tag: calls.append(("bpre", tag, m, args[0].shape)))
        layer.register_backward_hook(lambda m, args, dx, tag=tag: calls.append(("bpost", tag, m, dx.shape)))
    out = layer.forward(np.ones((4, 3)))
    layer.backward(np.ones_like(out))
    assert [c[:2] for c in calls] == [("pre", "outer"), ("pre", "inner"), ("post", "inner"), ("post", "outer"),
                                      ("bpre", "outer"), ("bpre", "inner"), ("bpost", "inner"), ("bpost", "outer")]
    assert all(c[2] is layer for c in calls)
    assert [c[3] for c in calls] == [(4, 3), (4, 3), (4, 2), (4, 2), (4, 2), (4, 2), (4, 3), (4, 3)]


def test_hooks_fire_when_a_container_calls_its_children():
    model = mlp(3, [4], 2, dtype=np.float64)
    seen = []
    for name, m in model.named_modules():
        m.register_forward_hook(lambda mod, args, out, name=name: seen.append(("fwd", name)))
        m.register_backward_hook(lambda mod, args, dx, name=name: seen.append(("bwd", name)))
    out = model.forward(np.ones((2, 3)))
    model.backward(np.ones_like(out))
    leaves = [n for n, m in model.named_modules() if n and next(m.children(), None) is None]
    assert [n for kind, n in seen if kind == "fwd"] == leaves + [""]
    assert [n for kind, n in seen if kind == "bwd"] == leaves[::-1] + [""]


def test_removing_the_last_hook_restores_the_method_and_results_never_change():
    layer = Linear(3, 2, dtype=np.float64)
    original = layer.forward
    x = np.arange(6.0).reshape(2, 3)
    want = layer.forward(x)
    handles = [layer.register_forward_pre_hook(lambda m, a: None), layer.register_forward_hook(lambda m, a, o: None)]
    assert "forward" in vars(layer)
    np.testing.assert_array_equal(layer.forward(x), want)
    handles[0].remove()
    handles[0].remove()                       # a second remove does nothing
    assert "forward" in vars(layer)
    handles[1].remove()
    assert "forward" not in vars(layer) and layer.forward == original
    with pytest.raises(TypeError, match="must be callable"):
        layer.register_backward_hook("not a function")


def test_a_method_the_instance_already_had_comes_back_after_its_hooks():
    layer = Linear(3, 2, dtype=np.float64)
    calls = []
    own = lambda x: calls.append("own") or x           # noqa: E731
    layer.forward = own
    handle = layer.register_forward_pre_hook(lambda m, a: calls.append("hook"))
    layer.forward(np.ones((1, 3)))
    handle.remove()
    assert calls == ["hook", "own"] and layer.forward is own


class Events(tracing.NullTracer):
    """An enabled tracer that keeps the names of the events it records."""

    enabled = True

    def __init__(self):
        self.labels, self.events = [], []

    def name(self, text, **args):
        self.labels.append(text)
        return len(self.labels) - 1

    def clock(self):
        return 1

    def add(self, t0, name, track):
        self.events.append(self.labels[name])


def test_tracing_is_hooks_registered_after_the_ones_present_and_undone_alone():
    model = mlp(3, [4], 2, dtype=np.float64)
    layer = next(m for n, m in model.named_modules() if n)
    order = []
    layer.register_forward_pre_hook(lambda m, a: order.append("mine before"))
    layer.register_forward_hook(lambda m, a, o: order.append("mine after"))
    tracer = Events()
    model.trace_layers(tracer, tracing.COMPUTE)
    model.trace_layers(tracer, tracing.COMPUTE)      # again: replaces, does not add
    model.forward(np.ones((2, 3)))
    names = [n for n, _ in model.named_modules()]
    assert sorted(tracer.events) == sorted(f"forward {n}" if n else "forward" for n in names)
    model.trace_layers(tracing.NULL, tracing.COMPUTE)
    model.forward(np.ones((2, 3)))
    assert len(tracer.events) == len(names) and order == ["mine before", "mine after"] * 2
    assert "forward" in vars(layer) and not any("forward" in vars(m) for n, m in model.named_modules() if m is not layer)
