"""Cutting parameters into buckets: the grouping DDP's gradient buckets and ZeRO's flat groups share."""

from __future__ import annotations

from npddp.nn.parameter import Parameter

__all__ = ["cut_buckets"]


def cut_buckets(params: list[Parameter], cap_bytes: float) -> list[list[Parameter]]:
    """Group ``params`` in reverse order (the order backward makes gradients) into buckets of at most
    ``cap_bytes`` each, one dtype per bucket; a parameter larger than the cap gets a bucket of its own."""
    groups: list[list[Parameter]] = []
    current: list[Parameter] = []
    size = 0
    for p in reversed(params):
        if current and (size + p.data.nbytes > cap_bytes or p.data.dtype != current[0].data.dtype):
            groups.append(current)
            current, size = [], 0
        current.append(p)
        size += p.data.nbytes
    if current:
        groups.append(current)
    return groups
