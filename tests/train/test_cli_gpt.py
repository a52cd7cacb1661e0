"""``python -m npddp.train --model gpt`` end to end on a tiny GPT (subprocesses, like tests/test_train.py).

Token data from a text file and from the synthetic Markov chain; tokens/s in the epoch lines;
one rank and two ranks reach the same parameters; stopped and resumed equals uninterrupted.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from npddp.checkpoint import fileformat

# sequences of 16 tokens, a global batch of 8; AdamW in float64
GPT = ["--model", "gpt", "--model-size", "tiny", "--context-length", "16", "--batch-size", "8", "--epochs", "2",
       "--optimizer", "adamw", "--lr", "0.003", "--dtype", "float64"]
SYNTHETIC = ["--train-samples", "96", "--val-samples", "16"]      # 12 steps per epoch


def train(cwd, *args, n=2, timeout=180) -> subprocess.CompletedProcess:
    """The CLI on ``n`` ranks (None: plain python), outside any enclosing MPI job, one BLAS thread."""
    command = [sys.executable, "-m", "npddp.train", *map(str, args)]
    if n is not None:
        beside = Path(sys.executable).parent / "mpirun"
        command = [str(beside) if beside.exists() else shutil.which("mpirun"), "-n", str(n), *command]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_"))}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def ok(proc) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def epoch_lines(stdout: str) -> list:
    return [line for line in stdout.splitlines() if line.startswith("epoch ")]


@pytest.mark.slow
def test_gpt_on_text_prints_tokens_per_second_and_resumes_bit_identically(tmp_path):
    (tmp_path / "corpus.txt").write_bytes(b"the quick brown fox jumps over the lazy dog. " * 24)
    flags = [*GPT, "--dataset", "text:corpus.txt", "--backend", "ring", "--sync", "per_param"]
    whole = ok(train(tmp_path, *flags, "--checkpoint", "a.h5"))
    lines = epoch_lines(whole.stdout)
    assert len(lines) == 2 and all(line.endswith("tokens/s") for line in lines), whole.stdout
    assert "vocab 256, context 16, tied LM head" in whole.stdout
    assert "sequences of 16 tokens, vocabulary 256" in whole.stdout
    losses = [float(line.split("train_loss")[1].split()[0]) for line in lines]
    assert losses[1] < losses[0] < np.log(256), losses
    ok(train(tmp_path, *flags, "--checkpoint", "b.h5", "--max-steps", "11"))
    ok(train(tmp_path, *flags, "--checkpoint", "b.h5", "--resume"))
    a, b = fileformat.read(tmp_path / "a.h5"), fileformat.read(tmp_path / "b.h5")
    assert a.step == b.step > 11 and a.epochs_done == b.epochs_done == 2
    assert "head.weight" not in a.params and "tok_emb.weight" in a.params       # tied: saved once
    for name in a.params:
        assert np.array_equal(a.params[name], b.params[name]), name
    for key in a.optimizer:
        assert np.array_equal(a.optimizer[key], b.optimizer[key]), key


@pytest.mark.slow
def test_gpt_on_one_rank_and_two_ranks_reach_the_same_parameters(tmp_path):
    ok(train(tmp_path, *GPT, *SYNTHETIC, "--checkpoint", "one.h5", n=None))
    two = ok(train(tmp_path, *GPT, *SYNTHETIC, "--checkpoint", "two.h5", "--sync", "overlap", "--bucket-mb", "0.01"))
    assert "data: synthetic-tokens, 96 train / 16 val sequences" in two.stdout
    one, two = fileformat.read(tmp_path / "one.h5"), fileformat.read(tmp_path / "two.h5")
    for name in one.params:
        assert np.max(np.abs(one.params[name] - two.params[name])) <= 1e-10, name
