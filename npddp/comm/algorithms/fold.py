"""Folding a world of any size onto a power of two, for the recursive-doubling family (``rd``, ``rabenseifner``).

With ``p`` the largest power of two not above ``size`` and ``extra = size - p``, the first
``2 * extra`` ranks pair up: each even rank hands its vector to the odd rank above it (which
reduces the two, the lower rank's first) and sits out, then receives the final result back.
The ``p`` ranks left renumber ``0 .. p-1`` and run the power-of-two algorithm.
"""

from __future__ import annotations


class Fold:
    """Where one rank stands in the fold: ``vrank`` among the ``p`` active ranks (-1: sits out)."""

    __slots__ = ("p", "extra", "vrank", "partner")

    def __init__(self, rank: int, size: int):
        p = 1 << (size.bit_length() - 1)
        self.p, self.extra = p, size - p
        if rank < 2 * self.extra:
            self.vrank = -1 if rank % 2 == 0 else rank // 2
            self.partner = rank + 1 if rank % 2 == 0 else rank - 1  # the rank it pairs with in the fold
        else:
            self.vrank, self.partner = rank - self.extra, -1

    @staticmethod
    def extra_steps(size: int) -> int:
        """1 when ``size`` is not a power of two (the extra ranks fold in and out), else 0."""
        return 0 if size & (size - 1) == 0 else 1

    def real(self, vrank: int) -> int:
        """The rank of active rank ``vrank``."""
        return 2 * vrank + 1 if vrank < self.extra else vrank + self.extra
