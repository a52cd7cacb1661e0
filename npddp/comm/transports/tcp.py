"""The TCP transport: non-blocking point-to-point messages over one socket per pair of ranks.

:class:`TCPWorld` holds every rank's connection to every other (:mod:`npddp.comm.transports.peer`:
frames, matching by (context, tag) per peer, early frames) and the progress loop over them;
:class:`TCPTransport` is a group of its ranks with a message context of its own.

Each transport has a context of its own (:meth:`TCPWorld.transport`); once it is garbage
collected its context is retired and frames that still arrive for it are read and dropped, so
a communicator abandoned after a TimeoutError never feeds a later one.

Progress happens inside ``test()``: every call tries each peer with work pending, without
blocking.
"""

from __future__ import annotations

import time
import weakref

import numpy as np

from npddp.comm.transports.peer import Peer, SelfPeer, TCPRequest, as_bytes, kind_code

CONTROL = 0xFFFFFFFF             # the context of the world's own agreement messages


class TCPWorld:
    """Every rank's connection to every other: the peers, and the progress loop over them."""

    def __init__(self, rank: int, size: int, socks: list, hosts: list[str]):
        self.rank, self.size, self.hosts = rank, size, hosts
        self.peers = [SelfPeer(self, r) if r == rank else Peer(self, r, socks[r]) for r in range(size)]
        self._remote = [p for p in self.peers if isinstance(p, Peer)]
        self._contexts = 0
        self.retired: set[int] = set()   # contexts of transports that were garbage collected

    def held_bytes(self) -> int:
        """Bytes of the buffers kept for frames that arrive before their receive (in use and spare)."""
        total = 0
        for peer in self._remote:
            total += sum(len(b) for b in peer.spare)
            total += sum(len(f) for frames in peer.early.values() for f in frames)
        return total

    def progress(self) -> None:
        """Move every peer's pending frames as far as the sockets allow, without blocking."""
        for peer in self._remote:
            if peer.sends:
                peer.push()
            if peer.nposted or peer.target is not None:
                peer.pull()

    def transport(self, ranks=None) -> TCPTransport:
        """A transport over ``ranks`` (default: all) with a message context of its own.

        Call it on every rank of ``ranks`` in the same order, as MPI communicators are created.
        """
        ranks = list(range(self.size)) if ranks is None else [int(r) for r in ranks]
        if self.rank not in ranks:
            raise ValueError(f"rank {self.rank} is not in the group {ranks}")
        context = self._contexts
        self._contexts += 1
        transport = TCPTransport(self, context, ranks)
        weakref.finalize(transport, self.retire, context)
        return transport

    def retire(self, context: int) -> None:
        """Forget ``context``: frames kept for it are freed, frames still arriving for it are dropped."""
        self.retired.add(context)
        for peer in self.peers:
            for key in [k for k in peer.early if k[0] == context]:
                del peer.early[key], peer.early_kinds[key]
            for key in [k for k in peer.posted if k[0] == context]:
                if isinstance(peer, Peer):
                    peer.nposted -= len(peer.posted[key])
                del peer.posted[key]

    def agreed_transport(self, timeout: float) -> TCPTransport:
        """A transport over every rank whose context all ranks agree on (the largest any proposes).

        Collective: every rank calls it. A rank that made more transports than another (e.g.
        one created after a failure elsewhere) still lands on the same, fresh context.
        """
        if self.size > 1:
            mine = np.array([self._contexts], dtype=np.uint64)
            if self.rank == 0:
                theirs = np.zeros((self.size, 1), dtype=np.uint64)
                self._wait([self.peers[r].irecv(as_bytes(theirs[r]), (CONTROL, 0)) for r in range(1, self.size)],
                           timeout)
                mine[0] = max(int(mine[0]), int(theirs.max()))
                self._wait([self.peers[r].isend(as_bytes(mine), (CONTROL, 1)) for r in range(1, self.size)], timeout)
            else:
                agreed = np.zeros(1, dtype=np.uint64)
                self._wait([self.peers[0].isend(as_bytes(mine), (CONTROL, 0)),
                            self.peers[0].irecv(as_bytes(agreed), (CONTROL, 1))], timeout)
                mine = agreed
            self._contexts = int(mine[0])
        return self.transport()

    def _wait(self, requests: list, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not all(r.test() for r in requests):
            if time.monotonic() > deadline:
                for r in requests:
                    r.cancel()
                raise TimeoutError(f"rank {self.rank} waited {timeout:g} s for every rank to agree on a "
                                   "communicator's context")

    def close(self) -> None:
        """Close every connection."""
        for peer in self._remote:
            peer.sock.close()


class TCPTransport:
    """Point-to-point messages among a group of a :class:`TCPWorld`'s ranks, in a context of its own."""

    name = "tcp"
    #: The largest tag a frame carries (its header's 32-bit field).
    tag_bound = (1 << 32) - 1

    def __init__(self, world: TCPWorld, context: int, ranks: list[int]):
        self.world, self.context, self.ranks = world, context, ranks
        self.rank, self.size = ranks.index(world.rank), len(ranks)
        self._peers = [world.peers[r] for r in ranks]
        self.hosts = [world.hosts[r] for r in ranks]
        #: This process's place in the job (errors name a group's rank with it: npddp.comm.engine.call.rank_label).
        self.world_rank, self.world_size = world.rank, world.size

    def isend(self, buf: np.ndarray, dest: int, tag: int) -> TCPRequest:
        """Queue a frame of ``buf``'s bytes (and its dtype) to ``dest``; written now as far as the socket takes it."""
        return self._peers[dest].isend(as_bytes(buf), (self.context, tag), kind_code(buf.dtype))

    def irecv(self, buf: np.ndarray, source: int, tag: int) -> TCPRequest:
        """Post a receive of the next frame from ``source`` with ``tag`` into ``buf``."""
        return self._peers[source].irecv(as_bytes(buf), (self.context, tag))

    def unmatched_tags(self, source: int) -> list:
        """Tags of frames from ``source`` in this context that were read (or announced) before their receive."""
        peer, context = self._peers[source], self.context
        tags = [tag for ctx, tag in peer.early if ctx == context]
        pending = peer.pending   # a parsed header whose frame waits in the socket
        if pending is not None and pending[0][0] == context:
            tags.append(pending[0][1])
        return tags

    def split(self, colors) -> TCPTransport:
        """The transport among the ranks whose color matches this rank's (call on every rank, same list)."""
        mine = colors[self.rank]
        return self.world.transport([self.ranks[r] for r in range(self.size) if colors[r] == mine])
