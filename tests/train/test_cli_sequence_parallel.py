"""``--sequence-parallel``: its errors before anything is sent, and whole runs that start mpirun themselves
(marked slow): a tp 2 GPT with the sequence split ends at one process's parameters, its checkpoint resumes
without the split and a plain tp 2 checkpoint resumes with it, and its trace names the new collectives."""

import json

import numpy as np
import pytest

from npddp.checkpoint import fileformat
from npddp.train.cli.parser import parse_args
from npddp.train.cli.validate import check_config
from npddp.train.config import Config, ConfigError
from tests.helpers.cli import ok, train
from tests.helpers.trace import x_events

GPT = ["--model", "gpt", "--dtype", "float64", "--context-length", "8", "--train-samples", "48",
       "--val-samples", "16", "--batch-size", "8", "--optimizer", "adamw", "--lr", "1e-3", "--progress", "none",
       "--quiet"]


@pytest.mark.parametrize("argv,text", [
    (["--model", "gpt", "--sequence-parallel"], "it needs --tp 2 or more, got --tp 1"),
    (["--model", "mlp", "--tp", "2", "--sequence-parallel"], "--sequence-parallel applies to --model gpt, not mlp"),
    (["--model", "gpt", "--tp", "2", "--context-length", "7", "--sequence-parallel"],
     "--context-length 7 is not a multiple of --tp 2; use e.g. 6"),
])
def test_bad_settings_are_one_error_naming_the_value(argv, text):
    with pytest.raises(ConfigError) as err:
        check_config(Config(**parse_args(argv)), 2)
    assert text in str(err.value)


def _worst(a: dict, b: dict) -> float:
    assert list(a) == list(b)
    return max(float(np.abs(a[k] - b[k]).max() / np.abs(a[k]).max()) for k in a)


@pytest.mark.slow
def test_gpt_tp2_sequence_parallel_ends_at_one_process_and_resumes_either_way(tmp_path):
    ok(train(tmp_path, *GPT, "--epochs", "2", "--checkpoint", "one.h5", n=None))
    ok(train(tmp_path, *GPT, "--epochs", "2", "--tp", "2", "--sequence-parallel", "--max-steps", "7",
             "--checkpoint", "sp.h5", n=2))
    ok(train(tmp_path, *GPT, "--epochs", "2", "--tp", "2", "--max-steps", "5", "--checkpoint", "tp.h5", n=2))
    assert fileformat.read(tmp_path / "sp.h5").config["sequence_parallel"] is True
    ok(train(tmp_path, "--checkpoint", "sp.h5", "--resume", "--progress", "none", n=2))            # tp 2, no split
    ok(train(tmp_path, "--checkpoint", "tp.h5", "--resume", "--sequence-parallel", "--progress", "none", n=2))
    one = fileformat.read(tmp_path / "one.h5").params
    for name in ("sp.h5", "tp.h5"):
        done = fileformat.read(tmp_path / name)
        assert done.step == 12, name
        assert _worst(one, done.params) <= 1e-9, name


@pytest.mark.slow
def test_the_trace_names_the_sequence_collectives(tmp_path):
    ok(train(tmp_path, *GPT, "--tp", "2", "--sequence-parallel", "--max-steps", "3", "--trace-steps", "2:3",
             "--trace", "t.json", n=2))
    events = x_events(json.loads((tmp_path / "t.json").read_text()))
    names = {e["name"] for e in events if e["cat"] == "comm" and e["pid"] == 1}
    for want in ("sequence-parallel all-gather (forward)", "sequence-parallel reduce-scatter (backward)",
                 "sequence-parallel reduce-scatter (forward)", "sequence-parallel all-gather (backward)",
                 "sequence-parallel LayerNorm gradient all-reduce"):
        assert want in names, (want, sorted(names))
    assert not any(n.startswith("tensor-parallel all-reduce") for n in names), sorted(names)
