"""npddp: Distributed Data Parallel training of NumPy neural networks over MPI or TCP.

What a training script imports, as ``torch.distributed`` and ``torch.nn.parallel`` give it::

    import npddp
    comm = npddp.create("ring")                            # a communicator (npddp.comm)
    ddp = npddp.DistributedDataParallel(model, comm)       # or ZeRO: ZeroRedundancyOptimizer, ZeroDataParallel
    npddp.save_checkpoint("run.h5", ddp, opt, ...)         # the training CLI's checkpoint file
    model = npddp.load_model("run.h5")                     # the model such a file describes

Each name is imported on first use, so ``import npddp`` stays light (no NumPy model, no MPI). The
subpackages hold the rest: :mod:`npddp.comm` (communicators, algorithms, transports),
:mod:`npddp.parallel` (DDP, ZeRO, comm hooks, model averagers, tensor and pipeline parallelism),
:mod:`npddp.checkpoint` (``save``/``load`` of any objects that declare ``state_dict()``),
:mod:`npddp.nn`, :mod:`npddp.optim`, :mod:`npddp.data` and :mod:`npddp.results` (benchmark dumps).
"""

__version__ = "0.1.0"

#: Names importable from the package itself -> the module that defines them.
_EXPORTS = {
    "create": "npddp.comm",
    "DistributedDataParallel": "npddp.parallel.ddp",
    "ZeroRedundancyOptimizer": "npddp.parallel.zero",
    "ZeroDataParallel": "npddp.parallel.zero",
    "ShardedOptimizer": "npddp.parallel.zero",
    "DistributedSampler": "npddp.data.sampler",
    "save_checkpoint": "npddp.train.checkpoint.saving",
    "load_checkpoint": "npddp.train.checkpoint.saving",
    "load_model": "npddp.train.checkpoint.saving",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    """The names of ``_EXPORTS``, each imported from its module when first asked for."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'npddp' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    """The module's own names and the lazily imported ones."""
    return sorted({*globals(), *_EXPORTS})
