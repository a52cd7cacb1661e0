"""The MPI transport: the hand-written algorithms' messages through mpi4py's ``Isend``/``Irecv``.

Messages are bytes (``MPI_BYTE``): what a receive got is counted in bytes and checked above, where
the receiving buffer's dtype is known. Only point-to-point methods of the wrapped communicator are
called (``Isend``, ``Irecv``, and ``Test``/``Cancel``/``Free`` on their requests), never a
collective, so an algorithm over this transport is a hand-written schedule, not MPI's. The one
exception is :meth:`MPITransport.split` (``MPI_Comm_split``), which ``hier`` calls once, at setup,
to make its group of ranks across nodes.
"""

from __future__ import annotations

import weakref

import numpy as np

from npddp.util import env


def free_comm(comm, abandoned: list) -> None:
    """Free a communicator this package duplicated, unless MPI is finalized or a request on it was abandoned.

    A message sent for an abandoned request may still arrive; once its context is freed MPI may
    give the context to a new communicator, which would then match it. So those are kept.
    """
    from mpi4py import MPI
    if not abandoned[0] and isinstance(comm, MPI.Comm) and comm != MPI.COMM_NULL and not MPI.Is_finalized():
        comm.Free()


def check_world_size(size: int, environ=None) -> None:
    """ValueError when MPI's world of ``size`` ranks is not the world the launcher announced.

    A library that cannot talk to the launcher's process manager starts every process as a world
    of its own (Open MPI under ``srun --mpi=pmi2``): N separate one-rank jobs, each "succeeding"."""
    announced = env.mpi_world_size(environ)
    if announced > 1 and size != announced:
        raise ValueError(f"MPI started a world of {size} rank{'s' * (size != 1)} but the launcher announced "
                         f"{announced}: this MPI does not speak the launcher's process manager (under srun: "
                         "--mpi=pmix for Open MPI, --mpi=pmi2 for MPICH and Intel MPI; see docs/slurm.md)")


def mpi_world():
    """``MPI.COMM_WORLD``, checked against the world size the launcher announced (:func:`check_world_size`)."""
    from mpi4py import MPI
    check_world_size(MPI.COMM_WORLD.Get_size())
    return MPI.COMM_WORLD


class MPIRequest:
    """A transport request over an mpi4py request; a receive's keeps its MPI status (the bytes that came)."""

    __slots__ = ("_request", "_done", "_is_recv", "_abandoned", "_status", "_room")

    def __init__(self, request, is_recv: bool, abandoned: list, status=None, room: int = 0):
        self._request = request
        self._done = False
        self._is_recv = is_recv
        self._abandoned = abandoned
        self._status, self._room = status, room   # a receive's MPI.Status and its buffer's bytes

    def test(self) -> bool:
        """MPI_Test; a receive whose message is longer than its buffer raises ValueError, as over TCP."""
        if not self._done:
            if self._status is None:
                self._done = self._request.Test()
            else:
                from mpi4py import MPI
                try:
                    self._done = self._request.Test(self._status)
                except MPI.Exception as exc:
                    if exc.Get_error_class() != MPI.ERR_TRUNCATE:
                        raise
                    self._done = True
                    status = self._status
                    raise ValueError(f"message from rank {status.Get_source()} with tag {status.Get_tag()} is longer "
                                     f"than the {self._room} bytes of the receive buffer (MPI: message truncated)"
                                     ) from None
        return self._done

    def received(self) -> tuple[int, None]:
        """A completed receive's payload bytes, and None: MPI's messages do not carry the sender's dtype."""
        return self._status.Get_count(), None

    def cancel(self) -> None:
        """Cancel (receives only: cancelling sends is not portable) and free; MPI may still touch the buffer.

        A request that has failed (a receive whose message did not fit) is complete: nothing to cancel;
        once MPI has ended (a communicator collected at exit), nothing can be."""
        if self._done:
            return
        self._done = True
        self._abandoned[0] = True
        if env.mpi_live() is None:
            return
        request = self._request
        try:
            done = request.Test()
        except Exception:   # mpi4py's MPI.Exception: the request completed with an error
            return
        if not done and self._is_recv:
            request.Cancel()
            try:
                done = request.Test()   # a receive's cancel is local: this completes (and frees) it at once
            except Exception:
                return
        if not done:
            request.Free()


class MPITransport:
    """Point-to-point messages over an mpi4py communicator (``MPI.COMM_WORLD`` when None)."""

    name = "mpi"

    def __init__(self, mpi_comm=None, dup: bool = False, owned: bool = False):
        """``dup``: run over a duplicate of ``mpi_comm`` (collective); ``owned``: ``mpi_comm`` was made for this
        transport. Either way the communicator is freed when the transport is collected (:func:`free_comm`)."""
        if mpi_comm is None:
            mpi_comm = mpi_world()
        self._abandoned = [False]
        if dup:  # a context of its own (collective): no other communicator ever matches its messages
            mpi_comm = mpi_comm.Dup()
        if dup or owned:
            weakref.finalize(self, free_comm, mpi_comm, self._abandoned)
        self.comm = mpi_comm
        self.rank = mpi_comm.Get_rank()
        self.size = mpi_comm.Get_size()
        from mpi4py import MPI
        #: The largest tag the library takes (``MPI_TAG_UB``: at least 32767; 2**29 - 1 or more in MPICH, Open MPI
        #: and Intel MPI), which bounds the shape indices the argument check folds into tags.
        self.tag_bound = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
        self._status, self._any_tag, self._new_status, self._byte = MPI.Status(), MPI.ANY_TAG, MPI.Status, MPI.BYTE

    def isend(self, buf: np.ndarray, dest: int, tag: int) -> MPIRequest:
        """MPI_Isend of ``buf``'s bytes."""
        return MPIRequest(self.comm.Isend([buf, self._byte], dest, tag), False, self._abandoned)

    def irecv(self, buf: np.ndarray, source: int, tag: int) -> MPIRequest:
        """MPI_Irecv into ``buf``'s bytes (a typed receive of a part of an element would abort MPICH)."""
        return MPIRequest(self.comm.Irecv([buf, self._byte], source, tag), True, self._abandoned, self._new_status(),
                          buf.nbytes)

    def unmatched_tags(self, source: int) -> tuple:
        """The tag of the first message from ``source`` that has arrived and no receive has taken (MPI_Iprobe)."""
        status = self._status
        return (status.Get_tag(),) if self.comm.Iprobe(source, self._any_tag, status) else ()

    def split(self, colors) -> "MPITransport":
        """The transport among the ranks whose color matches this rank's (collective: every rank, same list)."""
        return MPITransport(self.comm.Split(int(colors[self.rank]), self.rank), owned=True)
