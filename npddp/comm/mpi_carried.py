"""The ``mpi`` backend's argument check at no measurable cost: each call's signature forecast from the history, and
agreement with the forecast carried by one extra element of a small all-reduce.

Every checked call of a communicator has a key (its form, dtype, count, op and root). Every rank
keeps the same history, since every earlier call was checked: :class:`Forecast` remembers, for each
key, the key of the call that followed it last time, so every rank forecasts the same key for the
next call. Where that forecast is a blocking all-reduce, every rank's first MPI call is that
all-reduce, whatever it was itself called with, so MPI sees the same counts, dtype and op on
every rank (mismatched arguments never reach MPI), and each rank says whether its own call is the
forecast one with a flag (:data:`FLAGS`: a sum of ones is N, a minimum of ones is 1, ...):

* up to :data:`CARRY_BYTES`, the flag is one extra element of the all-reduce: a rank whose call is
  the forecast one reduces ``[its data | AGREE]`` through scratch arrays (two copies), any other
  rank ``[anything | DISAGREE]``; the data is copied out only when every rank agreed;
* larger, the flag is an all-reduce of its own on the check's communicator, started beside the
  data's, which a rank whose call is the forecast one runs on its own buffers (any other rank on
  spare arrays): its latency hides under the data's.

The flag's result says on every rank alike whether all agreed. Then the call is done; else every
rank runs the full check (the signatures all-gathered, which raises
:class:`~npddp.comm.signature.CollectiveMismatchError` on every rank with who passed what) and,
where they agree after all (every rank moved away from the forecast alike, so none touched its
buffers), the call itself. After a mismatch found this way, the output (the input, in place) of a
large all-reduce on the ranks that agreed holds no defined values. A call with no forecast, or a
forecast other than a blocking all-reduce, is checked in full first.
"""

from __future__ import annotations

import numpy as np

#: A forecast all-reduce of at most this many bytes carries its agreement in one extra element (two copies of
#: the data); a larger one in a one-element all-reduce beside it.
CARRY_BYTES = 64 << 10
#: Keys a :class:`Forecast` remembers successors for; past this it forgets them all (every rank alike).
FORECAST_SIZE = 256
#: op -> (this rank agrees, this rank does not, the result when every rank agrees; None: the number of ranks).
FLAGS = {"sum": (1, 0, None), "avg": (1, 0, None), "prod": (1, 0, 1), "min": (1, 0, 1), "max": (0, 1, 0)}
#: Forecast all-reduces whose scratch arrays a :class:`Forecast` keeps (two of at most ``CARRY_BYTES`` each; spare
#: arrays of a large one are made only when a rank leaves it).
SCRATCH_KEYS = 32
#: The key of a blocking all-reduce: ``(CARRIER, dtype char, count, op, None)``.
CARRIER = "allreduce"
#: The largest all-reduce forecast (bytes): a rank whose call leaves a forecast still joins it with two spare arrays
#: of its size, so a larger one would keep that memory and move that many bytes at every change of pattern; above it
#: the full check is a few percent of the call's own time.
FORECAST_BYTES = 1 << 20


class Forecast:
    """Each checked call's successor in this communicator's history, the same on every rank, and the scratch arrays
    of the forecast all-reduces (two per key, ``count + 1`` elements each)."""

    __slots__ = ("successor", "last", "scratch", "size")

    def __init__(self, size: int):
        self.successor: dict = {}   # key -> (the next call's key, whether that one is a blocking all-reduce)
        self.last = None            # the key of the last checked call (None before the first)
        self.scratch: dict = {}
        self.size = size

    def step(self, key: tuple):
        """The key forecast for the call ``key`` where it is a blocking all-reduce (else None); ``key`` then joins
        the history."""
        successor = self.successor
        forecast, carry = successor.get(self.last, _NONE)
        if forecast != key:
            if len(successor) >= FORECAST_SIZE:
                successor.clear()
            successor[self.last] = key, key[0] == CARRIER and key[2] * np.dtype(key[1]).itemsize <= FORECAST_BYTES
        self.last = key
        return forecast if carry else None

    def spare(self, key: tuple) -> tuple:
        """Two arrays of ``key``'s count and dtype: what a rank that left a large forecast all-reduce reduces."""
        found = self.scratch.get(("spare", key))
        if found is None:
            if len(self.scratch) >= SCRATCH_KEYS:
                self.scratch.clear()
            found = self.scratch[("spare", key)] = np.zeros(key[2], dtype=key[1]), np.zeros(key[2], dtype=key[1])
        return found

    def arrays(self, key: tuple) -> tuple:
        """``(send, receive, data in send, data in receive, count, agree, disagree, expected, op)`` of a forecast
        all-reduce ``key``: two scratch arrays of ``count + 1`` elements and views of their first ``count``, the flag
        values, the flag's result when every rank agrees, and the op's name for MPI (``avg`` sums)."""
        found = self.scratch.get(key)
        if found is None:
            if len(self.scratch) >= SCRATCH_KEYS:
                self.scratch.clear()
            _, char, count, op, _ = key
            agree, disagree, expected = FLAGS[op]
            n = count + 1 if count * np.dtype(char).itemsize <= CARRY_BYTES else 1   # larger: the flag alone
            send, receive = np.zeros(n, dtype=char), np.zeros(n, dtype=char)
            found = self.scratch[key] = (send, receive, send[:count], receive[:count], count, agree, disagree,
                                         self.size if expected is None else expected, "sum" if op == "avg" else op)
        return found


_NONE = (None, False)
