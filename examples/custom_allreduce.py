"""A ring all-reduce written from scratch against npddp's public algorithm API; importing registers ``custom_ring``.

Try it:

    mpirun -n 4 python -m npddp.check --backend custom_ring --plugin examples.custom_allreduce
    python -m npddp.run --nproc 3 -m npddp.train --backend custom_ring --plugin examples.custom_allreduce

The vector is cut into one block per rank. The ring passes blocks to the right neighbour:

1. Reduce-scatter, N-1 steps: in step s, rank r sends block r-s and receives block r-s-1 from
   its left neighbour, which it reduces into its own copy. Each block travels once around the
   ring, gathering one contribution per rank, so afterwards rank r holds block r+1 complete.
2. All-gather, N-1 steps: rank r passes the complete blocks on, starting with block r+1,
   and stores what arrives in place.

Every element is reduced at one place, in one order, and only copied afterwards, so every rank
ends with the same bits. Each rank sends 2(N-1)/N of the vector in 2(N-1) steps.
"""

from npddp.comm import register_algorithm
from npddp.comm.algorithms.api import Cost, block_bounds


def custom_ring(peers, buf):
    """All-reduce flat ``buf`` in place over ``peers.size`` ranks; each ``yield`` waits for its messages."""
    n, rank = peers.size, peers.rank
    left, right = (rank - 1) % n, (rank + 1) % n
    bounds = block_bounds(buf.size, n)

    def block(i):
        i %= n
        return buf[bounds[i]:bounds[i + 1]]

    got = peers.scratch(bounds[1] - bounds[0], buf.dtype)  # block 0 is the largest one
    for s in range(n - 1):  # 1. reduce-scatter
        mine, incoming = block(rank - s), block(rank - s - 1)
        part = got[:incoming.size]
        yield peers.irecv(part, left), peers.isend(mine, right)
        peers.reduce(incoming, part, out=incoming)
    for s in range(n - 1):  # 2. all-gather: forward complete blocks, receive the others in place
        yield peers.irecv(block(rank - s), left), peers.isend(block(rank + 1 - s), right)


def cost(nbytes, size, chunk_bytes=None):
    """2(N-1) messages in a row; 2(N-1)/N of the vector sent and (N-1)/N reduced by each rank."""
    share = (size - 1) / size
    return Cost(steps=2 * (size - 1), sent=2 * share * nbytes, reduced=share * nbytes)


register_algorithm("custom_ring", custom_ring, cost=cost)
