"""Sample text from a GPT checkpoint written by ``python -m npddp.train --model gpt``.

    python -m npddp.generate gpt.h5 --prompt "The ring" --tokens 200
    python -m npddp.generate gpt.h5 --prompt "The ring" --temperature 0.8 --top-k 20 --seed 1
    python -m npddp.generate gpt.h5 --prompt "The ring" --top-k 1     # greedy: the argmax every step

A model trained on ``text:PATH`` (bytes as tokens) takes the prompt as text and prints text;
any other token data takes and prints token ids separated by spaces. One process, no MPI.
Prints the prompt followed by what was sampled; exit 0, or 2 with one ``error: ...`` line.
"""

from __future__ import annotations

import argparse
import codecs
import sys

import numpy as np

from npddp.nn.sample import check_sampling, generate
from npddp.process.job import EXIT_USAGE, JobError, run_main
from npddp.checkpoint import fileformat
from npddp.train.checkpoint.saving import load_model

PROG = "python -m npddp.generate"
#: Most tokens one run samples (one forward pass each; the output array holds them all).
MAX_TOKENS = 1_000_000


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise JobError(message, EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    """The command line: a checkpoint, a prompt and the sampling settings."""
    p = _Parser(prog=PROG, description="Sample text from a GPT checkpoint of python -m npddp.train --model gpt.",
                allow_abbrev=False)
    p.add_argument("checkpoint", metavar="PATH.h5", help="a checkpoint written by python -m npddp.train --model gpt")
    p.add_argument("--prompt", default="\n", metavar="TEXT",
                   help="the text to continue (token ids separated by spaces for non-text data) (default: a newline)")
    p.add_argument("--tokens", type=token_count, default=200, metavar="N",
                   help=f"tokens to sample, 0..{MAX_TOKENS} (default: 200)")
    p.add_argument("--temperature", type=float, default=1.0, metavar="T",
                   help="divides the logits: below 1 sharper, above 1 flatter; > 0 (default: 1.0)")
    p.add_argument("--top-k", type=int, default=0, metavar="K",
                   help="sample among the K most likely tokens; 0: all, 1: greedy (default: 0)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="random seed of the sampling (default: 0)")
    return p


def token_count(text: str) -> int:
    """argparse type of ``--tokens``: an integer in [0, MAX_TOKENS]."""
    try:
        count = int(text)
    except ValueError:
        count = None
    if count is None or not 0 <= count <= MAX_TOKENS:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, {MAX_TOKENS}], got {text!r}")
    return count


def is_text(config: dict) -> bool:
    """Whether the run's tokens are a file's bytes (``--dataset text:PATH``)."""
    return str(config.get("dataset", "")).startswith("text:")


def encode(prompt: str, text: bool, vocab: int) -> np.ndarray:
    """The prompt's tokens: UTF-8 bytes for a text model, else integer ids separated by spaces or commas."""
    if text:
        ids = np.frombuffer(prompt.encode("utf-8"), dtype=np.uint8).astype(np.int64)
    else:
        try:
            values = [int(t) for t in prompt.replace(",", " ").split()]
        except ValueError:
            raise JobError(f"--prompt {prompt!r}: this model was not trained on text: give token ids "
                           f"in [0, {vocab - 1}] separated by spaces") from None
        if values and not all(0 <= v < vocab for v in values):     # checked as Python ints: any size
            raise JobError(f"--prompt token ids must be in [0, {vocab - 1}], got {min(values)}..{max(values)}")
        ids = np.array(values, dtype=np.int64)
    if ids.size == 0:
        raise JobError("--prompt is empty: give at least one character (or token id)")
    if ids.min() < 0 or ids.max() >= vocab:
        raise JobError(f"--prompt token ids must be in [0, {vocab - 1}], got {int(ids.min())}..{int(ids.max())}")
    return ids


def decode(tokens: np.ndarray, text: bool) -> str:
    """Text (invalid UTF-8 replaced) for a text model, else the ids separated by spaces."""
    if text:
        return tokens.astype(np.uint8).tobytes().decode("utf-8", errors="replace")
    return " ".join(str(int(t)) for t in tokens)


class Stream:
    """Prints tokens as they are sampled, flushed each time: what :func:`decode` of them all would print.

    Text goes through an incremental UTF-8 decoder, so a character split over tokens is printed
    whole once its last byte arrives; ids are separated by spaces.
    """

    def __init__(self, text: bool, file):
        self.file, self.text, self.started = file, text, False
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace") if text else None

    def tokens(self, tokens) -> None:
        """Print ``tokens`` (the prompt) in one write."""
        if self.text:
            self._write(self.decoder.decode(np.asarray(tokens).astype(np.uint8).tobytes()))
        else:
            self._write(("" if not self.started else " ") + decode(np.asarray(tokens), False))
            self.started = self.started or len(tokens) > 0

    def token(self, token: int) -> None:
        """Print one sampled token."""
        self.tokens([token])

    def close(self) -> None:
        """The rest of a split character (if any) and the final newline."""
        self._write((self.decoder.decode(b"", final=True) if self.text else "") + "\n")

    def _write(self, chunk: str) -> None:
        if chunk:
            self.file.write(chunk)
            self.file.flush()


def run(argv=None) -> int:
    """Parse, load, sample and print; the exit status."""
    try:
        args = build_parser().parse_args(argv)
        try:
            ckpt = fileformat.read(args.checkpoint)
        except fileformat.CheckpointError as exc:
            raise JobError(str(exc)) from None
        if ckpt.config.get("model") != "gpt":
            raise JobError(f"{args.checkpoint} holds a {ckpt.config.get('model')} model; "
                           "text generation needs one trained with --model gpt")
        model = load_model(args.checkpoint, rank=0)
        try:
            check_sampling(args.tokens, args.temperature, args.top_k, model.vocab_size)
        except ValueError as exc:
            raise JobError(str(exc).replace("num_tokens", "--tokens").replace("temperature", "--temperature")
                           .replace("top_k", "--top-k")) from None
        text = is_text(ckpt.config)
        prompt = encode(args.prompt, text, model.vocab_size)
    except JobError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return exc.code
    write = Stream(text, sys.stdout)
    write.tokens(prompt)
    generate(model, prompt, args.tokens, args.temperature, args.top_k, args.seed, on_token=write.token)
    write.close()
    return 0


def main(argv=None) -> int:
    """The CLI under npddp.process.job's abort hooks; the exit status."""
    return run_main(run, argv)
