"""Model builders (``mlp``, ``cnn``) and a one-table ``summary``.

Both builders draw every initial weight from one ``np.random.default_rng(seed)`` in layer
order, so the same arguments give bit-identical models on every rank.  Hidden layers are
He-normal (they feed a ReLU), the output layer LeCun-normal, biases zero.  The first layer
skips dL/dinput by default (``input_grad=False``): its input is data, and the matmul saved
is a sizeable share of a small model's backward; ``model.backward`` then returns None.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from npddp.nn._check import check_dtype_arg, check_positive_int
from npddp.nn.conv import Conv2d
from npddp.nn.layers import Flatten, Linear, ReLU
from npddp.nn.module import Module, Sequential
from npddp.nn.pool import MaxPool2d


def _widths(name: str, values) -> list[int]:
    """A sequence of positive ints (a bare int is one width)."""
    if isinstance(values, (int, np.integer)) and not isinstance(values, bool):
        values = [values]
    if not isinstance(values, Sequence) or isinstance(values, str):
        raise ValueError(f"{name} must be a sequence of positive integers, got {values!r}")
    return [check_positive_int(f"{name}[{i}]", v) for i, v in enumerate(values)]


def _dense(widths: list[int], out_features: int, dtype, rng, input_grad: bool) -> list[Module]:
    """``Linear -> ReLU`` between consecutive ``widths``, then ``Linear`` to ``out_features``."""
    layers: list[Module] = []
    for i in range(len(widths) - 1):
        layers += [Linear(widths[i], widths[i + 1], dtype=dtype, rng=rng,
                          input_grad=input_grad or i > 0), ReLU()]
    layers.append(Linear(widths[-1], out_features, dtype=dtype, rng=rng, init="lecun_normal",
                         input_grad=input_grad or len(widths) > 1))
    return layers


def mlp(in_features: int, hidden: Sequence[int], out_features: int, *, dtype=np.float32,
        seed: int = 0, input_grad: bool = False) -> Sequential:
    """``Linear -> ReLU`` for each hidden width, then ``Linear`` to ``out_features``."""
    dtype = check_dtype_arg(dtype)
    widths = [check_positive_int("in_features", in_features), *_widths("hidden", hidden)]
    out_features = check_positive_int("out_features", out_features)
    return Sequential(*_dense(widths, out_features, dtype, np.random.default_rng(seed), input_grad))


def cnn(in_shape: Sequence[int], channels: Sequence[int], hidden: Sequence[int], num_classes: int,
        *, dtype=np.float32, seed: int = 0, input_grad: bool = False) -> Sequential:
    """Per stage ``Conv2d 3x3 pad 1 -> ReLU -> MaxPool2d 2``, then Flatten, MLP head.

    ``in_shape`` is (C, H, W); each stage halves H and W (rounding down), so H and W must be
    at least 2**len(channels).
    """
    dtype = check_dtype_arg(dtype)
    if not isinstance(in_shape, Sequence) or len(in_shape) != 3:
        raise ValueError(f"in_shape must be (C, H, W), got {in_shape!r}")
    c, h, w = (check_positive_int(f"in_shape[{i}]", v) for i, v in enumerate(in_shape))
    chans = _widths("channels", channels)
    if not chans:
        raise ValueError("channels must name at least one convolution stage")
    if min(h, w) < 2 ** len(chans):
        raise ValueError(f"in_shape {tuple(in_shape)} is too small for {len(chans)} pooling stages: "
                         f"H and W must be >= {2 ** len(chans)}")
    rng = np.random.default_rng(seed)
    layers: list[Module] = []
    for i, out_c in enumerate(chans):
        layers += [Conv2d(c, out_c, 3, padding=1, dtype=dtype, rng=rng, input_grad=input_grad or i > 0),
                   ReLU(), MaxPool2d(2)]
        c, h, w = out_c, h // 2, w // 2
    layers.append(Flatten())
    layers += _dense([c * h * w, *_widths("hidden", hidden)],
                     check_positive_int("num_classes", num_classes), dtype, rng, True)
    return Sequential(*layers)


def summary(model: Module) -> str:
    """A table of leaf layers with their parameter shapes and counts, then the totals."""
    rows = [("layer", "module", "parameters", "count")]
    owner: dict[int, str] = {}              # id(parameter) -> the layer that lists it first

    def walk(prefix: str, m: Module) -> None:
        kids = list(m.children())
        if not kids:
            name = prefix or "(model)"
            params = [p for _, p in m.named_parameters()]
            shared = [p for p in params if owner.setdefault(id(p), name) != name]
            shapes = ", ".join(f"{tuple(p.shape)}" + (f" shared with {owner[id(p)]}" if p in shared else "")
                               for p in params)
            count = sum(p.data.size for p in params if p not in shared)
            rows.append((name, repr(m), shapes or "-", str(count)))
        for name, child in kids:
            walk(f"{prefix}.{name}" if prefix else name, child)

    walk("", model)
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(r[i].ljust(widths[i]) if i < 3 else r[i].rjust(widths[i]) for i in range(4))
             for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    dtypes = sorted({p.dtype.name for p in model.parameters()})
    lines.append(f"total: {model.num_parameters():,} parameters, {model.num_bytes():,} bytes "
                 f"({'/'.join(dtypes) or 'no parameters'}; gradients take as much again)")
    return "\n".join(lines)
