"""The ``--zero`` CLI tests' runs and what they read back: a GPT and an MLP run, a checkpoint's arrays, its shard
directories, and the one error line of a refused run."""

import os

import numpy as np

from npddp.checkpoint import fileformat

#: A tiny GPT run with AdamW over ring.
GPT = ["--model", "gpt", "--optimizer", "adamw", "--lr", "0.003", "--context-length", "16", "--train-samples", "96",
       "--val-samples", "24", "--batch-size", "24", "--epochs", "2", "--dtype", "float64", "--backend", "ring",
       "--bucket-mb", "0.01", "--progress", "none", "--threads", "1"]


def params_of(path) -> np.ndarray:
    """Every parameter of a checkpoint, flattened in name order."""
    ckpt = fileformat.read(str(path))
    return np.concatenate([np.asarray(v).ravel() for _, v in sorted(ckpt.params.items())])


def relative(a, b) -> float:
    """||a - b|| / ||b||."""
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


#: A tiny MLP run with AdamW over ring, small buckets.
MLP = ["--train-samples", "192", "--val-samples", "48", "--batch-size", "24", "--hidden", "16", "--epochs", "2",
       "--dtype", "float64", "--optimizer", "adamw", "--lr", "0.01", "--backend", "ring", "--bucket-mb", "0.001",
       "--progress", "none", "--threads", "1"]


def whole_state(path) -> dict:
    """Every parameter and optimizer array of a checkpoint, by name."""
    ckpt = fileformat.read(str(path))
    return {**{f"p/{k}": np.asarray(v) for k, v in ckpt.params.items()},
            **{f"o/{k}": np.asarray(v) for k, v in ckpt.optimizer.items()}}


def step_dirs(cwd, name="z.h5") -> list[str]:
    """The shard directories beside the index ``name``, sorted."""
    return sorted(e for e in os.listdir(cwd) if e.startswith(name + ".step-"))


def steps_saved(cwd, name="z.h5") -> list[int]:
    """The steps of the shard directories beside the index ``name`` (``name.step-<step>-<generation>``)."""
    return [int(d[len(name) + 6:].split("-")[0]) for d in step_dirs(cwd, name)]


def one_error(proc) -> str:
    """The single ``error:`` line of a failed run (exit 2)."""
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return lines[0]
