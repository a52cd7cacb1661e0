"""npddp: Distributed Data Parallel training of NumPy neural networks over MPI.

``from npddp import save_checkpoint, load_checkpoint, load_model``: a script's model and optimizer in
the training CLI's checkpoint file, and the model such a file describes (:mod:`npddp.train.checkpoint.saving`),
imported on first use so that ``import npddp`` stays light. The checkpoint layer itself, for any
objects that declare ``state_dict()``, is :mod:`npddp.checkpoint` (``save``, ``load``).
"""

__version__ = "0.1.0"

#: Names importable from the package itself -> the module that defines them.
_EXPORTS = {name: "npddp.train.checkpoint.saving" for name in ("save_checkpoint", "load_checkpoint", "load_model")}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    """``npddp.save_checkpoint``, ``npddp.load_checkpoint`` and ``npddp.load_model``, imported when first asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'npddp' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
