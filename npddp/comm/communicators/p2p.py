"""The communicator of every hand-written backend: one all-reduce algorithm, over any Transport.

:class:`P2PCommunicator` holds a :class:`~npddp.comm.transports.base.Transport`, the tag sequence,
the scratch pool and the call bookkeeping, and runs the all-reduce algorithm it was built with
(``ring``, ``rd``, ``rabenseifner``, ``tree``, or ``auto``'s choice per call). The other
collectives use the same schedules for every algorithm: a dissemination barrier, a binomial
tree (small) or pipelined chain (large) broadcast, ring reduce-scatter and all-gather, linear
gather and scatter. The ``naive`` backend overrides them with its root-based versions.

An all-reduce algorithm is a class with ``__init__(ctx)`` (a :class:`~npddp.comm.engine.call.Context`:
rank, size, transport, scratch pool, tunables) and ``start(call, src, dst, ufunc, result) -> Work``
that reduces flat ``src`` into flat ``dst`` (maybe ``src`` itself) and returns a Work handle; it
may cache plans on itself, offer a blocking ``run(call, src, dst, ufunc)``, and describe its
cost with a static ``cost(nbytes, size, chunk_bytes) -> Cost``. Reduce-scatter and all-gather
run the two halves of the ring's schedule (:mod:`npddp.comm.p2p.ring`), so rank r's block is
block r for every backend.

Failure. A call still waiting ``timeout`` seconds after its first long wait raises
TimeoutError naming the operation, its number and the ranks it waits for; a peer whose
connection breaks raises ConnectionError. Either way every outstanding request is abandoned
(its buffers kept alive, since the transport may still touch them) and the communicator refuses
any further call, because its peers now stand at different points of the call sequence.
"""

from __future__ import annotations

import numpy as np

from npddp.comm import checks as c
from npddp.comm import signature as sg
from npddp.comm.base import Backend
from npddp.comm.communicators import split as sp
from npddp.comm.communicators.point import PointWork
from npddp.comm.engine.call import CHUNK_BYTES, Call, Context, TagSequence
from npddp.comm.engine.deadline import Overdue
from npddp.comm.engine.scratch import ScratchPool
from npddp.comm.engine.signed import AbortWatch, Signer
from npddp.comm.engine.work import DoneWork, P2PWork
from npddp.comm.p2p.ring import ReduceScatterWork, Ring


class P2PCommunicator(Backend):
    """Collectives built from a transport's point-to-point messages; all-reduce by ``algorithm``."""

    #: Broadcasts of at least this many bytes use a pipelined chain instead of a binomial tree.
    chain_bytes = CHUNK_BYTES

    def __init__(self, transport, algorithm, name: str, timeout: float = c.DEFAULT_TIMEOUT):
        self.transport = transport
        self.signer: Signer | None = None         # signs every collective's messages while check_args is on
        self.watch: AbortWatch | None = None      # the peers' aborts, while check_args is on
        self._rank, self._size = transport.rank, transport.size
        self.name = name
        self.timeout = timeout
        self.scratch = ScratchPool()
        self._tags = TagSequence()
        self._active: list[P2PWork] = []
        self._failure: str | None = None   # why this communicator is unusable
        self._stranded: list = []           # buffers and handles abandoned requests may still touch
        self._empty = np.empty(0, dtype=np.uint8)
        self.context = Context(transport, self.scratch, chunk_bytes=CHUNK_BYTES, window=2)
        self._ring = Ring(self.context)          # the schedule of reduce-scatter and all-gather
        self._algorithm = algorithm              # the class, for a split's child
        self.algorithm = algorithm(self.context) if algorithm is not None else None

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

    @property
    def check_args(self) -> bool:
        """Whether every collective checks that all ranks passed the same kind, dtype, count, op and root
        (:mod:`npddp.comm.engine.signed`); ``create`` turns it on unless ``NPDDP_CHECK_ARGS=0``."""
        return self.signer is not None

    @check_args.setter
    def check_args(self, on: bool) -> None:
        if bool(on) == self.check_args:
            return
        if self._active:
            raise RuntimeError("check_args cannot change while non-blocking calls are in flight; wait for them first")
        if on and self.watch is None and self._size > 1:
            self.watch = AbortWatch(self.transport)
        self.signer = Signer(self.transport) if on else None
        if not on:
            self._stranded.append(self.watch)   # its receives stay posted: a peer may still send to them
            self.watch = None
        for sub in self._sub_communicators():
            sub.check_args = on

    def _sub_communicators(self) -> tuple:
        """Communicators this one runs calls on (hier's across nodes), which check as it does."""
        return ()

    # --- calls, waits and giving up --------------------------------------------------
    def _begin(self, operation: str, user_tag: int | None = None, buf=None, op=None, root=None) -> Call:
        """Open a call (after its arguments were checked): a fresh collective tag, or the user's tag.

        With ``check_args``, a collective is a :class:`~npddp.comm.engine.signed.SignedCall`, whose first
        message each way between two ranks carries the call's signature (``buf``'s dtype and count,
        ``op``, ``root``)."""
        if self._failure is not None:
            raise self.unusable()
        if user_tag is not None:
            return Call(self, operation, None, user_tag)
        tag = self._tags.next()
        signer = self.signer
        if signer is not None:   # the shape's key (dtype number: hashed faster than the dtype), looked up here once
            key = (operation, -1, -1, op, root) if buf is None else (operation, buf.dtype.num, buf.size, op, root)
            shape = signer.shapes.get(key)
            if shape is not None and shape.bits:   # signed in full before: plain under its index (Signer.open's path)
                return Call(self, operation, self._tags.count, tag | shape.bits, shape.sig)
            return signer.open(self, operation, self._tags.count, tag, key, buf, op, root)
        return Call(self, operation, self._tags.count, tag)

    def mismatch(self, number: int, peer: int, mine, theirs) -> sg.CollectiveMismatchError:
        """After ``peer``'s signature differed from this rank's: tell every rank, close; return the error to raise."""
        text = sg.message(number, self._rank, mine, peer, theirs)
        found = np.concatenate(([self._rank, peer], mine, theirs)).astype(np.int64)
        self.watch.tell_all(found, min(self._timeout, 5.0))
        self._abandon_all(text, [], found)
        return sg.CollectiveMismatchError(f"[rank {self._rank}] {text}; this communicator is now closed")

    def heard_abort(self) -> None:
        """CollectiveMismatchError (and close) if a peer has told this rank of a mismatch; the abort is passed on
        to every rank, so a rank waiting on this one hears it even if the first copy to it was lost."""
        text = self.watch.heard()
        if text is not None and self._failure is None:
            self.watch.tell_all(self.watch.found, min(self._timeout, 5.0))
            self._abandon_all(text, [], None)
            raise sg.CollectiveMismatchError(f"[rank {self._rank}] {text}; this communicator is now closed")

    def stray_message(self, call) -> None:
        """CollectiveMismatchError (and close) if a peer's message for ``call``, which has waited long, came under
        another signature's index (:meth:`~npddp.comm.engine.signed.Signer.stray`)."""
        signer = self.signer
        if signer is None or not signer.limit or self._failure is not None:
            return
        found = signer.stray(call, self.transport)
        if found is not None:
            peer, theirs = found
            mine = (call.signature[0], call.number, *call.signature[2:])
            raise self.mismatch(call.number, peer, mine, (theirs[0], call.number, *theirs[2:]))

    def _signed_empty(self, call) -> None:
        """A signed collective with nothing to move on this rank still trades signatures with every peer, so a rank
        that passed a non-empty buffer meets a mismatch instead of waiting for messages that never come.

        Every receive is tested in turn: the peers that passed a buffer send only where their schedule
        goes, and the first such message must be checked whichever peer it comes from."""
        if call.signature is None or self._size == 1:
            return
        transport, tag, empty = call.transport, call.tag, self._empty
        peers = [p for p in range(self._size) if p != self._rank]
        recvs, sends = [], []
        try:
            recvs += [(transport.irecv(empty, p, tag), p) for p in peers]
            sends += [(transport.isend(empty, p, tag), p) for p in peers]
            call.wait_all([request for request, _ in recvs + sends])
        except Overdue:
            raise self.give_up(call, recvs, sends) from None
        except ConnectionError as exc:
            raise self.fail(call, exc, recvs, sends) from None
        except Exception:   # a mismatch found while waiting
            self.strand(recvs + sends, None)
            raise

    def _setup_done(self) -> None:
        """Number the user's collectives from 1, whatever the constructor exchanged before them."""
        self._tags.count = 0

    def unusable(self) -> RuntimeError:
        """The error of any call after a failure."""
        return RuntimeError(f"this {self.name} communicator is unusable after an earlier failure: {self._failure}")

    def give_up(self, call: Call, recvs: list, sends: list, keep=None) -> TimeoutError:
        """After ``call`` timed out: abandon every request in flight; return the TimeoutError to raise."""
        recv_from = [peer for request, peer in recvs if not request.test()]
        send_to = [peer for request, peer in sends if not request.test()]
        node = getattr(self, "node", None)  # shared-memory backends: who has not reached the node barrier
        late = node.late(self._active) if node is not None and not recvs and not sends else ()
        error = call.timeout_error(recv_from, send_to, late)
        self._abandon_all(str(error), recvs + sends, keep)
        return error

    def fail(self, call: Call, exc: Exception, recvs=(), sends=(), keep=None) -> ConnectionError:
        """After a peer's connection broke during ``call``: abandon everything; return the error to raise."""
        error = ConnectionError(f"[rank {self._rank}] {call.describe()}: {exc}; this communicator is now unusable")
        self._abandon_all(str(error), [*recvs, *sends], keep)
        return error

    def strand(self, requests: list, keep) -> None:
        """Cancel ``[(request, peer)]`` left behind by an error, and keep them and the buffers ``keep`` alive:
        the transport may still write into a receive's buffer (MPI, when its message had already matched)."""
        self._stranded.append((requests, keep))
        for request, _ in requests:
            try:
                request.cancel()
            except ConnectionError:
                pass

    def _abandon_all(self, why: str, requests: list, keep) -> None:
        """Cancel ``[(request, peer)]`` and every outstanding handle's requests; refuse later calls."""
        self._failure = why
        self._stranded.append(keep)
        for work in tuple(self._active):
            requests += sum(work._requests(), [])
            work._abandoned = True
            self._stranded.append(work)
        self._active.clear()
        for request, _ in requests:
            try:
                request.cancel()
            except ConnectionError:
                pass

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
        if self._size == 1 or buf.size == 0:
            if getattr(self, "node", None) is None:   # the shared-memory path never reads the transport
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
        """Binomial tree from root; a pipelined chain of chunks for buffers of ``chain_bytes`` or more."""
        c.check_buffer(buf)
        root = c.check_rank(root, self._size)
        call = self._begin("broadcast", None, buf, None, root)
        if buf.size == 0 or self._size == 1:
            self._signed_empty(call)
            return buf
        if buf.nbytes >= self.chain_bytes and self._size > 2:
            self._chain_broadcast(call, buf.reshape(-1), root)
        else:
            self._tree_broadcast(call, buf, root)
        return buf

    def _tree_broadcast(self, call, buf, root):
        """Receive from the parent (clear lowest set bit of the relative rank), then send to children."""
        size, vrank = self._size, (self._rank - root) % self._size
        mask = 1
        while mask < size:
            if vrank & mask:
                call.transfer(recvs=[(buf, (vrank - mask + root) % size)])
                break
            mask <<= 1
        children = []
        mask >>= 1
        while mask:
            if vrank + mask < size:
                children.append((buf, (vrank + mask + root) % size))
            mask >>= 1
        if children:
            call.transfer(sends=children)

    def _chain_broadcast(self, call, flat, root):
        """Root -> root+1 -> ...: each rank forwards a chunk as soon as it has arrived."""
        size, vrank, tag = self._size, (self._rank - root) % self._size, call.tag
        seg = max(1, self.chunk_bytes // flat.itemsize)
        parts = [flat[i:i + seg] for i in range(0, flat.size, seg)]
        left, right = (self._rank - 1) % size, (self._rank + 1) % size
        if vrank == 0:
            call.transfer(sends=[(p, right) for p in parts])
            return
        transport, recvs, sends = call.transport, [], []
        try:
            recvs += [(transport.irecv(p, left, tag), left) for p in parts]
            for p, (req, _) in zip(parts, recvs):
                call.wait(req)
                if vrank < size - 1:
                    sends.append((transport.isend(p, right, tag), right))
            for req, _ in sends:
                call.wait(req)
        except Overdue:
            raise self.give_up(call, recvs, sends, parts) from None
        except ConnectionError as exc:
            raise self.fail(call, exc, recvs, sends, parts) from None
        except Exception:   # a mismatch found while waiting
            self.strand(recvs + sends, parts)
            raise

    def reduce_scatter(self, buf, op="sum"):
        """The ring schedule's first half: rank r ends with block r of the reduction."""
        opened = self._open_reduce_scatter(buf, op, None, "reduce_scatter")
        if isinstance(opened, DoneWork):
            return opened.wait()
        call, flat, ufunc, scale, out = opened
        bounds = c.block_bounds(flat.size, self._size)
        raw = self.scratch.acquire(flat.nbytes)
        partials = np.frombuffer(raw, dtype=buf.dtype, count=flat.size)  # (n,) partial sums land here
        try:
            self._ring.start(call, flat, partials, ufunc, out, phase="reduce_scatter").wait()
            np.copyto(out, partials[bounds[self._rank]:bounds[self._rank + 1]])
            if scale:
                np.multiply(out, scale, out=out)
        finally:
            del partials
            self.scratch.release(raw)
        return out

    def allgather(self, buf):
        """The ring schedule's second half: each rank's ``buf`` is its block of the stacked result."""
        c.check_buffer(buf, writable=False)
        call = self._begin("allgather", None, buf)
        size, rank = self._size, self._rank
        out = np.empty((size, *buf.shape), dtype=buf.dtype)
        rows = out.reshape(size, -1)  # (size, buf.size)
        rows[rank] = buf.reshape(-1)
        if buf.size and size > 1:
            flat = out.reshape(-1)
            self._ring.start(call, flat, flat, None, out, phase="allgather").wait()
        else:
            self._signed_empty(call)
        return out

    def gather(self, buf, root=0):
        """Every rank sends ``buf`` to root, which receives them all at once."""
        c.check_buffer(buf, writable=False)
        root = c.check_rank(root, self._size)
        call = self._begin("gather", None, buf, None, root)
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

    def recv(self, buf, source, tag=0):
        """Blocking receive into ``buf`` with a user tag (times out like a collective)."""
        c.check_buffer(buf)
        source, tag = c.check_rank(source, self._size, "source"), c.check_tag(tag)
        self._begin("recv", tag).transfer(recvs=[(buf, source)])
        return buf

    def isend(self, buf, dest, tag=0):
        """Start a send of ``buf`` to ``dest`` with a user tag; its Work's ``wait`` returns ``buf``."""
        c.check_buffer(buf, writable=False)
        dest, tag = c.check_rank(dest, self._size, "dest"), c.check_tag(tag)
        return PointWork(self._begin("isend", tag), buf, dest, is_recv=False)

    def irecv(self, buf, source, tag=0):
        """Start a receive into ``buf`` from ``source`` with a user tag; its Work's ``wait`` returns ``buf``."""
        c.check_buffer(buf)
        source, tag = c.check_rank(source, self._size, "source"), c.check_tag(tag)
        return PointWork(self._begin("irecv", tag), buf, source, is_recv=True)

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
        child.check_args = self.check_args
        return child

    def _child(self, transport):
        """The same backend over ``transport`` (a split's group), with this one's timeout."""
        return type(self)(transport, self._algorithm, self.name, self._timeout)

    # --- non-blocking reduce-scatter and all-gather ----------------------------------
    def ireduce_scatter(self, buf, op="sum", out=None):
        """Start :meth:`reduce_scatter` (the same ring half, the same bits) into ``out`` (this rank's block)."""
        opened = self._open_reduce_scatter(buf, op, out, "ireduce_scatter")
        if isinstance(opened, DoneWork):
            return opened
        call, flat, ufunc, scale, out = opened
        return ReduceScatterWork(call, self._ring, flat, ufunc, out, scale)

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

    def iallgather(self, buf, out=None):
        """Start :meth:`allgather` into ``out`` of shape ``(size, *buf.shape)``; ``buf`` may be ``out[rank]``."""
        c.check_buffer(buf, writable=False)
        out = c.check_stacked_out(buf, out, self._size, self._rank)
        call = self._begin("iallgather", None, buf)
        if not c.is_row(buf, out, self._rank):
            out.reshape(self._size, -1)[self._rank] = buf.reshape(-1)
        if buf.size == 0 or self._size == 1:
            self._signed_empty(call)
            return DoneWork(out)
        flat = out.reshape(-1)
        return self._ring.start(call, flat, flat, None, out, phase="allgather")
