"""``python -m npddp.generate``: text from a GPT checkpoint, deterministic with a seed; bad input is one line, exit 2."""

import os
import select
import subprocess
import sys
import time

import numpy as np
import pytest

from npddp.nn.sample import generate
from npddp.checkpoint import fileformat
from npddp.train.checkpoint.saving import load_model
from npddp.train.generate import MAX_TOKENS, decode, encode

TEXT = b"the quick brown fox jumps over the lazy dog. " * 24


def run(*args, cwd, module="npddp.generate", timeout=120, text=True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_"))}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=text, timeout=timeout)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny GPT on text (a few steps), a tiny GPT on synthetic tokens and an MLP, as checkpoints."""
    d = tmp_path_factory.mktemp("generate")
    (d / "corpus.txt").write_bytes(TEXT)
    common = ["--model-size", "tiny", "--context-length", "16", "--batch-size", "8", "--epochs", "1",
              "--max-steps", "3", "--optimizer", "adamw", "--lr", "0.003", "--quiet"]
    for name, extra in {"text.h5": ["--model", "gpt", "--dataset", "text:corpus.txt", *common],
                        "tokens.h5": ["--model", "gpt", "--train-samples", "64", "--val-samples", "8", *common],
                        "mlp.h5": ["--max-steps", "1", "--train-samples", "96", "--val-samples", "16", "--quiet"]}.items():
        proc = run(*extra, "--checkpoint", name, cwd=d, module="npddp.train")
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return d


def test_the_same_seed_prints_the_same_text_and_it_starts_with_the_prompt(trained):
    a = run("text.h5", "--prompt", "the quick", "--tokens", 40, "--seed", 3, cwd=trained)
    b = run("text.h5", "--prompt", "the quick", "--tokens", 40, "--seed", 3, cwd=trained)
    c = run("text.h5", "--prompt", "the quick", "--tokens", 40, "--seed", 4, cwd=trained)
    for p in (a, b, c):
        assert p.returncode == 0 and p.stderr == "", p.stderr
        assert p.stdout.startswith("the quick")
    assert a.stdout == b.stdout != c.stdout


def test_top_k_1_prints_the_greedy_continuation_of_the_loaded_model(trained):
    model = load_model(trained / "text.h5")
    prompt = encode("the lazy", True, 256)
    want = generate(model, prompt, 30, top_k=1).astype(np.uint8).tobytes().decode("utf-8", errors="replace")
    for temperature, seed in ((1.0, 0), (0.5, 9)):
        p = run("text.h5", "--prompt", "the lazy", "--tokens", 30, "--top-k", 1, "--temperature", temperature,
                "--seed", seed, cwd=trained)
        assert p.returncode == 0 and p.stdout == want + "\n"


def test_a_model_of_token_ids_takes_and_prints_ids(trained):
    p = run("tokens.h5", "--prompt", "1 2 3", "--tokens", 5, cwd=trained)
    assert p.returncode == 0, p.stderr
    ids = [int(t) for t in p.stdout.split()]
    assert ids[:3] == [1, 2, 3] and len(ids) == 8


@pytest.mark.parametrize("args, text", [
    (["text.h5", "--tokens", "-1"], "argument --tokens: must be an integer in [0, 1000000], got '-1'"),
    (["text.h5", "--tokens", "x"], "argument --tokens: must be an integer in [0, 1000000], got 'x'"),
    (["text.h5", "--tokens", "4000000000"], "argument --tokens: must be an integer in [0, 1000000], got '4000000000'"),
    (["text.h5", "--tokens", "1e20"], "argument --tokens: must be an integer in [0, 1000000], got '1e20'"),
    (["tokens.h5", "--prompt", f"1 {2**63}"], f"--prompt token ids must be in [0, 255], got 1..{2**63}"),
    (["tokens.h5", "--prompt", f"-{2**70} 3"], f"--prompt token ids must be in [0, 255], got -{2**70}..3"),
    (["text.h5", "--temperature", "0"], "--temperature must be a finite number > 0"),
    (["text.h5", "--temperature", "nan"], "--temperature must be a finite number > 0"),
    (["text.h5", "--top-k", "-2"], "--top-k must be an integer in [0, 256]"),
    (["text.h5", "--top-k", "257"], "--top-k must be an integer in [0, 256]"),
    (["text.h5", "--prompt", ""], "--prompt is empty"),
    (["tokens.h5", "--prompt", "hello"], "this model was not trained on text"),
    (["tokens.h5", "--prompt", "1 99999"], "--prompt token ids must be in [0, "),
    (["mlp.h5"], "holds a mlp model; text generation needs one trained with --model gpt"),
    (["missing.h5"], "missing.h5"),
    (["text.h5", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_input_is_one_error_line_and_exit_2(trained, args, text):
    p = run(*args, cwd=trained)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], p.stderr


@pytest.mark.parametrize("name, prompt", [("text.h5", "the lazy"), ("tokens.h5", "4 5 6")])
def test_the_streamed_output_is_byte_identical_to_decoding_every_token_at_the_end(trained, name, prompt):
    """Random sampling from a barely trained model: text models emit invalid UTF-8 that must be replaced alike."""
    model = load_model(trained / name)
    text = name == "text.h5"
    want = decode(generate(model, encode(prompt, text, 256), 300, seed=5), text) + "\n"
    p = run(name, "--prompt", prompt, "--tokens", 300, "--seed", 5, cwd=trained, text=False)
    assert p.returncode == 0 and p.stdout == want.encode("utf-8"), p.stderr


def test_tokens_are_printed_as_they_are_sampled(trained):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_"))}
    proc = subprocess.Popen([sys.executable, "-m", "npddp.generate", "tokens.h5", "--prompt", "1", "--tokens",
                             str(MAX_TOKENS)], cwd=trained, env={**env, "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        seen, deadline = b"", time.monotonic() + 60
        while seen.count(b" ") < 5 and time.monotonic() < deadline:     # the prompt and four sampled ids
            if select.select([proc.stdout], [], [], 1.0)[0]:
                seen += os.read(proc.stdout.fileno(), 4096)
        assert seen.count(b" ") >= 5 and proc.poll() is None, seen       # printed while it still samples
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
