"""Backend that calls the MPI library's own collectives through mpi4py's buffer methods."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from . import _common as c

_MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}


class MPIWork:
    """Work handle over an MPI request."""

    __slots__ = ("_request", "_result", "_done")

    def __init__(self, request, result: np.ndarray):
        self._request = request
        self._result = result
        self._done = False

    def test(self) -> bool:
        """True once the MPI request has completed."""
        if not self._done:
            self._done = self._request.Test()
        return self._done

    def wait(self) -> np.ndarray:
        """Wait for the MPI request; return the reduced buffer."""
        if not self._done:
            self._request.Wait()
            self._done = True
        return self._result


class MPICommunicator(c.RankedComm):
    """Communicator over MPI's native collectives (Allreduce, Bcast, Iallreduce, ...)."""

    name = "mpi"

    def __init__(self, mpi_comm=None):
        super().__init__(MPI.COMM_WORLD if mpi_comm is None else mpi_comm)

    def barrier(self) -> None:
        """MPI_Barrier."""
        self.comm.Barrier()

    def broadcast(self, buf, root=0):
        """MPI_Bcast in place."""
        c.check_buffer(buf)
        root = c.check_rank(root, self._size)
        if buf.size:
            self.comm.Bcast(buf, root=root)
        return buf

    def allreduce(self, buf, op="sum", out=None):
        """MPI_Allreduce, with MPI_IN_PLACE when ``out`` is None."""
        c.check_op(op)
        if out is None:
            c.check_buffer(buf)
            if buf.size and self._size > 1:
                self.comm.Allreduce(MPI.IN_PLACE, buf, op=_MPI_OPS[op])
            return buf
        c.check_buffer(buf, writable=False)
        c.check_out(buf, out)
        if self._size == 1 or buf.size == 0:
            np.copyto(out, buf)
        else:
            self.comm.Allreduce(buf, out, op=_MPI_OPS[op])
        return out

    def iallreduce(self, buf, op="sum"):
        """MPI_Iallreduce in place."""
        c.check_op(op)
        c.check_buffer(buf)
        return MPIWork(self.comm.Iallreduce(MPI.IN_PLACE, buf, op=_MPI_OPS[op]), buf)

    def reduce_scatter(self, buf, op="sum"):
        """MPI_Reduce_scatter with ``np.array_split`` block counts."""
        c.check_op(op)
        c.check_buffer(buf, writable=False)
        flat = buf.reshape(-1)
        bounds = c.block_bounds(flat.size, self._size)
        counts = np.diff(bounds)
        out = np.empty(int(counts[self._rank]), dtype=buf.dtype)
        if self._size == 1:
            np.copyto(out, flat)
        elif flat.size:
            self.comm.Reduce_scatter(flat, out, recvcounts=counts.tolist(), op=_MPI_OPS[op])
        return out

    def allgather(self, buf):
        """MPI_Allgather into a ``(size, *shape)`` array."""
        c.check_buffer(buf, writable=False)
        out = np.empty((self._size, *buf.shape), dtype=buf.dtype)
        if buf.size:
            self.comm.Allgather(buf, out)
        return out

    def gather(self, buf, root=0):
        """MPI_Gather into a ``(size, *shape)`` array on root."""
        c.check_buffer(buf, writable=False)
        root = c.check_rank(root, self._size)
        out = np.empty((self._size, *buf.shape), dtype=buf.dtype) if self._rank == root else None
        if buf.size:
            self.comm.Gather(buf, out, root=root)
        return out

    def scatter(self, buf, root=0):
        """MPI_Scatter of root's ``(size, *block)`` array."""
        c.check_stacked(buf, self._size)
        root = c.check_rank(root, self._size)
        out = np.empty(buf.shape[1:], dtype=buf.dtype)
        if out.size:
            self.comm.Scatter(buf if self._rank == root else None, out, root=root)
        return out

    def send(self, buf, dest, tag=0):
        """MPI_Send."""
        c.check_buffer(buf, writable=False)
        self.comm.Send(buf, dest=c.check_rank(dest, self._size, "dest"), tag=c.check_tag(tag))

    def recv(self, buf, source, tag=0):
        """MPI_Recv into ``buf``."""
        c.check_buffer(buf)
        self.comm.Recv(buf, source=c.check_rank(source, self._size, "source"), tag=c.check_tag(tag))
        return buf
