"""Token data: windows over a flat stream, .bin/.npy/text files (memory-mapped), the Markov chain set."""

import math

import numpy as np
import pytest

from npddp.data import BatchLoader, DistributedSampler, load_dataset, load_text_file, load_token_file, synthetic_tokens, windows


@pytest.mark.parametrize("n,t", [(11, 5), (10, 3), (2, 1), (50, 7)])
def test_windows_are_views_of_next_token_pairs(n, t):
    tokens = np.arange(n, dtype=np.uint16) * 3
    x, y = windows(tokens, t)
    assert x.shape == y.shape == ((n - 1) // t, t)
    assert np.shares_memory(x, tokens) and np.shares_memory(y, tokens)
    for i in range(len(x)):
        np.testing.assert_array_equal(x[i], tokens[i * t:(i + 1) * t])
        np.testing.assert_array_equal(y[i], tokens[i * t + 1:(i + 1) * t + 1])


def test_bin_file_is_memory_mapped_and_split_by_position(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 1000, 1001).astype(np.uint16)
    path = tmp_path / "train.bin"
    tokens.tofile(path)
    ds = load_token_file(path, context_length=10, val_fraction=0.1)
    assert ds.task == "language_model" and ds.num_classes == int(tokens.max()) + 1
    assert (ds.n_train, ds.n_val) == (90, 10) and ds.input_shape == (10,)
    assert isinstance(ds.X_train.base, np.ndarray) and not ds.X_train.flags.owndata
    np.testing.assert_array_equal(ds.X_train[0], tokens[:10])
    np.testing.assert_array_equal(ds.y_val[-1], tokens[991:1001])
    # a batch gathered into reused buffers, as the training loop does it
    loader = BatchLoader(ds.X_train, ds.y_train, DistributedSampler(ds.n_train, 2, 1, shuffle=True, seed=3),
                         batch_size=4, reuse_buffers=True)
    xb, yb = next(iter(loader))
    rows = DistributedSampler(ds.n_train, 2, 1, shuffle=True, seed=3).indices()[:4]
    np.testing.assert_array_equal(xb, ds.X_train[rows])
    np.testing.assert_array_equal(yb[:, :-1], xb[:, 1:])
    assert xb.dtype == np.uint16


def test_npy_and_text_files_and_vocab_size(tmp_path):
    ids = np.arange(40, dtype=np.int32) % 7
    np.save(tmp_path / "ids.npy", ids)
    ds = load_token_file(tmp_path / "ids.npy", context_length=4, vocab_size=16, val_fraction=0.0)
    assert ds.num_classes == 16 and ds.n_val == 0 and ds.n_train == 9
    (tmp_path / "t.txt").write_bytes(b"hello, world\n" * 5)
    text = load_text_file(tmp_path / "t.txt", context_length=8)
    assert text.num_classes == 256 and text.X_train.dtype == np.uint8
    assert bytes(text.X_train[0]) == b"hello, w"
    via_name = load_dataset(f"text:{tmp_path / 't.txt'}", context_length=8)
    np.testing.assert_array_equal(via_name.X_train, text.X_train)
    rel = load_dataset("tokens:ids.npy", data_dir=str(tmp_path), context_length=4)
    assert rel.num_classes == 7


@pytest.mark.parametrize("setup,kwargs,error,text", [
    (lambda p: np.zeros(3, np.uint16).tofile(p / "a.dat"), dict(path="a.dat"), ValueError, ".bin or .npy"),
    (lambda p: None, dict(path="missing.bin"), FileNotFoundError, "does not exist"),
    (lambda p: (p / "odd.bin").write_bytes(b"abc"), dict(path="odd.bin"), ValueError, "uint16 tokens"),
    (lambda p: np.save(p / "neg.npy", np.array([1, -2, 3])), dict(path="neg.npy"), ValueError, ">= 0"),
    (lambda p: np.save(p / "f.npy", np.zeros(5)), dict(path="f.npy"), ValueError, "1-D integer"),
    (lambda p: np.arange(9, dtype=np.uint16).tofile(p / "v.bin"), dict(path="v.bin", vocab_size=8), ValueError,
     "vocab_size must be > 8, got 8"),
    (lambda p: np.arange(4, dtype=np.uint16).tofile(p / "s.bin"), dict(path="s.bin", context_length=5),
     ValueError, "no window of 5 + 1 tokens"),
])
def test_bad_token_files_are_clear_errors(tmp_path, setup, kwargs, error, text):
    setup(tmp_path)
    kwargs = {"context_length": 2, **kwargs}
    path = tmp_path / kwargs.pop("path")
    with pytest.raises(error) as info:
        load_token_file(path, **kwargs)
    assert text in str(info.value)


def test_synthetic_tokens_follow_a_deterministic_chain_with_the_stated_entropy():
    a = synthetic_tokens(n_train=2000, n_val=100, context_length=16, vocab_size=50, seed=4)
    b = synthetic_tokens(n_train=2000, n_val=100, context_length=16, vocab_size=50, seed=4)
    np.testing.assert_array_equal(a.X_train, b.X_train)
    np.testing.assert_array_equal(a.y_val, b.y_val)
    assert a.X_train.shape == (2000, 16) and a.num_classes == 50 and a.task == "language_model"
    np.testing.assert_array_equal(a.y_train[:, :-1], a.X_train[:, 1:])
    # every token has at most 4 successors, chosen with the stated probabilities
    pairs = np.stack([a.X_train.ravel(), a.y_train.ravel()])
    counts = np.zeros((50, 50))
    np.add.at(counts, (pairs[0], pairs[1]), 1)
    assert (counts > 0).sum(axis=1).max() <= 4
    probs = np.sort(counts / counts.sum(axis=1, keepdims=True), axis=1)[:, ::-1][:, :4].mean(axis=0)
    np.testing.assert_allclose(probs, [0.5, 0.25, 0.15, 0.1], atol=0.02)
    assert a.meta["entropy"] == pytest.approx(-sum(p * math.log(p) for p in (0.5, 0.25, 0.15, 0.1)))
    assert a.meta["entropy"] < math.log(50) / 2
    c = synthetic_tokens(n_train=10, n_val=1, context_length=4, vocab_size=50, seed=5)
    assert not np.array_equal(c.X_train, a.X_train[:10, :4])


def test_load_dataset_knows_the_token_names():
    ds = load_dataset("synthetic-tokens", n_train=8, n_val=2, context_length=5, vocab_size=30)
    assert ds.X_train.shape == (8, 5) and ds.num_classes == 30
    with pytest.raises(ValueError, match="names no file"):
        load_dataset("tokens:", context_length=4)
    with pytest.raises(ValueError, match="tokens:PATH, text:PATH"):
        load_dataset("tokenz:x.bin")
