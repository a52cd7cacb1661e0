"""DistributedSampler: which dataset rows each rank reads in an epoch.

PyTorch's ``DistributedSampler`` exactly -- the same indices for every rank and epoch,
shuffle order included -- with plain ints for ``num_replicas`` and ``rank`` so it is tested
without MPI (and without torch). ``dataset`` is what PyTorch takes (any object with
``len()``: an array, a Dataset, a list) or the number of rows itself:

* ``num_samples`` = ``ceil((len - N) / N)`` when ``drop_last`` and ``len % N != 0``, else
  ``ceil(len / N)``; ``total_size = num_samples * N``.
* The epoch's order is ``torch.randperm(len)`` from a generator seeded with ``seed + epoch``
  when shuffling (reproduced in NumPy by :func:`npddp.data.randperm.torch_randperm`; checked
  against torch for lengths below 214,748,364), ``range(len)`` otherwise, the same on every rank.
* Without ``drop_last`` the order is padded to ``total_size`` by repeating it from its start
  (several times over when ``total_size - len > len``); with ``drop_last`` it is cut to
  ``total_size``.
* Rank ``r`` takes ``order[r:total_size:N]``.

So ranks read disjoint rows whenever ``len`` divides by ``N`` (or ``drop_last`` is set), and
every row is read at least once per epoch otherwise.
"""

from __future__ import annotations

import operator
from collections.abc import Sized

import numpy as np

from npddp.data._checks import as_int, check_seed
from npddp.data.randperm import torch_randperm
from npddp.util.shown import shown


def dataset_length(dataset) -> int:
    """The rows of ``dataset``: ``len(dataset)``, or the int itself; TypeError (never showing a whole array) otherwise."""
    if isinstance(dataset, Sized) and not isinstance(dataset, (str, bytes)):
        try:
            return len(dataset)
        except TypeError:      # a 0-d array is Sized by type but has no length
            pass
    elif not isinstance(dataset, (str, bytes, bool, np.bool_)):
        try:
            return operator.index(dataset)
        except TypeError:
            pass
    raise TypeError(f"dataset must be a sized object (len() gives its rows) or an int, got "
                    f"{type(dataset).__name__} {shown(dataset)}")


class DistributedSampler:
    """Per-rank dataset indices for one epoch, padded or truncated to an equal count per rank."""

    def __init__(self, dataset, num_replicas: int, rank: int, shuffle: bool = True,
                 seed: int = 0, drop_last: bool = False):
        self.dataset_len = dataset_length(dataset)
        if self.dataset_len < 0:
            raise ValueError(f"dataset_len must be >= 0, got {self.dataset_len}")
        self.num_replicas = as_int(num_replicas, "num_replicas")
        if self.num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {self.num_replicas}")
        self.rank = as_int(rank, "rank")
        if not 0 <= self.rank < self.num_replicas:
            raise ValueError(f"rank must satisfy 0 <= rank < num_replicas={self.num_replicas}, "
                             f"got {self.rank}")
        self.seed = check_seed(seed)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self._shuffled: tuple[int, np.ndarray] | None = None       # (seed + epoch, its permutation)
        n, reps = self.dataset_len, self.num_replicas
        # ceil((n - N) / N) == n // N when N does not divide n; ceil(n / N) == -(-n // N).
        self.num_samples = n // reps if self.drop_last else -(-n // reps)
        self.total_size = self.num_samples * reps

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order ``indices()`` returns (seeds the shuffle with seed + epoch)."""
        epoch = as_int(epoch, "epoch")
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = epoch

    def order(self) -> np.ndarray:
        """The whole epoch's order before padding or truncation, identical on all ranks (a fresh array)."""
        if not self.shuffle:
            return np.arange(self.dataset_len, dtype=np.int64)
        key = self.seed + self.epoch
        if self._shuffled is None or self._shuffled[0] != key:      # computed once per epoch
            self._shuffled = (key, torch_randperm(self.dataset_len, key))
        return self._shuffled[1].copy()

    def indices(self) -> np.ndarray:
        """This rank's indices for the current epoch as a fresh int64 array of ``num_samples``."""
        if self.num_samples == 0:
            return np.empty(0, dtype=np.int64)
        order = self.order().astype(np.int64, copy=False)  # (len,)
        # Position p of the padded order holds order[p % len]: padding repeats from the start.
        positions = np.arange(self.rank, self.total_size, self.num_replicas, dtype=np.int64)
        return order[positions % self.dataset_len]  # (num_samples,)

    def __iter__(self):
        """Yield this rank's indices for the current epoch as Python ints."""
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples

    def state_dict(self) -> dict:
        """What a checkpoint needs to reproduce the order: epoch and seed."""
        return {"epoch": self.epoch, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``epoch`` and ``seed`` from ``state_dict()``; the rest comes from the constructor."""
        missing = {"epoch", "seed"} - set(state)
        if missing:
            raise KeyError(f"sampler state lacks {sorted(missing)}; expected keys ['epoch', 'seed']")
        seed = check_seed(state["seed"])
        self.set_epoch(state["epoch"])
        self.seed = seed

    def __repr__(self) -> str:
        return (f"DistributedSampler(dataset_len={self.dataset_len}, num_replicas={self.num_replicas}, "
                f"rank={self.rank}, shuffle={self.shuffle}, seed={self.seed}, "
                f"drop_last={self.drop_last}, epoch={self.epoch})")
