"""Backend that calls the MPI library's own collectives through mpi4py's buffer methods.

How each call runs (MPI's non-blocking variant polled against the deadline, or the blocking one under
``timeout=inf``; a rank that left the job; the argument check) is :class:`~npddp.comm.mpi_calls.MPICalls`,
this backend's base: see :mod:`npddp.comm.mpi_calls`.

``op="avg"``: MPI sums, then the sum is scaled by 1/N in place (MPI has no average op).
"""

from __future__ import annotations

import weakref

import numpy as np
from mpi4py import MPI

from npddp.comm import checks as c
from npddp.comm import signature as sg
from npddp.comm.communicators import split as sp
from npddp.comm.engine.exchange import offsets
from npddp.comm.engine.work import DoneWork
from npddp.comm.mpi_calls import MPI_OPS, MPICalls, MPIWork, Received, no_request
from npddp.comm.transports.mpi import free_comm


class MPICommunicator(MPICalls):
    """Communicator over MPI's native collectives (Allreduce, Bcast, Iallreduce, ...)."""

    name = "mpi"

    def barrier(self) -> None:
        """MPI_Barrier."""
        comm = self.comm
        self._check_usable()
        self._run("barrier", comm.Barrier, comm.Ibarrier, sig=())

    def broadcast(self, buf, root=0):
        """MPI_Bcast in place."""
        c.check_buffer(buf)
        root = c.check_rank(root, self._size)
        self._check_usable()
        if buf.size:
            comm = self.comm
            self._run("broadcast", lambda: comm.Bcast(buf, root=root), lambda: comm.Ibcast(buf, root=root),
                      sig=(buf, None, root))
        else:
            self._nothing("broadcast", buf, None, root)
        return buf

    def allreduce(self, buf, op="sum", out=None):
        """MPI_Allreduce, with MPI_IN_PLACE when ``out`` is None (or ``buf`` itself)."""
        c.check_op(op)
        mpi_op, comm = MPI_OPS.get(op, MPI.SUM), self.comm
        if out is None or out is buf:
            c.check_buffer(buf)
            scale = c.average_scale(op, buf, self._size)
            self._check_usable()
            if buf.size and self._size > 1:
                self._run("allreduce", lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=mpi_op),
                          lambda: comm.Iallreduce(MPI.IN_PLACE, buf, op=mpi_op), sig=(buf, op), carry=(buf, buf))
                if scale:  # op avg: MPI sums, then the sum is scaled in place
                    np.multiply(buf, scale, out=buf)
            else:
                self._nothing("allreduce", buf, op, carry=(buf, buf))
            return buf
        c.check_buffer(buf, writable=False)
        c.check_out(buf, out)
        scale = c.average_scale(op, buf, self._size)
        self._check_usable()
        if self._size == 1 or buf.size == 0:
            self._nothing("allreduce", buf, op, carry=(buf, out))
            np.copyto(out, buf)
        else:
            self._run("allreduce", lambda: comm.Allreduce(buf, out, op=mpi_op),
                      lambda: comm.Iallreduce(buf, out, op=mpi_op), sig=(buf, op), carry=(buf, out))
            if scale:
                np.multiply(out, scale, out=out)
        return out

    def iallreduce(self, buf, op="sum"):
        """MPI_Iallreduce in place; with ``check_args`` it starts once every rank's signature has agreed."""
        c.check_op(op)
        c.check_buffer(buf)
        scale = c.average_scale(op, buf, self._size)
        self._check_usable()
        self._calls += 1
        comm, mpi_op = self.comm, MPI_OPS.get(op, MPI.SUM)
        if self._checking:
            return self._checked("iallreduce", lambda: comm.Iallreduce(MPI.IN_PLACE, buf, op=mpi_op), buf, scale,
                                 buf, op)
        return MPIWork(self, comm.Iallreduce(MPI.IN_PLACE, buf, op=mpi_op), buf, "iallreduce", scale)

    def reduce_scatter(self, buf, op="sum"):
        """MPI_Reduce_scatter with ``np.array_split`` block counts."""
        c.check_op(op)
        c.check_buffer(buf, writable=False)
        scale = c.average_scale(op, buf, self._size)
        flat = buf.reshape(-1)
        counts = np.diff(c.block_bounds(flat.size, self._size)).tolist()
        out = np.empty(counts[self._rank], dtype=buf.dtype)
        self._check_usable()
        if self._size == 1:
            np.copyto(out, flat)
        elif flat.size:
            comm, mpi_op = self.comm, MPI_OPS.get(op, MPI.SUM)
            self._run("reduce_scatter", lambda: comm.Reduce_scatter(flat, out, recvcounts=counts, op=mpi_op),
                      lambda: comm.Ireduce_scatter(flat, out, recvcounts=counts, op=mpi_op), sig=(buf, op))
            if scale:
                np.multiply(out, scale, out=out)
        else:
            self._nothing("reduce_scatter", buf, op)
        return out

    def allgather(self, buf):
        """MPI_Allgather into a ``(size, *shape)`` array."""
        c.check_buffer(buf, writable=False)
        out = np.empty((self._size, *buf.shape), dtype=buf.dtype)
        self._check_usable()
        if buf.size:
            comm = self.comm
            self._run("allgather", lambda: comm.Allgather(buf, out), lambda: comm.Iallgather(buf, out), sig=(buf,))
        else:
            self._nothing("allgather", buf)
        return out

    def gather(self, buf, root=0):
        """MPI_Gather into a ``(size, *shape)`` array on root."""
        c.check_buffer(buf, writable=False)
        root = c.check_rank(root, self._size)
        out = np.empty((self._size, *buf.shape), dtype=buf.dtype) if self._rank == root else None
        self._check_usable()
        if buf.size:
            comm = self.comm
            self._run("gather", lambda: comm.Gather(buf, out, root=root), lambda: comm.Igather(buf, out, root=root),
                      sig=(buf, None, root))
        else:
            self._nothing("gather", buf, None, root)
        return out

    def scatter(self, buf, root=0):
        """MPI_Scatter of root's ``(size, *block)`` array."""
        c.check_stacked(buf, self._size)
        root = c.check_rank(root, self._size)
        out = np.empty(buf.shape[1:], dtype=buf.dtype)
        self._check_usable()
        if out.size:
            comm, send = self.comm, buf if self._rank == root else None
            self._run("scatter", lambda: comm.Scatter(send, out, root=root),
                      lambda: comm.Iscatter(send, out, root=root), sig=(buf, None, root))
        else:
            self._nothing("scatter", buf, None, root)
        return out

    def send(self, buf, dest, tag=0):
        """MPI_Send (MPI_Isend polled against the deadline)."""
        c.check_buffer(buf, writable=False)
        dest, tag, comm = c.check_rank(dest, self._size, "dest"), c.check_tag(tag), self.comm
        self._run(f"send (tag {tag})", lambda: comm.Send([buf, MPI.BYTE], dest=dest, tag=tag),
                  lambda: comm.Isend([buf, MPI.BYTE], dest=dest, tag=tag), f"to send to rank {dest}", peer=dest)

    def recv(self, buf, source, tag=0, status=None):
        """MPI_Recv into ``buf`` (MPI_Irecv polled against the deadline); ``status`` gets the count (MPI carries no
        dtype); ValueError when the message does not fit."""
        c.check_buffer(buf)
        source, tag, comm = c.check_rank(source, self._size, "source"), c.check_tag(tag), self.comm
        got = Received(None, buf, source, tag, status, f"[rank {self._rank}] mpi recv")

        def start():
            got.request = comm.Irecv([buf, MPI.BYTE], source=source, tag=tag)
            return got
        self._run(f"recv (tag {tag})", lambda: got.blocking(comm), start, f"to receive from rank {source}", peer=source)
        return buf

    def isend(self, buf, dest, tag=0):
        """MPI_Isend; its Work's ``wait`` (at most the timeout) returns ``buf``."""
        c.check_buffer(buf, writable=False)
        dest, tag = c.check_rank(dest, self._size, "dest"), c.check_tag(tag)
        self._check_usable()
        return MPIWork(self, self.comm.Isend([buf, MPI.BYTE], dest=dest, tag=tag), buf,
                       f"isend (tag {tag}) to rank {dest}", peer=dest)

    def irecv(self, buf, source, tag=0, status=None):
        """MPI_Irecv into ``buf``; its Work's ``wait`` (at most the timeout) returns ``buf`` and fills ``status``."""
        c.check_buffer(buf)
        source, tag = c.check_rank(source, self._size, "source"), c.check_tag(tag)
        self._check_usable()
        got = Received(self.comm.Irecv([buf, MPI.BYTE], source=source, tag=tag), buf, source, tag, status,
                       f"[rank {self._rank}] mpi irecv")
        return MPIWork(self, got, buf, f"irecv (tag {tag}) from rank {source}", peer=source)

    def split(self, color, key=0):
        """MPI_Comm_split after an all-gather of every rank's (color, key) (collective); None for color None or
        negative. The child has this one's timeout and check_args, and frees its MPI communicator when dropped."""
        color, key = sp.check_split(color, key)
        self._check_usable()
        table = sp.choices(self, color, key)
        group = sp.members(table, self._rank)
        mpi_color = MPI.UNDEFINED if group is None else sp.dense_colors(table)[self._rank]
        sub = self.comm.Split(mpi_color, 0 if group is None else group.index(self._rank))
        if group is None:
            return None
        child = MPICommunicator(sub, self._timeout, check_args=self.check_args)
        weakref.finalize(child, free_comm, sub, child._abandoned)
        return child

    def ireduce_scatter(self, buf, op="sum", out=None):
        """MPI_Ireduce_scatter with ``np.array_split`` block counts into ``out`` (this rank's block)."""
        c.check_op(op)
        c.check_buffer(buf, writable=False)
        scale = c.average_scale(op, buf, self._size)   # op avg: MPI sums, the block is scaled on completion
        out = c.check_block_out(buf, out, self._size, self._rank)
        self._check_usable()
        flat = buf.reshape(-1)
        self._calls += 1
        if self._size == 1 or flat.size == 0:
            np.copyto(out, flat)
            return self._checked("ireduce_scatter", no_request, out, 0.0, buf, op) if self._checking else DoneWork(out)
        counts = np.diff(c.block_bounds(flat.size, self._size)).tolist()
        comm, mpi_op = self.comm, MPI_OPS["sum" if scale else op]
        start = lambda: comm.Ireduce_scatter(flat, out, recvcounts=counts, op=mpi_op)  # noqa: E731
        if self._checking:
            return self._checked("ireduce_scatter", start, out, scale, buf, op)
        return MPIWork(self, start(), out, "ireduce_scatter", scale)

    def iallgather(self, buf, out=None):
        """MPI_Iallgather into ``out`` of shape ``(size, *buf.shape)`` (MPI_IN_PLACE when ``buf`` is ``out[rank]``)."""
        c.check_buffer(buf, writable=False)
        out = c.check_stacked_out(buf, out, self._size, self._rank)
        self._check_usable()
        self._calls += 1
        if buf.size == 0 or self._size == 1:
            if not c.is_row(buf, out, self._rank):
                out.reshape(self._size, -1)[self._rank] = buf.reshape(-1)
            return self._checked("iallgather", no_request, out, 0.0, buf) if self._checking else DoneWork(out)
        comm, send = self.comm, MPI.IN_PLACE if c.is_row(buf, out, self._rank) else buf
        if self._checking:
            return self._checked("iallgather", lambda: comm.Iallgather(send, out), out, 0.0, buf)
        return MPIWork(self, comm.Iallgather(send, out), out, "iallgather")

    # --- all-to-all: MPI_Alltoall and MPI_Alltoallv, moved as bytes ---------------------
    def alltoall(self, buf, out=None):
        """MPI_Alltoall: rank r's ``buf[j]`` lands in rank j's ``out[r]``; both ``(size, *block)``."""
        out = c.check_alltoall(buf, out, self._size)
        self._check_usable()
        if buf.size and self._size > 1:
            comm, send, recv = self.comm, [buf, MPI.BYTE], [out, MPI.BYTE]
            self._run("alltoall", lambda: comm.Alltoall(send, recv), lambda: comm.Ialltoall(send, recv), sig=(buf,))
        else:
            out[...] = buf
            self._nothing("alltoall", buf)
        return out

    def ialltoall(self, buf, out=None):
        """MPI_Ialltoall into ``out`` (None: a new array); with ``check_args`` it starts once every rank agrees."""
        out = c.check_alltoall(buf, out, self._size)
        self._check_usable()
        self._calls += 1
        if buf.size == 0 or self._size == 1:
            out[...] = buf
            return self._checked("ialltoall", no_request, out, 0.0, buf) if self._checking else DoneWork(out)
        comm, send, recv = self.comm, [buf, MPI.BYTE], [out, MPI.BYTE]
        if self._checking:
            return self._checked("ialltoall", lambda: comm.Ialltoall(send, recv), out, 0.0, buf)
        return MPIWork(self, comm.Ialltoall(send, recv), out, "ialltoall")

    def alltoallv(self, buf, sendcounts, recvcounts, out=None):
        """MPI_Alltoallv: rank r's block j of flat ``buf`` (``sendcounts[j]`` elements) lands as block r of rank j's
        1-d ``out`` (``recvcounts[r]`` elements); with ``check_args`` every pair's counts agree first."""
        send, recv, flat, out = c.check_alltoallv(buf, sendcounts, recvcounts, out, self._size, self._rank)
        self._check_usable()
        if self._size == 1:
            out[...] = flat
            return out
        comm, smsg, rmsg = self.comm, _vector(flat, send), _vector(out, recv)
        self._run("alltoallv", lambda: comm.Alltoallv(smsg, rmsg), lambda: comm.Ialltoallv(smsg, rmsg),
                  sig=(sg.typed(buf.dtype),), extra=sg.counts_row(send, recv))
        return out

    def ialltoallv(self, buf, sendcounts, recvcounts, out=None):
        """MPI_Ialltoallv into ``out`` (None: a new array); with ``check_args`` it starts once every rank agrees."""
        send, recv, flat, out = c.check_alltoallv(buf, sendcounts, recvcounts, out, self._size, self._rank)
        self._check_usable()
        self._calls += 1
        if self._size == 1:
            out[...] = flat
            return DoneWork(out)
        comm, smsg, rmsg = self.comm, _vector(flat, send), _vector(out, recv)
        if self._checking:
            return self._checked("ialltoallv", lambda: comm.Ialltoallv(smsg, rmsg), out, 0.0, sg.typed(buf.dtype),
                                 extra=sg.counts_row(send, recv))
        return MPIWork(self, comm.Ialltoallv(smsg, rmsg), out, "ialltoallv")


def _vector(flat: np.ndarray, counts: np.ndarray) -> list:
    """An MPI vector message of ``flat`` cut into blocks of ``counts`` elements, in bytes."""
    size = flat.itemsize
    return [flat, ([int(n) * size for n in counts], [b * size for b in offsets(counts)[:-1]]), MPI.BYTE]
