"""``--inject-fault RANK:STEP[:KIND]``: what it asks for, read once by the flag checks and by the training loop."""

from __future__ import annotations

from npddp.train.config import ConfigError

#: What ``--inject-fault RANK:STEP:KIND`` does on that rank and step.
FAULT_KINDS = ("raise", "exit", "nan")


def parse_fault(text: str, world_size: int) -> tuple[int, int, str]:
    """``--inject-fault RANK:STEP[:KIND]`` as ``(rank, step, kind)``; ConfigError naming the valid ranges otherwise."""
    head = f"--inject-fault {text!r}"
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ConfigError(f"{head} must be RANK:STEP or RANK:STEP:KIND, e.g. 1:5 or 1:5:exit")
    kind = parts[2] if len(parts) == 3 else "raise"
    try:
        rank, step = int(parts[0]), int(parts[1])
    except ValueError:
        raise ConfigError(f"{head} must be RANK:STEP with two integers, e.g. 1:5") from None
    if not 0 <= rank < world_size:
        raise ConfigError(f"{head}: rank {rank} is out of range; valid ranks: 0..{world_size - 1}")
    if step < 1:
        raise ConfigError(f"{head}: step {step} is out of range; valid steps: 1 and up")
    if kind not in FAULT_KINDS:
        raise ConfigError(f"{head}: kind {kind!r} is not one of {', '.join(FAULT_KINDS)}")
    return rank, step, kind
