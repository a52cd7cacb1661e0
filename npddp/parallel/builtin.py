"""The built-in DDP comm hooks by name: what ``--comm-hook NAME`` and the benchmarks build."""

from __future__ import annotations

from npddp.parallel.hooks import TopKState, allreduce_hook, fp16_compress_hook, topk_hook
from npddp.parallel.powersgd import PowerSGDState, powersgd_hook

#: Built-in hooks by name (the CLI's ``--comm-hook`` choices).
HOOKS = ("allreduce", "fp16", "topk", "powersgd")


def build(name: str, comm, *, topk_ratio: float = 0.01, powersgd_rank: int = 1, powersgd_start_iter: int = 10,
          seed: int = 0):
    """``(state, hook)`` for the built-in hook ``name`` of :data:`HOOKS`; ValueError naming the valid ones."""
    if name == "allreduce":
        return comm, allreduce_hook
    if name == "fp16":
        return comm, fp16_compress_hook
    if name == "topk":
        return TopKState(comm, topk_ratio), topk_hook
    if name == "powersgd":
        return PowerSGDState(comm, rank=powersgd_rank, start_iter=powersgd_start_iter, seed=seed), powersgd_hook
    raise ValueError(f"unknown comm hook {name!r}; valid: {', '.join(HOOKS)}")
