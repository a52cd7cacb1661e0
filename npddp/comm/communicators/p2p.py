"""The communicator of every hand-written backend: one all-reduce algorithm, over any Transport.

:class:`P2PCommunicator` holds a :class:`~npddp.comm.transports.base.Transport` and the scratch pool,
and runs the all-reduce algorithm it was built with (``ring``, ``rd``, ``rabenseifner``, ``tree``,
or ``auto``'s choice per call). The other collectives use the same schedules for every
algorithm: a dissemination barrier, ring reduce-scatter and all-gather, linear gather and scatter;
the all-to-all and broadcast algorithms registered for their collectives, chosen by
``create(..., algorithms=...)`` and ``broadcast_algorithm``. The ``naive`` backend overrides
them with its root-based versions.

An all-reduce algorithm is a class with ``__init__(ctx)`` (a :class:`~npddp.comm.engine.call.Context`:
rank, size, transport, scratch pool, tunables) and ``start(call, src, dst, ufunc, result) -> Work``
that reduces flat ``src`` into flat ``dst`` (maybe ``src`` itself) and returns a Work handle; it
may cache plans on itself, offer a blocking ``run(call, src, dst, ufunc)``, and describe its
cost with a static ``cost(nbytes, size, chunk_bytes) -> Cost``. Reduce-scatter and all-gather
run the two halves of the ring's schedule (:mod:`npddp.comm.algorithms.ring`), so rank r's block is
block r for every backend.

Its base, :class:`~npddp.comm.communicators.lifecycle.CallLifecycle`, keeps the tag sequence and
the calls in flight: it opens every call (signed while ``check_args`` is on) and gives up on them
all after a timeout, a broken connection or a peer's differing arguments.
"""

from __future__ import annotations

import numpy as np

from npddp.comm import checks as c
from npddp.comm.communicators import split as sp
from npddp.comm.communicators.choice import CollectiveChoice
from npddp.comm.communicators.alltoall import AllToAll
from npddp.comm.communicators.lifecycle import CallLifecycle
from npddp.comm.communicators.point import PointWork
from npddp.comm.engine.call import CHUNK_BYTES, Context
from npddp.comm.engine.scratch import ScratchPool
from npddp.comm.engine.work import DoneWork
from npddp.comm.algorithms import registry


class P2PCommunicator(AllToAll, CallLifecycle):
    """Collectives built from a transport's point-to-point messages; all-reduce by ``algorithm``; all-to-all by
    :class:`~npddp.comm.communicators.alltoall.AllToAll`."""

    #: Broadcasts of at least this many bytes use a pipelined chain instead of a binomial tree.
    chain_bytes = CHUNK_BYTES

    def __init__(self, transport, algorithm, name: str, timeout: float = c.DEFAULT_TIMEOUT, algorithms=None):
        super().__init__(transport, name, timeout)
        self.scratch = ScratchPool()
        self.context = Context(transport, self.scratch, chunk_bytes=CHUNK_BYTES, window=2)
        self._algorithm = algorithm              # the class, for a split's child
        self._broadcast_name, self._broadcasters = "auto", {}   # the broadcast algorithm and its instances
        self.algorithm = algorithm(self.context) if algorithm is not None else None
        #: The algorithm of each other collective (``create(..., algorithms=...)``; :mod:`.choice`).
        self.choice = CollectiveChoice(self.context, algorithms or {}, self._default_choice())

    def _default_choice(self) -> str | None:
        """The algorithm the other collectives run unless named (None: :data:`.choice.DEFAULTS`)."""
        return None

    @property
    def chunk_bytes(self) -> int:
        """Ring steps, tree levels and chain broadcasts move chunks of at most this many bytes (default 1 MiB)."""
        return self.context.chunk_bytes

    @chunk_bytes.setter
    def chunk_bytes(self, value: int) -> None:
        self.context.chunk_bytes = int(value)

    @property
    def window(self) -> int:
        """Ring receives kept in flight (scratch slots of one chunk each; default 2)."""
        return self.context.window

    @window.setter
    def window(self, value: int) -> None:
        self.context.window = int(value)

    # --- all-reduce ------------------------------------------------------------------
    def allreduce(self, buf, op="sum", out=None):
        """Check, open the call, then run it: the algorithm's blocking path when nothing else is in flight."""
        prepared = self._prepare(buf, op, out, "allreduce")
        if prepared.__class__ is DoneWork:
            return prepared.wait()
        call, src, dst, ufunc, result = prepared
        if not self._active:
            run = self._blocking_path(src)
            if run is not None:
                run(call, src, dst, ufunc)
                call.apply_scale(dst)
                return result
        return self._allreduce_work(call, src, dst, ufunc, result).wait()

    def iallreduce(self, buf, op="sum"):
        """Start an in-place all-reduce; return its Work handle."""
        prepared = self._prepare(buf, op, None, "iallreduce")
        if prepared.__class__ is DoneWork:
            return prepared
        return self._allreduce_work(*prepared)

    def _prepare(self, buf, op, out, operation):
        """Check the arguments and open the call: ``(call, flat src, flat dst, ufunc, result)``, or a DoneWork."""
        ufunc = c.check_op(op)
        if out is None or out is buf:
            dst = c.check_buffer(buf)
        else:
            c.check_buffer(buf, writable=False)
            dst = c.check_out(buf, out)
        scale = c.average_scale(op, buf, self._size)
        call = self._begin(operation, None, buf, op)
        call.scale = scale
        # an empty buffer on the shared-memory path still meets the node's ranks at its barrier, where the sizes,
        # dtypes and ops are compared (that path never reads the transport, so no signature trade)
        if self._size == 1 or (buf.size == 0 and getattr(self, "node", None) is None):
            self._signed_empty(call)
            if dst is not buf:
                np.copyto(dst, buf)
            return DoneWork(dst)
        flat = buf.reshape(-1)
        return call, flat, flat if dst is buf else dst.reshape(-1), ufunc, dst

    def _blocking_path(self, src):
        """The algorithm's ``run(call, src, dst, ufunc)`` for a blocking call, if it has one."""
        return getattr(self.algorithm, "run", None)

    def _allreduce_work(self, call, src, dst, ufunc, result):
        """Start reducing flat ``src`` over ranks into flat ``dst`` with this communicator's algorithm."""
        return self.algorithm.start(call, src, dst, ufunc, result)

    # --- the other collectives -------------------------------------------------------
    def barrier(self) -> None:
        """Dissemination barrier: in round k, signal rank + 2**k and hear from rank - 2**k."""
        call = self._begin("barrier")
        empty, dist, size = self._empty, 1, self._size
        while dist < size:
            call.transfer([(empty, (self._rank - dist) % size)], [(empty, (self._rank + dist) % size)])
            dist <<= 1

    def broadcast(self, buf, root=0):
        """Root's ``buf`` to every rank in place, by the broadcast algorithm ``broadcast_algorithm`` names."""
        c.check_buffer(buf)
        root = c.check_rank(root, self._size)
        call = self._begin("broadcast", None, buf, None, root)
        self._signed_empty(call)   # a root receives nothing: it compares its signature with every peer's first
        if buf.size == 0 or self._size == 1:
            return buf
        self._broadcaster(buf.nbytes).run(call, buf.reshape(-1), root)
        return buf

    @property
    def broadcast_algorithm(self) -> str:
        """The broadcast algorithm by name (``registry.names("broadcast")``), or ``auto``: a binomial tree below
        ``chain_bytes`` (or on two ranks), a pipelined chain from there."""
        return self._broadcast_name

    @broadcast_algorithm.setter
    def broadcast_algorithm(self, name: str) -> None:
        if name != "auto":
            registry.algorithm(name, "broadcast")   # ValueError naming the valid ones
        self._broadcast_name = name

    def _broadcaster(self, nbytes: int):
        """The broadcast algorithm's instance for a buffer of ``nbytes`` (every rank alike: the count is signed)."""
        name = self._broadcast_name
        if name == "auto":
            name = "chain" if nbytes >= self.chain_bytes and self._size > 2 else "binomial"
        algorithm = self._broadcasters.get(name)
        if algorithm is None:
            algorithm = self._broadcasters[name] = registry.algorithm(name, "broadcast")(self.context)
        return algorithm

    def reduce_scatter(self, buf, op="sum"):
        """Rank r ends with block r (``np.array_split``'s) of the reduction, by the chosen algorithm."""
        opened = self._open_reduce_scatter(buf, op, None, "reduce_scatter")
        if isinstance(opened, DoneWork):
            return opened.wait()
        return self._reduce_scatter_work(*opened).wait()

    def allgather(self, buf):
        """Each rank's ``buf`` is its block of the stacked result ``(size, *buf.shape)``, by the chosen algorithm."""
        return self.iallgather(buf, None, "allgather").wait()

    def gather(self, buf, root=0):
        """Every rank sends ``buf`` to root, which receives them all at once."""
        c.check_buffer(buf, writable=False)
        root = c.check_rank(root, self._size)
        call = self._begin("gather", None, buf, None, root)
        self._signed_empty(call)   # the others receive nothing: every rank compares signatures with every peer first
        if self._rank != root:
            if buf.size:
                call.transfer(sends=[(buf, root)])
            return None
        out = np.empty((self._size, *buf.shape), dtype=buf.dtype)
        rows = out.reshape(self._size, -1)  # (size, buf.size)
        rows[root] = buf.reshape(-1)
        if buf.size:
            call.transfer(recvs=[(rows[s], s) for s in range(self._size) if s != root])
        return out

    def scatter(self, buf, root=0):
        """Root sends ``buf[i]`` to each rank i; the others receive their block."""
        c.check_stacked(buf, self._size)
        root = c.check_rank(root, self._size)
        call = self._begin("scatter", None, buf, None, root)
        self._signed_empty(call)   # the root receives nothing: every rank compares signatures with every peer first
        out = np.empty(buf.shape[1:], dtype=buf.dtype)
        if self._rank == root:
            rows = buf.reshape(self._size, -1)  # (size, block size)
            out[...] = buf[root]
            if out.size:
                call.transfer(sends=[(rows[d], d) for d in range(self._size) if d != root])
        elif out.size:
            call.transfer(recvs=[(out, root)])
        return out

    def send(self, buf, dest, tag=0):
        """Blocking send of ``buf`` with a user tag (times out like a collective)."""
        c.check_buffer(buf, writable=False)
        dest, tag = c.check_rank(dest, self._size, "dest"), c.check_tag(tag)
        self._begin("send", tag).transfer(sends=[(buf, dest)])

    def recv(self, buf, source, tag=0, status=None):
        """Blocking receive into ``buf`` with a user tag (times out like a collective); ``status``
        (:class:`~npddp.comm.status.Status`) gets the count and the sender's dtype; ValueError when the message
        does not fit ``buf``."""
        c.check_buffer(buf)
        source, tag = c.check_rank(source, self._size, "source"), c.check_tag(tag)
        return PointWork(self._begin("recv", tag), buf, source, is_recv=True, status=status).wait()

    def isend(self, buf, dest, tag=0):
        """Start a send of ``buf`` to ``dest`` with a user tag; its Work's ``wait`` returns ``buf``."""
        c.check_buffer(buf, writable=False)
        dest, tag = c.check_rank(dest, self._size, "dest"), c.check_tag(tag)
        return PointWork(self._begin("isend", tag), buf, dest, is_recv=False)

    def irecv(self, buf, source, tag=0, status=None):
        """Start a receive into ``buf`` from ``source`` with a user tag; its Work's ``wait`` returns ``buf`` and fills
        ``status``, as :meth:`recv`."""
        c.check_buffer(buf)
        source, tag = c.check_rank(source, self._size, "source"), c.check_tag(tag)
        return PointWork(self._begin("irecv", tag), buf, source, is_recv=True, status=status)

    # --- process groups --------------------------------------------------------------
    def split(self, color, key=0):
        """The communicator of the ranks that pass this rank's ``color``, ordered by ``key`` then rank, over a
        sub-transport with a message context of its own; None for color None or negative (collective)."""
        color, key = sp.check_split(color, key)
        world = sp.tcp_world(self.transport)
        table = sp.choices(self, color, key, world._contexts if world is not None else 0)
        if world is not None:   # a context fresh on every member, whichever groups each made before
            world._contexts = max(world._contexts, int(table[:, 2].max()))
        transport = sp.split_transport(self.transport, table)
        if transport is None:
            return None
        child = self._child(transport)
        child.check_args, child.broadcast_algorithm = self.check_args, self.broadcast_algorithm
        return child

    def _child(self, transport):
        """The same backend over ``transport`` (a split's group), with this one's timeout."""
        return type(self)(transport, self._algorithm, self.name, self._timeout, self.choice.chosen)

    # --- non-blocking reduce-scatter and all-gather ----------------------------------
    def ireduce_scatter(self, buf, op="sum", out=None):
        """Start :meth:`reduce_scatter` into ``out`` (this rank's block)."""
        opened = self._open_reduce_scatter(buf, op, out, "ireduce_scatter")
        if isinstance(opened, DoneWork):
            return opened
        return self._reduce_scatter_work(*opened)

    def _reduce_scatter_work(self, call, flat, ufunc, scale, out):
        """Start the chosen reduce-scatter algorithm: flat input -> this rank's block ``out``."""
        call.scale = scale
        return self.choice.algorithm("reduce_scatter", flat.nbytes).start(call, flat, out.reshape(-1), ufunc, out)

    def _open_reduce_scatter(self, buf, op, out, operation: str):
        """Check a reduce-scatter's arguments (``out`` None: allocate this rank's block) and open its call:
        (call, flat input, ufunc, avg scale, out block), or a finished :class:`DoneWork` holding ``out`` where
        there is nothing to move (one rank, or an empty buffer)."""
        ufunc = c.check_op(op)
        c.check_buffer(buf, writable=False)
        scale = c.average_scale(op, buf, self._size)
        out = c.check_block_out(buf, out, self._size, self._rank)
        call = self._begin(operation, None, buf, op)
        flat = buf.reshape(-1)
        if self._size == 1 or flat.size == 0:
            self._signed_empty(call)
            np.copyto(out, flat)
            return DoneWork(out)
        return call, flat, ufunc, scale, out

    def iallgather(self, buf, out=None, operation: str = "iallgather"):
        """Start :meth:`allgather` into ``out`` of shape ``(size, *buf.shape)``; ``buf`` may be ``out[rank]``."""
        c.check_buffer(buf, writable=False)
        out = c.check_stacked_out(buf, out, self._size, self._rank)
        call = self._begin(operation, None, buf)
        if not c.is_row(buf, out, self._rank):
            out.reshape(self._size, -1)[self._rank] = buf.reshape(-1)
        if buf.size == 0 or self._size == 1:
            self._signed_empty(call)
            return DoneWork(out)
        flat = out.reshape(-1)
        return self.choice.algorithm("allgather", flat.nbytes).start(call, flat, flat, None, out)
