"""A data x pipeline x tensor mesh of ranks, as PyTorch's DeviceMesh names them: pure arithmetic, no messages.

``Mesh(world_size, tp, pp)`` lays ranks out with the tensor coordinate innermost, then the
pipeline stage, then the data replica: ``rank = (dp * pp + stage) * tp + t``. A tensor group is
``tp`` contiguous ranks (the group that talks most, on one node when nodes hold whole groups);
a pipeline group is the ``pp`` ranks of one data replica and tensor slice, one per stage; a
data group is the ``world_size / (tp * pp)`` ranks that hold the same shard of the same stage.
"""

from __future__ import annotations

from dataclasses import dataclass

AXES = ("data", "pipeline", "tensor")


def _positive(name: str, value) -> int:
    """``value`` as an int >= 1, else a ValueError naming it and the valid range."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class Coords:
    """Where one rank sits: data replica, pipeline stage, tensor slice."""

    dp: int
    pp: int
    tp: int


class Mesh:
    """Ranks ``0 .. world_size-1`` as a (dp, pp, tp) grid; ValueError before anything is sent if it does not fit."""

    def __init__(self, world_size: int, tp: int = 1, pp: int = 1):
        self.world_size = _positive("world_size", world_size)
        self.tp = _positive("tp", tp)
        self.pp = _positive("pp", pp)
        if world_size % (tp * pp):
            divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
            raise ValueError(f"world size {world_size} is not divisible by tp * pp = {tp} * {pp} = {tp * pp}; "
                             f"tp * pp must be one of {divisors}")
        self.dp = world_size // (tp * pp)

    def coords(self, rank: int) -> Coords:
        """(dp, pp, tp) coordinates of ``rank``."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise ValueError(f"rank must be an integer in [0, {self.world_size}), got {rank!r}")
        return Coords(rank // (self.pp * self.tp), rank // self.tp % self.pp, rank % self.tp)

    def rank_of(self, dp: int, pp: int, tp: int) -> int:
        """The rank at coordinates (dp, pp, tp)."""
        for name, value, size in (("dp", dp, self.dp), ("pp", pp, self.pp), ("tp", tp, self.tp)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
                raise ValueError(f"{name} must be an integer in [0, {size}), got {value!r}")
        return (dp * self.pp + pp) * self.tp + tp

    def colors(self, axis: str) -> list[int]:
        """For every rank, the index of its group along ``axis`` (what a split by color takes)."""
        if axis not in AXES:
            raise ValueError(f"unknown mesh axis {axis!r}; valid: {', '.join(AXES)}")
        out = []
        for r in range(self.world_size):
            c = self.coords(r)
            out.append({"tensor": c.dp * self.pp + c.pp, "pipeline": c.dp * self.tp + c.tp,
                        "data": c.pp * self.tp + c.tp}[axis])
        return out

    def group(self, axis: str, rank: int) -> list[int]:
        """The ranks of ``rank``'s group along ``axis``, in ascending order (its rank within = its coordinate)."""
        colors = self.colors(axis)
        return [r for r in range(self.world_size) if colors[r] == colors[rank]]

    def __repr__(self) -> str:
        return f"Mesh(world_size={self.world_size}, dp={self.dp}, pp={self.pp}, tp={self.tp})"
