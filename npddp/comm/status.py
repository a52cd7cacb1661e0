"""What a point-to-point receive got, as MPI's status tells it, and the check of it against the buffer.

:class:`Status` is filled by ``recv(buf, source, tag, status=...)`` and ``irecv(..., status=...)``
once the message is in: its sender, tag, byte and element count, and the sender's dtype where the
transport carries it (TCP does, in each frame's header; MPI's messages carry no type, so there it is
None). :func:`check_received` raises the one-line ValueError of a message that does not fit the
buffer: another dtype, or bytes that are not a whole number of the buffer's elements. Only the
first ``count`` elements of a longer buffer are written, as with MPI.
"""

from __future__ import annotations

import numpy as np


class Status:
    """The sender, tag, element ``count`` (of the receive buffer's dtype), ``nbytes`` and the sender's ``dtype``
    (None where the transport does not carry it) of a completed receive; -1 and None before."""

    __slots__ = ("source", "tag", "count", "nbytes", "dtype")

    def __init__(self):
        self.source = self.tag = self.count = self.nbytes = -1
        self.dtype: np.dtype | None = None

    def __repr__(self) -> str:
        return (f"Status(source={self.source}, tag={self.tag}, count={self.count}, nbytes={self.nbytes}, "
                f"dtype={self.dtype})")


def check_received(buf: np.ndarray, nbytes: int | None, dtype, source: int, tag: int, status: Status | None,
                   where: str) -> None:
    """Check a received message (``nbytes`` and the sender's ``dtype``, each None when unknown) against ``buf``;
    fill ``status``. ValueError (``where``, e.g. ``[rank 1] ring recv``, then the sender and tag) on another dtype
    or a partial element."""
    where = f"{where} from rank {source} (tag {tag})"
    if nbytes is None:
        nbytes = buf.nbytes                     # a transport that does not say: as if it filled the buffer
    if dtype is not None and dtype != buf.dtype:
        raise ValueError(f"{where}: the message holds {nbytes // dtype.itemsize} {dtype} "
                         f"({nbytes} bytes), the receive buffer is {buf.dtype}; its bytes were copied unconverted: "
                         "send and receive the same dtype")
    if nbytes % buf.itemsize:
        raise ValueError(f"{where}: the message has {nbytes} bytes, not a whole number of "
                         f"{buf.dtype} ({buf.itemsize} bytes each): the sender's dtype differs from the buffer's")
    if status is not None:
        status.source, status.tag, status.nbytes, status.count = source, tag, nbytes, nbytes // buf.itemsize
        status.dtype = dtype
