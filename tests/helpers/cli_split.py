"""The ``--tp``/``--pp`` CLI tests' runs: a tiny GPT and a dropout MLP, and the Config the CLI builds from flags."""

from npddp.train.cli.parser import parse_args
from npddp.train.config import Config

#: A tiny float64 GPT run.
GPT = ["--model", "gpt", "--dtype", "float64", "--context-length", "8", "--train-samples", "96",
       "--val-samples", "32", "--batch-size", "8", "--optimizer", "adamw", "--lr", "1e-3", "--progress", "none",
       "--quiet"]
#: A float64 MLP run with dropout.
MLP = ["--model", "mlp", "--hidden", "32", "32", "--dropout", "0.2", "--dtype", "float64", "--train-samples", "92",
       "--val-samples", "32", "--batch-size", "8", "--epochs", "1", "--progress", "none", "--quiet"]


def cfg_of(argv) -> Config:
    """The Config the CLI builds from ``argv``."""
    return Config(**parse_args(argv))
