"""The models the training CLI builds by name (``--model``): a registry of builders.

A builder takes the run's settings (a mapping with at least ``hidden``, ``channels``,
``dtype`` and ``seed``: the CLI's config or the one a checkpoint stores), the shape of one
input row and the number of classes, and returns the network and a one-line description.
The same settings build bit-identical weights on every rank. To add a model, write a
builder and decorate it with ``@register("name", ...)``; ``MODELS`` (the ``--model``
choices) follows.

``--dropout P`` inserts a ``Dropout`` after every ReLU that feeds a ``Linear`` (see
:func:`insert_dropout`); each rank and layer draws its masks from its own stream seeded by
``(seed, rank, layer)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from npddp.nn import Dropout, Linear, ReLU, Sequential, cnn, gpt_preset, mlp
from npddp.util.registry import Registry


@dataclass(frozen=True)
class ModelKind:
    """How to build one kind of model, and what input rows it takes."""

    build: Callable          # (settings, input_shape, num_classes, dtype) -> (Sequential, description)
    flatten: bool            # feed rows flattened to (N, features)
    image_input: bool        # needs rows of shape (C, H, W)


#: name -> ModelKind, in registration order.
REGISTRY = Registry("model")


def register(name: str, *, flatten: bool = False, image_input: bool = False):
    """Decorator adding a builder to :data:`REGISTRY` under ``name``."""
    def add(fn):
        REGISTRY.add(name, ModelKind(fn, flatten, image_input))
        return fn
    return add


def _widths(values) -> str:
    return "-".join(str(w) for w in values)


@register("mlp", flatten=True)
def _mlp(settings: Mapping, input_shape, num_classes: int, dtype):
    """Linear+ReLU layers of widths ``hidden``."""
    features = int(np.prod(input_shape))
    net = mlp(features, list(settings["hidden"]), num_classes, dtype=dtype, seed=int(settings["seed"]))
    return net, "mlp " + _widths((features, *settings["hidden"], num_classes))


@register("cnn", image_input=True)
def _cnn(settings: Mapping, input_shape, num_classes: int, dtype):
    """3x3 conv + ReLU + 2x2 max-pool stages of ``channels``, then a dense head of ``hidden``."""
    net = cnn(tuple(input_shape), list(settings["channels"]), list(settings["hidden"]), num_classes,
              dtype=dtype, seed=int(settings["seed"]))
    return net, (f"cnn {tuple(input_shape)}, conv {_widths(settings['channels'])}, dense "
                 f"{_widths((*settings['hidden'], num_classes))}")


@register("gpt")
def _gpt(settings: Mapping, input_shape, num_classes: int, dtype):
    """A GPT preset (``model_size``) over ``num_classes`` tokens, sequences of ``input_shape[0]`` tokens."""
    size, context = settings.get("model_size", "tiny"), int(input_shape[0])
    experts = int(settings.get("moe_experts", 0))
    moe = {"num_experts": experts, "top_k": int(settings.get("moe_top_k", 1)),
           "capacity_factor": float(settings.get("moe_capacity", 1.25)),
           "aux_coef": float(settings.get("moe_aux", 0.01))} if experts else None
    net = gpt_preset(size, num_classes, context, dtype=dtype, seed=int(settings["seed"]), moe=moe)
    c = net.config
    mix = f", {experts} experts (top-{moe['top_k']})" if moe else ""
    return net, (f"gpt {size} (d_model {c['d_model']}, {c['num_layers']} layers, {c['num_heads']} heads, "
                 f"d_ff {c['d_ff']}{mix}), vocab {c['vocab_size']}, context {context}, tied LM head")


MODELS = REGISTRY.names()
#: Parameter dtypes the training CLI offers.
DTYPES = ("float32", "float64")


def input_problem(name: str, input_shape) -> str | None:
    """Why rows of ``input_shape`` cannot feed model ``name``, or None."""
    if REGISTRY.get(name).image_input and len(input_shape) != 3:
        return (f"--model {name} needs image rows (C, H, W), but the data has rows of shape "
                f"{tuple(input_shape)}; use --model mlp or an image data set")
    return None


def insert_dropout(net: Sequential, p: float, seed: int, rank: int) -> tuple[Sequential, list[Dropout]]:
    """``net`` with a Dropout(p) after each ReLU that feeds a Linear; (new net, its Dropout layers)."""
    layers, dropouts = [], []
    for i, layer in enumerate(net.layers):
        layers.append(layer)
        if isinstance(layer, ReLU) and i + 1 < len(net.layers) and isinstance(net.layers[i + 1], Linear):
            stream = int(np.random.SeedSequence([seed, rank, len(dropouts)]).generate_state(1)[0])
            dropouts.append(Dropout(p, seed=stream))
            layers.append(dropouts[-1])
    return Sequential(*layers), dropouts


def build_model(settings: Mapping, input_shape, num_classes: int, rank: int = 0):
    """(model, its Dropout layers, a one-line description) for ``settings["model"]``.

    ValueError or TypeError when the settings do not fit the data (e.g. images too small).
    """
    name = settings["model"]
    kind = REGISTRY.get(name)   # ValueError naming the valid ones
    dtype = np.dtype(settings.get("dtype", "float32"))
    net, text = kind.build(settings, tuple(input_shape), int(num_classes), dtype)
    dropouts = []
    p = float(settings.get("dropout", 0.0) or 0.0)
    if p > 0:
        net, dropouts = insert_dropout(net, p, int(settings["seed"]), rank)
        text += f", dropout {p}"
    return net, dropouts, text


def shape_rows(name: str, X: np.ndarray) -> np.ndarray:
    """``X`` as model ``name`` takes it: flattened to (N, features) for models that want that."""
    return X.reshape(len(X), -1) if REGISTRY.get(name).flatten else X
