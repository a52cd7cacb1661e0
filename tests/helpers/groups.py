"""Groups for communicator tests: a group of one rank, and point-to-point-only wrappers that count message calls."""

from __future__ import annotations

from collections import Counter

from npddp.comm import BACKENDS

from tests.helpers.ranks import TCP_MODE

#: Backends built from point-to-point messages only.
P2P_BACKENDS = tuple(b for b in BACKENDS if b != "mpi")

#: The only methods of an mpi4py communicator a point-to-point backend may call (``Split``: hier's
#: one setup call, making its group across nodes; never on the data path; ``Iprobe``: a checked call
#: that waits long looks at what its peers sent).
P2P_METHODS = frozenset({"Get_rank", "Get_size", "Send", "Recv", "Sendrecv", "Isend", "Irecv", "Iprobe", "Split"})


def one_rank_group():
    """A group of this rank alone: MPI's COMM_SELF, or a TCP world of one."""
    if TCP_MODE:
        from npddp.comm.transports.tcp import TCPWorld
        return TCPWorld(0, 1, [None], ["self"]).transport()
    from mpi4py import MPI
    return MPI.COMM_SELF


class P2POnly:
    """Wraps an mpi4py communicator; only ``P2P_METHODS`` may be used, and each use is counted."""

    def __init__(self, mpi_comm):
        self._comm = mpi_comm
        self.calls: Counter = Counter()

    def __getattr__(self, name):
        if name not in P2P_METHODS:
            raise AttributeError(f"{name} is not a point-to-point method; allowed: {sorted(P2P_METHODS)}")
        self.calls[name] += 1
        return getattr(self._comm, name)

    def messages(self) -> int:
        """Number of message calls so far (everything except Get_rank/Get_size)."""
        return sum(n for name, n in self.calls.items() if not name.startswith("Get_"))


class CountingTransport:
    """Wraps a transport (TCP): the same messages, each ``isend``/``irecv`` counted."""

    def __init__(self, transport):
        self._t = transport
        self.name, self.rank, self.size = transport.name, transport.rank, transport.size
        self.calls: Counter = Counter()

    def isend(self, buf, dest, tag):
        self.calls["isend"] += 1
        return self._t.isend(buf, dest, tag)

    def irecv(self, buf, source, tag):
        self.calls["irecv"] += 1
        return self._t.irecv(buf, source, tag)

    def split(self, colors):
        """The wrapped transport's split, itself counted."""
        return CountingTransport(self._t.split(colors))

    def messages(self) -> int:
        """Number of message calls so far."""
        return sum(self.calls.values())


def new_held(world, before: int) -> int:
    """Bytes TCP's early-frame buffers grew by since ``before`` (0 without TCP, or when they shrank).

    They shrink when a buffer kept before is being read into at the moment of measuring; that buffer
    was allocated before tracing began, so it frees no traced memory and must not lower the allowance.
    """
    return max(0, world.held_bytes() - before) if world is not None else 0
