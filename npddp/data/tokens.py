"""Token data for language models: windows of ``context_length + 1`` tokens from a flat stream.

Three sources, all returning a :class:`Dataset` whose rows are sequences: ``X`` (N, T) holds
tokens ``w[:-1]`` of each window and ``y`` (N, T) the next tokens ``w[1:]``; ``num_classes``
is the vocabulary size and ``task`` is ``"language_model"``.

* ``load_token_file(path)``: a flat file of token ids, as nanoGPT stores them (``.bin``: raw
  ``uint16``, read through ``np.memmap``) or a 1-D integer ``.npy`` (memory-mapped); the
  vocabulary is the largest id + 1 unless ``vocab_size`` asks for more.
* ``load_text_file(path)``: the bytes of any file as tokens, vocabulary 256.
* ``synthetic_tokens(...)``: a random Markov chain in which each token is followed by one of
  ``SUCCESSORS`` tokens with the fixed probabilities ``SUCCESSOR_PROBS``, so the best possible
  loss is their entropy (``meta["entropy"]``, about 1.21 nats) instead of ``log(vocab_size)``.

Windows start every ``context_length`` tokens (the last target of one window is the first
input of the next) and the split is by position: the first windows train, the last
``val_fraction`` validate. For files, ``X`` and ``y`` are strided views of the mapped file,
so nothing is read until a batch is gathered.
"""

from __future__ import annotations

import os

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from npddp.data._checks import as_real, check_count, check_seed
from npddp.data.dataset import Dataset

TOKEN_SUFFIXES = (".bin", ".npy")
SUCCESSORS = 4
SUCCESSOR_PROBS = (0.5, 0.25, 0.15, 0.1)


def windows(tokens: np.ndarray, context_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets), each (N, T) views of ``tokens``: N = (len - 1) // T windows, T = context_length."""
    t = context_length
    n = max(len(tokens) - 1, 0) // t
    if n == 0:
        return np.empty((0, t), tokens.dtype), np.empty((0, t), tokens.dtype)
    x = sliding_window_view(tokens[:n * t], t)[::t]                 # (N, T)
    y = sliding_window_view(tokens[1:n * t + 1], t)[::t]            # (N, T)
    return x, y


def _split(name: str, tokens: np.ndarray, context_length: int, vocab: int, val_fraction: float,
           meta: dict) -> Dataset:
    """Windows of ``tokens`` split by position into train and validation."""
    context_length = check_count(context_length, "context_length", 1)
    val_fraction = as_real(val_fraction, "val_fraction")
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must lie in [0, 1), got {val_fraction}")
    x, y = windows(tokens, context_length)
    if len(x) < 1:
        raise ValueError(f"{name}: {len(tokens)} tokens make no window of {context_length} + 1 tokens; "
                         f"use a longer file or a --context-length below {len(tokens)}")
    n_val = min(int(round(len(x) * val_fraction)), len(x) - 1)
    cut = len(x) - n_val
    return Dataset(name, x[:cut], y[:cut], x[cut:], y[cut:], num_classes=vocab, input_shape=(context_length,),
                   task="language_model",
                   meta={**meta, "tokens": int(len(tokens)), "context_length": context_length,
                         "val_fraction": val_fraction})


def _vocab(name: str, tokens: np.ndarray, vocab_size: int, natural: int | None) -> int:
    """``vocab_size`` (0: ``natural``, else the largest id + 1), checked against the ids present."""
    vocab_size = check_count(vocab_size, "vocab_size")
    if natural is None:
        natural = int(tokens.max()) + 1 if len(tokens) else 1
        largest = natural - 1
    else:
        largest = int(tokens.max()) if len(tokens) else 0
    if vocab_size and vocab_size <= largest:
        raise ValueError(f"{name} holds token id {largest}, so vocab_size must be > {largest}, got {vocab_size}")
    return vocab_size or natural


def load_token_file(path, context_length: int, vocab_size: int = 0, val_fraction: float = 0.1) -> Dataset:
    """Windows of a ``.bin`` (raw uint16) or 1-D integer ``.npy`` token file, memory-mapped."""
    path = os.fspath(path)
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in TOKEN_SUFFIXES:
        raise ValueError(f"cannot read tokens from {path!r}: the name must end in {' or '.join(TOKEN_SUFFIXES)}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"token file {os.path.abspath(path)!r} does not exist")
    if suffix == ".bin":
        size = os.path.getsize(path)
        if size < 4 or size % 2:
            raise ValueError(f"{path}: {size} bytes is not a stream of at least two uint16 tokens")
        tokens = np.memmap(path, dtype=np.uint16, mode="r")
    else:
        tokens = np.load(path, mmap_mode="r", allow_pickle=False)
        if tokens.ndim != 1 or tokens.dtype.kind not in "iu":
            raise ValueError(f"{path}: expected a 1-D integer array of token ids, got {tokens.dtype} {tokens.shape}")
        if tokens.dtype.kind == "i" and len(tokens) and tokens.min() < 0:
            raise ValueError(f"{path}: token ids must be >= 0, found {tokens.min()}")
    vocab = _vocab(path, tokens, vocab_size, None)
    return _split(os.path.basename(path), tokens, context_length, vocab, val_fraction,
                  {"path": os.path.abspath(path), "format": suffix[1:]})


def load_text_file(path, context_length: int, vocab_size: int = 0, val_fraction: float = 0.1) -> Dataset:
    """Windows of a file's bytes (vocabulary 256, or ``vocab_size`` if larger), memory-mapped."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"text file {os.path.abspath(path)!r} does not exist")
    if os.path.getsize(path) < 2:
        raise ValueError(f"{path}: a text file needs at least 2 bytes")
    tokens = np.memmap(path, dtype=np.uint8, mode="r")
    vocab = _vocab(path, tokens, vocab_size, 256)
    return _split(os.path.basename(path), tokens, context_length, vocab, val_fraction,
                  {"path": os.path.abspath(path), "format": "bytes"})


def synthetic_tokens(n_train: int = 8192, n_val: int = 512, context_length: int = 64,
                     vocab_size: int = 256, seed: int = 0) -> Dataset:
    """Sequences of a random Markov chain over ``vocab_size`` tokens (see the module docstring).

    Token v is followed by ``(base[v] + offsets[j]) % vocab_size`` with probability
    ``SUCCESSOR_PROBS[j]``: ``base`` a random permutation and ``offsets`` distinct, so the
    successors of a token are distinct. Each sequence starts at a uniformly random token;
    the chain, the training and the validation sequences come from three streams of ``seed``.
    """
    n_train = check_count(n_train, "n_train", 1)
    n_val = check_count(n_val, "n_val")
    t = check_count(context_length, "context_length", 1)
    vocab_size = check_count(vocab_size, "vocab_size", 2)
    chain_ss, train_ss, val_ss = np.random.SeedSequence(check_seed(seed)).spawn(3)
    rng = np.random.default_rng(chain_ss)
    k = min(SUCCESSORS, vocab_size)
    probs = np.array(SUCCESSOR_PROBS[:k]) / sum(SUCCESSOR_PROBS[:k])
    base = rng.permutation(vocab_size)                                     # (V,)
    offsets = rng.choice(vocab_size, size=k, replace=False)                # (k,) distinct
    successor = (base[:, None] + offsets[None, :]) % vocab_size            # (V, k)
    dtype = np.uint16 if vocab_size <= 1 << 16 else np.int64
    cumulative = np.cumsum(probs)[:-1]                                     # (k - 1,)

    def sequences(ss, n: int) -> np.ndarray:
        """(n, T + 1) windows of the chain."""
        r = np.random.default_rng(ss)
        w = np.empty((n, t + 1), dtype=dtype)
        w[:, 0] = r.integers(0, vocab_size, n)
        for i in range(1, t + 1):
            j = np.searchsorted(cumulative, r.random(n), side="right")     # (n,) successor choice
            w[:, i] = successor[w[:, i - 1], j]
        return w

    train, val = sequences(train_ss, n_train), sequences(val_ss, n_val)
    entropy = -float(np.sum(probs * np.log(probs)))
    return Dataset("synthetic-tokens", train[:, :-1], train[:, 1:], val[:, :-1], val[:, 1:],
                   num_classes=vocab_size, input_shape=(t,), task="language_model",
                   meta={"seed": int(seed), "context_length": t, "entropy": entropy,
                         "successors": k})
