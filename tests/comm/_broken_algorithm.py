"""A deliberately wrong all-reduce for the checker's own test: rank 0 adds its value twice."""

from npddp.comm import register_algorithm


def broken_twice(peers, buf):
    """Exchange with every rank; rank 0 counts its own data twice for float16 sums (and only those)."""
    got = peers.scratch(buf.size, buf.dtype)
    total = buf.copy()
    for step in range(1, peers.size):
        to, frm = (peers.rank + step) % peers.size, (peers.rank - step) % peers.size
        yield peers.irecv(got, frm), peers.isend(buf, to)
        peers.reduce(total, got, out=total)
    if peers.rank == 0 and buf.dtype == "float16":
        peers.reduce(total, buf, out=total)
    buf[...] = total


register_algorithm("broken_twice", broken_twice)
