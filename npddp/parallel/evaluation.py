"""Evaluation at forward speed: rows split over ranks, forward passes without gradients, batches sized by memory.

:func:`evaluate_rows` is a data-parallel engine's ``evaluate`` (the validation of
``python -m npddp.train``) and the body of ``python -m npddp.evaluate``. Rank r takes rows r::size and passes them through the model
under :meth:`~npddp.nn.Module.no_grad` (no activation kept for a backward, no gradient
touched), scoring each batch with :meth:`~npddp.nn.CrossEntropyLoss.score`; one reduction then
sums (loss sum, correct, rows) over ranks, so every row counts once and every rank gets the
totals one process would. Every rank makes the same number of forward calls (ZeRO-3 gathers
parameters inside each one): its share is cut into that many nearly equal parts, and a rank
without rows still passes empty batches through.

The batch comes from memory, not a constant: :func:`forward_bytes_per_row` measures the peak
NumPy allocates during forward passes of 2 and 4 rows (``tracemalloc``), and :func:`batch_for`
fits the rows in :data:`WORKING_SET` bytes. A forward pass larger than the caches spends its
time faulting in fresh pages and streaming memory, not computing: the tiny GPT at context 128
ran 1.7x slower per sequence with 512 sequences per pass than with 32 on one core.
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np

from npddp.nn import CrossEntropyLoss

#: Bytes one evaluation forward pass may hold at its peak: a quarter of a 32 MiB last-level cache,
#: so that the passes of two ranks sharing it stay in it (the tiny GPT, 2 ranks on 2 cores: 8-16
#: sequences a pass ran 1.2-1.3x faster than 33, 2-2.5x faster than 512).
WORKING_SET = 8 << 20
#: Rows of the two probe passes of :func:`forward_bytes_per_row`.
PROBE_ROWS = (2, 4)


def _peak_bytes(model, rows: np.ndarray) -> int:
    """Peak bytes traced while ``model`` runs forward on ``rows`` without gradients (tracemalloc running)."""
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    with model.no_grad():
        model.forward(rows)
    return tracemalloc.get_traced_memory()[1] - base


def forward_bytes_per_row(model, X: np.ndarray) -> int:
    """Bytes a row adds to the peak of a forward pass without gradients, measured on the first rows of ``X``.

    The difference between passes of 2 and 4 rows (fewer if ``X`` is shorter) after one unmeasured
    pass, so what does not grow with the batch (parameters gathered, masks, scratch) cancels. At least 1.
    """
    small, large = (min(k, len(X)) for k in PROBE_ROWS)
    if large <= small:
        return 1
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        _peak_bytes(model, X[:small])        # a first pass makes what later ones reuse (ZeRO-3's gather buffers)
        grow = _peak_bytes(model, X[:large]) - _peak_bytes(model, X[:small])
    finally:
        if not tracing:
            tracemalloc.stop()
    return max(1, grow // (large - small))


def batch_for(bytes_per_row: int, budget: int = WORKING_SET) -> int:
    """Rows per forward pass that fit ``budget`` bytes at ``bytes_per_row`` (at least 1)."""
    return max(1, budget // max(1, int(bytes_per_row)))


def agreed_batch(comm, model, X: np.ndarray) -> int:
    """:func:`batch_for` the largest :func:`forward_bytes_per_row` over ranks (collective: one all-reduce)."""
    need = np.array([forward_bytes_per_row(model, X)], dtype=np.int64)
    return batch_for(int(comm.allreduce(need, op="max")[0]))


def _parts(most: int, fewest: int, batch: int) -> int:
    """Forward passes per rank: enough for ``most`` rows in passes of ``batch``, at most ``fewest`` (one if none)."""
    return max(1, min(math.ceil(most / batch), fewest))


def evaluate_rows(model, X: np.ndarray, y: np.ndarray, rank: int, size: int, batch: int, reduce,
                  loss_fn=None) -> np.ndarray:
    """(loss sum, correct, rows) over all ranks; rank r evaluates rows r::size, ``reduce`` sums over ranks.

    Collective: every rank calls it with the same rows and ``batch``. The model's training mode
    is left as it is (call ``eval()`` first to turn dropout off). ``loss_fn``: a CrossEntropyLoss
    (its ``score``), a new one when None.
    """
    loss_fn, sums = CrossEntropyLoss() if loss_fn is None else loss_fn, np.zeros(3)
    idx = np.arange(rank, len(X), size)
    most, fewest = -(-len(X) // size), len(X) // size
    with model.no_grad():
        for part in np.array_split(idx, _parts(most, fewest, batch)):
            xb, yb = np.take(X, part, axis=0), np.take(y, part, axis=0)
            logits = model.forward(xb)                                        # (b, classes) or (b, T, vocab)
            if len(part):
                loss, correct = loss_fn.score(logits, yb)
                sums += (loss * len(yb), correct / yb[0].size, len(yb))
    return reduce(sums)
