"""Which rank owns which parameter: whole parameters, greedily by size (PyTorch's ZeroRedundancyOptimizer rule)."""

from __future__ import annotations


def partition_parameters(sizes, world_size: int) -> list[list[int]]:
    """Indices of ``sizes`` per rank: largest first, each to the rank holding the fewest elements so far.

    Ties go to the lowest rank, so every rank computes the same partition; each rank's indices
    are returned in ascending order (the parameters' own order).
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    sizes = [int(s) for s in sizes]
    if any(s < 0 for s in sizes):
        raise ValueError(f"parameter sizes must be >= 0, got {sizes}")
    totals = [0] * world_size
    owned: list[list[int]] = [[] for _ in range(world_size)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world_size), key=lambda r: (totals[r], r))
        owned[rank].append(i)
        totals[rank] += sizes[i]
    return [sorted(ids) for ids in owned]
