"""Receive buffers lent and taken back, so steady-state collectives allocate nothing."""

from __future__ import annotations


class ScratchPool:
    """Receive buffers lent out and given back; a buffer is replaced only when too small."""

    __slots__ = ("_free", "nbuffers", "nbytes")

    def __init__(self):
        self._free: list[bytearray] = []
        self.nbuffers = 0  # buffers the pool owns, free and lent
        self.nbytes = 0    # their total size

    def acquire(self, nbytes: int) -> bytearray:
        """Lend the smallest free buffer of at least ``nbytes``; replace the largest free one if none fits."""
        free = self._free
        best = -1
        for i, b in enumerate(free):
            if len(b) >= nbytes and (best < 0 or len(b) < len(free[best])):
                best = i
        if best >= 0:
            return free.pop(best)
        if free:
            largest = max(range(len(free)), key=lambda i: len(free[i]))
            self.nbytes -= len(free.pop(largest))
            self.nbuffers -= 1
        buf = bytearray(max(nbytes, 1))
        self.nbytes += len(buf)
        self.nbuffers += 1
        return buf

    def release(self, buf: bytearray) -> None:
        """Take back a buffer lent by :meth:`acquire`."""
        self._free.append(buf)

