"""Mini-batches in sampler order, with resume from a batch offset inside an epoch.

``iterate_batches(X, y, indices, batch_size)`` yields ``(X[idx], y[idx])`` for consecutive
slices ``idx`` of ``indices``; ``BatchLoader`` wraps it around a ``DistributedSampler`` so a
training loop reads::

    loader = BatchLoader(ds.X_train, ds.y_train, sampler, batch_size=64)
    for epoch in range(start_epoch, epochs):
        loader.set_epoch(epoch)
        for xb, yb in loader.batches(start_batch=resume_step if epoch == start_epoch else 0):
            ...

With ``reuse_buffers=True`` every batch is gathered by ``np.take(..., out=)`` into the same
two arrays, so a batch is only valid until the next one is drawn.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from npddp.data._checks import as_int


def num_batches(num_indices: int, batch_size: int, drop_last: bool = False) -> int:
    """How many batches ``num_indices`` rows make: the last partial one counts unless ``drop_last``."""
    num_indices = as_int(num_indices, "num_indices")
    if num_indices < 0:
        raise ValueError(f"num_indices must be >= 0, got {num_indices}")
    batch_size = _check_batch_size(batch_size)
    return num_indices // batch_size if drop_last else -(-num_indices // batch_size)


def _check_batch_size(batch_size) -> int:
    """``batch_size`` as an int >= 1, or a TypeError/ValueError naming it."""
    batch_size = as_int(batch_size, "batch_size")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return batch_size


def _check_arrays(X, y) -> None:
    """X and y must be arrays with the same number of rows."""
    for what, arr in (("X", X), ("y", y)):
        if not isinstance(arr, np.ndarray) or arr.ndim < 1:
            raise TypeError(f"{what} must be a numpy.ndarray with at least one dimension, "
                            f"got {type(arr).__name__}{getattr(arr, 'shape', '')}")
    if len(X) != len(y):
        raise ValueError(f"X and y must have the same number of rows, got {len(X)} and {len(y)}")


def _check_indices(indices, num_rows: int) -> np.ndarray:
    """``indices`` as a 1-D int64 array of row numbers in ``[0, num_rows)``."""
    idx = np.asarray(indices)
    if idx.ndim != 1 or not (np.issubdtype(idx.dtype, np.integer) or idx.size == 0):
        raise TypeError(f"indices must be a 1-D integer array, got dtype {idx.dtype} shape {idx.shape}")
    idx = idx.astype(np.int64, copy=False)
    if idx.size and (idx.min() < 0 or idx.max() >= num_rows):
        bad = idx[(idx < 0) | (idx >= num_rows)][0]
        raise ValueError(f"index {bad} out of range: indices must lie in [0, {num_rows})")
    return idx


def iterate_batches(X: np.ndarray, y: np.ndarray, indices, batch_size: int, drop_last: bool = False,
                    start_batch: int = 0, reuse_buffers: bool = False
                    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(X[idx], y[idx])`` per ``batch_size`` slice of ``indices``, from batch ``start_batch``."""
    _check_arrays(X, y)
    idx = _check_indices(indices, len(X))
    batch_size = _check_batch_size(batch_size)
    total = num_batches(idx.size, batch_size, drop_last)
    start_batch = as_int(start_batch, "start_batch")
    if not 0 <= start_batch <= total:
        raise ValueError(f"start_batch must satisfy 0 <= start_batch <= {total} (batches this epoch), "
                         f"got {start_batch}")
    return _batches(X, y, idx, batch_size, start_batch, total, reuse_buffers)


def _batches(X, y, idx, batch_size, start_batch, total, reuse_buffers):
    """The generator behind ``iterate_batches`` (arguments already checked)."""
    if reuse_buffers:
        xbuf = np.empty((batch_size,) + X.shape[1:], dtype=X.dtype)  # (B, *features)
        ybuf = np.empty((batch_size,) + y.shape[1:], dtype=y.dtype)  # (B, *targets)
    for b in range(start_batch, total):
        rows = idx[b * batch_size:(b + 1) * batch_size]  # (m,), m <= B
        if reuse_buffers:
            m = rows.size
            yield (np.take(X, rows, axis=0, out=xbuf[:m]),   # (m, *features)
                   np.take(y, rows, axis=0, out=ybuf[:m]))   # (m, *targets)
        else:
            yield X[rows], y[rows]


class BatchLoader:
    """Batches of (X, y) in a sampler's order; ``len()`` is the number of batches per epoch."""

    def __init__(self, X: np.ndarray, y: np.ndarray, sampler, batch_size: int,
                 drop_last: bool = False, reuse_buffers: bool = False):
        _check_arrays(X, y)
        if not hasattr(sampler, "indices") or not hasattr(sampler, "__len__"):
            raise TypeError(f"sampler must have indices() and __len__ (e.g. DistributedSampler), "
                            f"got {type(sampler).__name__}")
        self.X, self.y, self.sampler = X, y, sampler
        self.batch_size = _check_batch_size(batch_size)
        self.drop_last = bool(drop_last)
        self.reuse_buffers = bool(reuse_buffers)

    def set_epoch(self, epoch: int) -> None:
        """Pass the epoch on to the sampler (a new shuffle order)."""
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return num_batches(len(self.sampler), self.batch_size, self.drop_last)

    def batches(self, start_batch: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """This epoch's batches, skipping the first ``start_batch`` (resume mid-epoch)."""
        return iterate_batches(self.X, self.y, self.sampler.indices(), self.batch_size,
                               drop_last=self.drop_last, start_batch=start_batch,
                               reuse_buffers=self.reuse_buffers)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return self.batches()
