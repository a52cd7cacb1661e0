"""Agreeing across ranks before acting: one rank's error stops every rank, text travels as bytes.

Faces call these at points every rank reaches together (after loading data, after writing a
file), so a problem seen by one rank becomes the same decision everywhere and no rank is left
waiting in a collective. Text crosses processes as a NumPy byte buffer, never pickled.
"""

from __future__ import annotations

import numpy as np

MESSAGE_BYTES = 2048   # longest error message shared between ranks


def agree(comm, message: str | None) -> str | None:
    """Share each rank's error (None: none) so every rank returns the same first one, or None."""
    raw = (message or "").encode()[:MESSAGE_BYTES]
    mine = np.zeros(MESSAGE_BYTES + 1, dtype=np.int32)                  # (1 + bytes,) length, bytes
    mine[0] = len(raw)
    mine[1:1 + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    table = comm.allgather(mine)                                        # (size, 1 + bytes)
    for r in range(comm.size):
        n = int(table[r, 0])
        if n:
            text = bytes(table[r, 1:1 + n].astype(np.uint8)).decode(errors="replace")
            return text if r == 0 else f"(on rank {r}) {text}"
    return None


def share_text(comm, text: str | None, root: int = 0) -> str:
    """Root's ``text`` on every rank (its length first, then its UTF-8 bytes, one int32 each)."""
    raw = (text or "").encode() if comm.rank == root else b""
    size = np.array([len(raw)], dtype=np.int64)
    comm.broadcast(size, root=root)
    buf = np.frombuffer(raw, dtype=np.uint8).astype(np.int32) if comm.rank == root \
        else np.zeros(int(size[0]), np.int32)                          # (bytes,) one int32 per byte
    comm.broadcast(buf, root=root)
    return bytes(buf.astype(np.uint8)).decode()


def any_rank(comm, flag: bool) -> bool:
    """True on every rank when ``flag`` is true on any rank."""
    box = np.array([1 if flag else 0], dtype=np.int64)
    comm.allreduce(box, op="max")
    return bool(box[0])
