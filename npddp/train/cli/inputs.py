"""The data a run trains or evaluates on, from its settings: one message instead of a traceback.

:func:`load_data` turns ``--dataset``/``--data-dir``/``--x-key``/``--y-key``/``--normalize`` and
the row counts (a mapping: the CLI's config or the one a checkpoint stores) into a
:class:`~npddp.data.Dataset`, or a one-line reason it cannot. It reads files only on the
rank that calls it; the faces share the verdict so every rank stops together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from npddp.data import DataFileError, load_dataset, normalize, unscaled_reason
from npddp.train.models import input_problem

#: Default (train, val) rows of the synthetic sets.
SYNTHETIC_ROWS = {"synthetic": (32768, 1024), "synthetic-image": (8192, 1024), "synthetic-tokens": (8192, 512)}

#: What a data set that cannot be read raises (beyond the loaders' own ValueError/TypeError).
_LOAD_ERRORS = (OSError, ValueError, TypeError, KeyError, ImportError, DataFileError)


def dataset_name(settings: Mapping) -> str:
    """``dataset``, or the default for the model."""
    name = settings.get("dataset")
    if name:
        return name
    return {"cnn": "synthetic-image", "gpt": "synthetic-tokens"}.get(settings.get("model"), "synthetic")


def load_data(settings: Mapping, *, check_sizes: bool = True):
    """(Dataset, None), or (None, a one-line message) when it cannot be loaded or does not fit the model.

    ``settings`` needs ``dataset``, ``model``, ``dtype``; optionally ``data_dir``, ``x_key``,
    ``y_key``, ``normalize``, ``train_samples``, ``val_samples``.
    """
    name = dataset_name(settings)
    train_rows, val_rows = int(settings.get("train_samples") or 0), int(settings.get("val_samples") or 0)
    kwargs = {}
    if name in SYNTHETIC_ROWS:
        kwargs = {"n_train": train_rows or SYNTHETIC_ROWS[name][0], "n_val": val_rows or SYNTHETIC_ROWS[name][1]}
    elif name == "digits" and settings.get("model") == "cnn":
        kwargs = {"as_images": True}
    elif name not in ("digits", "mnist") and settings.get("model") != "gpt":
        kwargs = {"x_key": settings.get("x_key", "X"), "y_key": settings.get("y_key", "y")}
    language_model = settings.get("model") == "gpt"
    if language_model:                       # token data: windows of context_length + 1 tokens
        vocab = int(settings.get("vocab_size") or 0)
        kwargs["context_length"] = int(settings.get("context_length") or 64)
        kwargs["vocab_size"] = vocab or 256 if name == "synthetic-tokens" else vocab
    try:
        ds = load_dataset(name, data_dir=settings.get("data_dir"), seed=0,
                          dtype=np.dtype(settings.get("dtype", "float32")), **kwargs)
    except _LOAD_ERRORS as exc:
        text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        return None, f"--dataset {name}: {text}"
    if ds.task != ("language_model" if language_model else "classification"):
        return None, (f"--dataset {name} holds float targets; npddp trains classifiers, "
                      "so the labels must be integers")
    if check_sizes:
        for what, count, have in (("train", train_rows, ds.n_train), ("val", val_rows, ds.n_val)):
            if count > have:
                return None, f"--{what}-samples {count} exceeds the {have} {what} rows of --dataset {name}"
        cut = {"X_train": ds.X_train[:train_rows or None], "y_train": ds.y_train[:train_rows or None],
               "X_val": ds.X_val[:val_rows or None], "y_val": ds.y_val[:val_rows or None]}
        ds = dataclasses.replace(ds, **cut)                  # the first rows of each split
    problem = input_problem(settings.get("model", "mlp"), ds.input_shape)
    if problem:
        return None, f"{problem} (--dataset {name})"
    if language_model:
        return ds, None
    return normalize(ds, settings.get("normalize", "none") or "none"), None


def scaling_warning(ds, settings: Mapping) -> str | None:
    """A warning when inputs look unscaled and --normalize is off, else None."""
    if (settings.get("normalize") or "none") != "none" or ds.task == "language_model":
        return None
    why = unscaled_reason(ds)
    if why is None:
        return None
    return (f"--dataset {ds.name}: {why}, which looks unscaled; training may diverge or stall at "
            f"chance accuracy. Rescale on load with --normalize standard (or unit, for [0, 1])")
