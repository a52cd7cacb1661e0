"""npddp: Distributed Data Parallel training of NumPy neural networks over MPI.

``from npddp import save_checkpoint, load_checkpoint``: a script's model and optimizer in the
training CLI's checkpoint file (:mod:`npddp.train.checkpoint.saving`), imported on first use so that
``import npddp`` stays light.
"""

__version__ = "0.1.0"

#: Names importable from the package itself -> the module that defines them.
_EXPORTS = {"save_checkpoint": "npddp.train.checkpoint.saving", "load_checkpoint": "npddp.train.checkpoint.saving"}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    """``npddp.save_checkpoint`` and ``npddp.load_checkpoint``, imported when first asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'npddp' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
