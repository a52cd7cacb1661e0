"""``python -m npddp.train --tp K --pp K``: the layout checked up front, one process's parameters, whole-model checkpoints.

The whole-run tests start mpirun themselves (serial pytest, marked slow): a tp 2 x pp 2 GPT and
a pp 2 dropout MLP end at the parameters of one process on the same global batch, and a
checkpoint written at tp 2 x pp 2 is an ordinary whole-model file that resumes at pp 2 or on
one process and ends where the uninterrupted one-process run ends.
"""

import numpy as np
import pytest

from npddp.checkpoint import fileformat
from npddp.train.checkpoint.saving import load_model
from npddp.train.cli import layout
from npddp.train.cli.validate import check_config
from npddp.train.config import ConfigError
from npddp.train.models import build_model
from tests.helpers.cli import ok, train
from tests.helpers.cli_split import GPT, MLP, cfg_of


# argv, world size, text the one error line holds
BAD = [
    (["--tp", "2"], 3, "--tp 2 x --pp 1 = 2 does not divide the world size 3; tp x pp must be one of 1, 3"),
    (["--tp", "0"], 2, "--tp must be an integer >= 1, got 0"),
    (["--pp", "2", "--zero", "3"], 2, "--zero 3 with --tp 1 --pp 2 is not supported"),
    (["--pp", "2", "--model", "cnn"], 2, "--tp 1 --pp 2 splits --model mlp or gpt, not cnn"),
    (["--pp", "2", "--batch-size", "8", "--micro-batches", "5"], 4,
     "--micro-batches 5 must be in [1, 4] (the rows per step of a data replica"),
    (["--micro-batches", "2"], 2, "--micro-batches 2 applies with --tp or --pp above 1"),
    (["--pp", "2", "--batch-size", "7"], 4, "--batch-size 7 does not split evenly over 2 data replicas"),
]


@pytest.mark.parametrize("argv,world,text", BAD, ids=[" ".join(a) for a, _, _ in BAD])
def test_bad_layouts_are_one_error_before_anything_is_sent(argv, world, text):
    with pytest.raises(ConfigError) as err:
        check_config(cfg_of(argv), world)
    assert text in str(err.value)


@pytest.mark.parametrize("argv,text", [
    (["--model", "gpt", "--tp", "3"], "--tp 3 --pp 1: num_heads 4 is not divisible by the tensor-parallel size 3"),
    (["--model", "mlp", "--hidden", "16", "--pp", "3"], "into 3 pipeline stages; stages must be an integer in [1, 2]"),
    (["--model", "mlp", "--hidden", "6", "6", "--tp", "4"],
     "--tp 4 --pp 1: layer '0' (Linear 10 -> 6): out_features 6 is not divisible by the tensor-parallel size 4"),
])
def test_sizes_the_split_cannot_take_are_found_by_a_dry_build(argv, text):
    cfg = cfg_of(argv)
    shape, classes = ((8,), 256) if cfg.model == "gpt" else ((10,), 3)
    message = layout.dry_check(lambda: build_model(cfg.as_dict(), shape, classes)[0], cfg)
    assert message is not None and text in message


def test_the_header_names_the_layout_and_the_bubble():
    line = layout.layout_line(cfg_of(["--tp", "2", "--pp", "2", "--micro-batches", "4"]), 8)
    assert line == "parallel: dp 2 x pp 2 x tp 2; pipeline 1f1b, 4 micro-batches, bubble 0.20"
    assert layout.micro_batches(cfg_of(["--pp", "3"])) == 3


def _params(path) -> dict:
    return fileformat.read(path).params


def _worst(a: dict, b: dict) -> float:
    assert list(a) == list(b)
    return max(float(np.abs(a[k] - b[k]).max() / np.abs(a[k]).max()) for k in a)


@pytest.mark.slow
def test_gpt_tp2_pp2_ends_at_one_process_and_resumes_on_another_layout(tmp_path):
    ok(train(tmp_path, *GPT, "--epochs", "2", "--checkpoint", "one.h5", n=None))
    ok(train(tmp_path, *GPT, "--epochs", "2", "--tp", "2", "--pp", "2", "--max-steps", "18",
             "--checkpoint", "split.h5", n=4))
    mid = fileformat.read(tmp_path / "split.h5")
    assert (mid.step, mid.world_size, mid.config["tp"], mid.config["pp"]) == (18, 1, 2, 2)
    whole = load_model(tmp_path / "split.h5")                     # the ordinary reader: the whole GPT
    assert [n for n, _ in whole.named_parameters()] == list(mid.params)
    (tmp_path / "pp2.h5").write_bytes((tmp_path / "split.h5").read_bytes())
    ok(train(tmp_path, "--checkpoint", "split.h5", "--resume", "--tp", "1", "--pp", "1", "--progress", "none", n=None))
    ok(train(tmp_path, "--checkpoint", "pp2.h5", "--resume", "--tp", "1", "--pp", "2", "--progress", "none", n=2))
    one = _params(tmp_path / "one.h5")
    for name in ("split.h5", "pp2.h5"):
        assert fileformat.read(tmp_path / name).step == 24
        assert _worst(one, _params(tmp_path / name)) <= 1e-9, name


@pytest.mark.slow
def test_mlp_pp2_with_dropout_ends_at_one_process(tmp_path):
    """92 rows in batches of 8: the epoch's last batch of 4 rows runs as 4 micro-batches, not 8."""
    ok(train(tmp_path, *MLP, "--checkpoint", "one.h5", n=None))
    out = ok(train(tmp_path, *MLP, "--pp", "2", "--micro-batches", "8", "--pp-schedule", "gpipe",
                   "--checkpoint", "pp2.h5", n=2))
    assert "last val_acc" in out.stdout
    one, pp2 = fileformat.read(tmp_path / "one.h5"), fileformat.read(tmp_path / "pp2.h5")
    assert _worst(one.params, pp2.params) <= 1e-9
    assert np.array_equal(one.dropout_rng, pp2.dropout_rng)      # the streams stand where one process's do


@pytest.mark.slow
def test_a_size_the_split_cannot_take_is_one_error_line_and_exit_2_on_every_rank(tmp_path):
    proc = train(tmp_path, "--model", "mlp", "--hidden", "5", "--tp", "2", "--checkpoint", "run.h5", n=2)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert "--tp 2 --pp 1: " in lines[0] and "5 is not divisible" in lines[0]
    assert not (tmp_path / "run.h5").exists()
