"""PyTorch's CPU ``torch.randperm(n, generator=g)`` after ``g.manual_seed(seed)``, in NumPy.

PyTorch's CPU generator is a 32-bit Mersenne Twister (MT19937) seeded with the standard
``init_genrand`` of the seed's low 32 bits -- the seeding NumPy's legacy ``RandomState(int)``
uses -- and ``randperm`` shuffles ``0..n-1`` in place:

* for ``n`` below ``(2**32 - 1) // 20`` (214,748,364): for ``i`` in ``0..n-2``, draw one 32-bit
  output ``r`` and swap positions ``i`` and ``i + r % (n - i)``;
* above that: the "inside-out" shuffle, for ``i`` in ``0..n-1`` drawing a 64-bit value from
  two outputs (the first the high word) and placing ``i`` at ``r % (i + 1)``.

The first branch is checked against torch itself in ``tests/data/test_sampler.py`` (when torch
is installed); the second is written from the same source but too large to check in a test.
The swaps run in a Python loop over precomputed draws: about 0.1 s per million rows.
"""

from __future__ import annotations

import numpy as np

#: ``n`` from which PyTorch switches to the 64-bit inside-out shuffle.
LARGE_N = (2**32 - 1) // 20


def _mt19937(seed: int) -> np.random.MT19937:
    """A Mersenne Twister in the state ``init_genrand(seed & 0xFFFFFFFF)`` leaves it."""
    _, key, pos, *_ = np.random.RandomState(seed & 0xFFFFFFFF).get_state()
    bits = np.random.MT19937()
    bits.state = {"bit_generator": "MT19937", "state": {"key": key, "pos": pos}}
    return bits


def torch_randperm(n: int, seed: int) -> np.ndarray:
    """The permutation ``torch.randperm(n)`` draws from a CPU generator seeded with ``seed``, as int64."""
    if n < 0 or seed < 0:
        raise ValueError(f"n and seed must be >= 0, got n={n}, seed={seed}")
    if n < 2:
        return np.arange(n, dtype=np.int64)
    bits = _mt19937(seed)
    if n < LARGE_N:
        draws = bits.random_raw(n - 1)                                          # (n-1,) uint64 holding 32 bits
        targets = (draws % np.arange(n, 1, -1, dtype=np.uint64)).astype(np.int64) + np.arange(n - 1)
        order = list(range(n))
        for i, j in enumerate(targets.tolist()):
            order[i], order[j] = order[j], order[i]
        return np.array(order, dtype=np.int64)
    words = bits.random_raw(2 * n).reshape(n, 2)                                # (n, 2): high, low
    draws = (words[:, 0] << np.uint64(32)) | words[:, 1]
    targets = (draws % np.arange(1, n + 1, dtype=np.uint64)).astype(np.int64)
    order = np.empty(n, dtype=np.int64)
    out = order.tolist()
    for i, z in enumerate(targets.tolist()):
        out[i] = out[z]
        out[z] = i
    return np.array(out, dtype=np.int64)
