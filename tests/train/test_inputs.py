"""The data and output files of a run, checked before training, in process: every unusable data
file is one message (the CLI prints it as ``error: ...`` and exits 2), unscaled inputs get a
warning naming --normalize, and output paths that are not regular files are refused."""

import os

import h5py
import numpy as np
import pytest

from npddp.train.cli import outputs
from npddp.checkpoint.fileformat import FORMAT as CHECKPOINT_FORMAT
from npddp.train.cli.inputs import load_data, scaling_warning
from npddp.train.models import REGISTRY

BASE = {"model": "mlp", "dtype": "float32", "normalize": "none"}


def _files(d):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 3))
    y = rng.integers(0, 3, 40)
    np.savez(d / "good.npz", X=X, y=y)
    (d / "cut.npz").write_bytes((d / "good.npz").read_bytes()[:300])
    (d / "empty.npz").write_bytes(b"")
    (d / "junk.h5").write_bytes(b"not hdf5 at all, just text")
    np.save(d / "arr.npy", X)
    (d / "arr.npy").rename(d / "renamed.npz")
    np.savez(d / "ragged.npz", X=X, y=y[:-1])
    np.savez(d / "strings.npz", X=np.array(["a"] * 40), y=y)
    bad = X.copy()
    bad[3, 1] = np.inf
    np.savez(d / "inf.npz", X=bad, y=y)
    np.savez(d / "floaty.npz", X=X, y=X[:, 0])
    np.savez(d / "twod.npz", X=X, y=np.stack([y, y], 1))
    os.mkfifo(d / "fifo.npz")
    with h5py.File(d / "nested.h5", "w") as f:
        f["train/images"] = X
        f["train/labels"] = y
    (d / "npy").mkdir()
    np.save(d / "npy" / "images.npy", X)
    np.save(d / "npy" / "labels.npy", y)
    (d / "npy" / "X.npy").write_bytes(b"\x93NUMPY garbage")
    (d / "npy" / "y.npy").write_bytes((d / "npy" / "labels.npy").read_bytes())
    np.savez(d / "u8.npz", X=rng.integers(0, 256, (40, 3)).astype(np.uint8), y=y)
    np.savez(d / "big.npz", X=X * 300, y=y)
    return d


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return _files(tmp_path_factory.mktemp("inputs"))


BAD = [
    ("missing.npz", {}, "array file"),
    ("cut.npz", {}, "cannot read 'DIR/cut.npz': damaged or truncated .npz file"),
    ("empty.npz", {}, "its name says .npz but it is neither .npz, .npy nor HDF5"),
    ("junk.h5", {}, "its name says .h5 but it is neither .npz, .npy nor HDF5"),
    ("renamed.npz", {}, "its name says .npz but it is a .npy file"),
    ("ragged.npz", {}, "'X' has shape (40, 3) and 'y' has shape (39,)"),
    ("strings.npz", {}, "'X' must hold numbers, got dtype <U1"),
    ("inf.npz", {}, "'X' holds 1 NaN or infinite value(s)"),
    ("floaty.npz", {}, "holds float targets"),
    ("twod.npz", {}, "must be a 1-D integer array of class labels"),
    ("fifo.npz", {}, "'DIR/fifo.npz' is a FIFO, not a regular file"),
    ("nested.h5", {"x_key": "train/images"}, "has no array named 'y'; available: 'train/images', 'train/labels' "
     "(choose them with --x-key/--y-key"),
    ("npy", {}, "cannot read 'DIR/npy/X.npy': damaged or truncated .npy file"),
    ("npy", {"x_key": "inputs"}, "directory 'DIR/npy' has no inputs.npy; .npy files there: X.npy, images.npy, "
     "labels.npy, y.npy"),
]


@pytest.mark.parametrize("name, keys, text", BAD)
def test_every_unusable_data_file_is_one_message_naming_it(files, name, keys, text):
    ds, message = load_data({**BASE, **keys, "dataset": str(files / name)})
    assert ds is None and message.startswith(f"--dataset {files / name}")
    assert text.replace("DIR", str(files)) in message and "\n" not in message, message


@pytest.mark.parametrize("name, keys, shape", [("good.npz", {}, (3,)),
                                               ("nested.h5", {"x_key": "train/images", "y_key": "train/labels"}, (3,)),
                                               ("npy", {"x_key": "images", "y_key": "labels"}, (3,))])
def test_npz_nested_hdf5_paths_and_npy_directories_load(files, name, keys, shape):
    ds, message = load_data({**BASE, **keys, "dataset": str(files / name)})
    assert message is None and ds.input_shape == shape and ds.n_train + ds.n_val == 40
    assert ds.meta["x_key"] == keys.get("x_key", "X")


def test_row_counts_cut_array_files_too(files):
    ds, _ = load_data({**BASE, "dataset": str(files / "good.npz"), "train_samples": 10, "val_samples": 2})
    assert (ds.n_train, ds.n_val) == (10, 2)
    _, message = load_data({**BASE, "dataset": str(files / "good.npz"), "train_samples": 100})
    assert "--train-samples 100 exceeds the 36 train rows" in message


def test_image_models_need_image_rows(files):
    image_models = [name for name, kind in REGISTRY.items() if kind.image_input]
    for name in image_models:
        _, message = load_data({**BASE, "model": name, "dataset": str(files / "good.npz")})
        assert f"--model {name} needs image rows (C, H, W), but the data has rows of shape (3,)" in message


@pytest.mark.parametrize("name, expected", [("u8.npz", "its inputs were stored as uint8"),
                                            ("big.npz", "its inputs range over ["), ("good.npz", None)])
def test_unscaled_inputs_get_a_warning_naming_normalize_unless_normalized(files, name, expected):
    settings = {**BASE, "dataset": str(files / name)}
    ds, _ = load_data(settings)
    warning = scaling_warning(ds, settings)
    if expected is None:
        assert warning is None
        return
    assert expected in warning and "--normalize standard" in warning
    for mode in ("standard", "unit"):
        settings = {**BASE, "dataset": str(files / name), "normalize": mode}
        ds, _ = load_data(settings)
        assert scaling_warning(ds, settings) is None and np.abs(ds.X_train).max() <= 10


# ----------------------------------------------------------------------------- output paths

def test_output_paths_must_be_new_or_regular_npddp_files(tmp_path):
    os.mkfifo(tmp_path / "fifo.h5")
    (tmp_path / "dir.h5").mkdir()
    (tmp_path / "other.h5").write_bytes(b"x")
    with h5py.File(tmp_path / "mine.h5", "w") as f:
        f.attrs["format"] = CHECKPOINT_FORMAT
    p = lambda name: str(tmp_path / name)   # noqa: E731
    assert outputs.check_outputs(p("new.h5"), p("m.h5"), False) is None
    assert outputs.check_outputs(p("mine.h5"), None, False) is None
    assert "is a FIFO, not a regular file" in outputs.check_outputs(p("fifo.h5"), None, False)
    assert "is a FIFO, not a regular file" in outputs.check_outputs(p("fifo.h5"), None, True)
    assert "--metrics" in outputs.check_outputs(None, p("fifo.h5"), False)
    assert "is a directory" in outputs.check_outputs(p("dir.h5"), None, False)
    assert "not an npddp checkpoint file" in outputs.check_outputs(p("other.h5"), None, False)
    assert "not an npddp metrics file" in outputs.check_outputs(None, p("mine.h5"), False)
    assert "does not exist" in outputs.check_outputs(p("nowhere/c.h5"), None, False)
