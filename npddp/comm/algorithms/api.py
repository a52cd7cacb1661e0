"""The public interface for writing an algorithm in your own file (an all-reduce: a generator of message rounds).

An algorithm is a generator function ``fn(peers, buf)``. ``buf`` is the flat vector to reduce
in place (every rank's ``buf`` has the same size and dtype); ``peers`` is an :class:`Peers`:
this rank and the world size, non-blocking ``isend``/``irecv`` to other ranks, ``reduce``
(the call's op, elementwise) and ``scratch`` buffers. Post messages, then ``yield`` the
requests to wait for (or a bare ``yield`` for every request posted so far); the engine resumes
the generator once they have completed. So one schedule serves the blocking ``allreduce`` and
the non-blocking ``iallreduce`` (whose ``Work.test()`` runs the generator as far as messages
have arrived), over MPI and TCP alike, with no state machine written by hand::

    from npddp.comm import register_algorithm

    def swap(peers, buf):                  # two ranks: exchange, then reduce
        got = peers.scratch(buf.size, buf.dtype)
        yield peers.irecv(got, 1 - peers.rank), peers.isend(buf, 1 - peers.rank)
        peers.reduce(buf, got, out=buf)

    register_algorithm("swap", swap)       # now create("swap"), --backend swap, benchmarks ...

Every rank must end with the same bits: reduce each element in one place (or in the same order
everywhere) and copy the result to the others. ``cost=`` (``fn(nbytes, size, chunk_bytes) ->
Cost``) describes the algorithm's alpha-beta-gamma terms; with it ``auto``, the tuner and the
report's projection consider the algorithm too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from npddp.comm import checks
from npddp.comm.algorithms import registry
from npddp.comm.engine.cost import Cost
from npddp.comm.engine.work import P2PWork

__all__ = ["Cost", "Peers", "Request", "block_bounds", "register_algorithm"]


def block_bounds(n: int, size: int) -> list[int]:
    """``size + 1`` offsets cutting ``n`` elements into ``size`` blocks as ``np.array_split`` does."""
    return checks.block_bounds(n, size).tolist()


class Request:
    """One posted send or receive: ``peer``, ``is_recv``, and ``test()`` (True once complete)."""

    __slots__ = ("request", "peer", "is_recv")

    def __init__(self, request, peer: int, is_recv: bool):
        self.request, self.peer, self.is_recv = request, peer, is_recv

    def test(self) -> bool:
        """Progress the transport; True once this message has completed."""
        return self.request.test()


class Peers:
    """What an algorithm sees during one all-reduce: ranks, messages, the reduction, scratch buffers."""

    __slots__ = ("rank", "size", "chunk_bytes", "_transport", "_tag", "_ufunc", "_pool", "_lent", "posted")

    def __init__(self, ctx, call, ufunc):
        self.rank, self.size, self.chunk_bytes = ctx.rank, ctx.size, ctx.chunk_bytes
        self._transport, self._tag, self._ufunc, self._pool = call.transport, call.tag, ufunc, ctx.scratch
        self._lent: list = []
        self.posted: list[Request] = []  # requests not yet waited for

    def isend(self, buf: np.ndarray, dest: int) -> Request:
        """Start sending contiguous ``buf`` to rank ``dest``; ``buf`` must not change until it completes."""
        request = Request(self._transport.isend(buf, self._peer(dest, "dest"), self._tag), dest, False)
        self.posted.append(request)
        return request

    def irecv(self, buf: np.ndarray, source: int) -> Request:
        """Start receiving the next message from rank ``source`` into contiguous ``buf``."""
        request = Request(self._transport.irecv(buf, self._peer(source, "source"), self._tag), source, True)
        self.posted.append(request)
        return request

    def reduce(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> np.ndarray:
        """``out = a (op) b`` elementwise with this call's op (sum, prod, max or min)."""
        return self._ufunc(a, b, out=out)

    def scratch(self, n: int, dtype) -> np.ndarray:
        """A 1-D array of ``n`` elements (contents undefined), lent for this call, reused by later calls."""
        dtype = np.dtype(dtype)
        raw = self._pool.acquire(int(n) * dtype.itemsize)
        self._lent.append(raw)
        return np.frombuffer(raw, dtype=dtype, count=int(n))

    def _peer(self, rank, what: str) -> int:
        if not (isinstance(rank, (int, np.integer)) and 0 <= rank < self.size and rank != self.rank):
            raise ValueError(f"{what}={rank!r} is out of range; valid: another rank in 0..{self.size - 1}")
        return int(rank)

    def _release(self) -> None:
        for raw in self._lent:
            self._pool.release(raw)
        self._lent.clear()


class GeneratorWork(P2PWork):
    """Work handle running an algorithm's generator: resume it each time the requests it yielded complete."""

    __slots__ = ("_peers", "_gen", "_waiting")

    def __init__(self, call, ctx, fn, src, dst, ufunc, result):
        super().__init__(call, result)
        if dst is not src:
            np.copyto(dst, src)
        self._peers = Peers(ctx, call, ufunc)
        self._gen = fn(self._peers, dst)
        self._waiting: list[Request] = []
        self._start()

    def _advance(self, block):
        peers, call = self._peers, self._call
        while True:
            while self._waiting:
                request = self._waiting[-1]
                if block:
                    call.wait(request.request)
                elif not request.test():
                    return False
                self._waiting.pop()
            try:
                got = next(self._gen)
            except StopIteration:
                if peers.posted:  # messages posted after the last yield: complete them too
                    self._waiting, peers.posted = peers.posted[::-1], []
                    continue
                return True
            self._waiting = self._to_wait(got)[::-1]

    def _to_wait(self, got) -> list[Request]:
        """The requests a ``yield`` names (all posted ones for a bare yield); drop them from ``posted``."""
        peers = self._peers
        if got is None:
            waiting, peers.posted = peers.posted, []
            return waiting
        waiting = [got] if isinstance(got, Request) else list(got)
        if not all(isinstance(r, Request) for r in waiting):
            raise TypeError("an algorithm must yield None, a Request or an iterable of Requests, got "
                            f"{type(got).__name__}")
        named = {id(r) for r in waiting}
        peers.posted = [r for r in peers.posted if id(r) not in named]
        return waiting

    def _requests(self):
        pending = self._waiting + self._peers.posted
        return ([(r.request, r.peer) for r in pending if r.is_recv],
                [(r.request, r.peer) for r in pending if not r.is_recv])

    def _release(self):
        self._gen.close()
        self._peers._release()


def from_generator(name: str, fn: Callable, cost: Callable | None = None) -> type:
    """An algorithm class (``__init__(ctx)``, ``start(...)``, static ``cost``) running generator ``fn``."""

    def start(self, call, src, dst, ufunc, result):
        return GeneratorWork(call, self.ctx, fn, src, dst, ufunc, result)

    def init(self, ctx):
        self.ctx = ctx

    namespace = {"__init__": init, "start": start, "__doc__": fn.__doc__, "__module__": fn.__module__}
    if cost is not None:
        namespace["cost"] = staticmethod(cost)
    return type(name, (), namespace)


def register_algorithm(name: str, fn_or_class, cost: Callable | None = None, *, collective: str = "allreduce",
                       auto: bool | None = None, help: str = "") -> None:
    """Make algorithm ``name`` of ``collective`` available wherever such a name is accepted (see the module docstring).

    ``fn_or_class``: a generator function ``fn(peers, buf)``, or a class with the engine's
    algorithm contract (``__init__(ctx)``, ``start(call, src, dst, ufunc, result) -> Work``).
    ``cost``: ``fn(nbytes, size, chunk_bytes) -> Cost`` (default: the class's ``cost``, if any).
    ``auto``: whether ``auto`` may pick it (default: when it has a cost, which ``auto`` then needs).
    ``help``: one line for ``--backend``'s help and the docs' tables. The built-in algorithms register so too.
    """
    if cost is not None and not callable(cost):
        raise TypeError(f"cost must be a function (nbytes, size, chunk_bytes) -> Cost, got {type(cost).__name__}")
    if isinstance(fn_or_class, type):
        if not callable(getattr(fn_or_class, "start", None)):
            raise TypeError(f"algorithm class {fn_or_class.__name__} has no start(call, src, dst, ufunc, result)")
        cls = fn_or_class if cost is None else type(str(name), (fn_or_class,), {"cost": staticmethod(cost)})
    elif callable(fn_or_class):
        if collective != "allreduce":
            raise TypeError(f"algorithm {name!r}: a generator function fn(peers, buf) is an all-reduce's; for "
                            f"collective {collective!r} register a class with start(call, src, dst, ufunc, result)")
        cls = from_generator(str(name), fn_or_class, cost)
    else:
        raise TypeError(f"algorithm {name!r} must be a generator function or a class, got {type(fn_or_class).__name__}")
    cost = cost if cost is not None else getattr(cls, "cost", None)
    auto = cost is not None if auto is None else auto
    if auto and not callable(cost):
        raise ValueError(f"algorithm {name!r}: auto=True needs a cost (nbytes, size, chunk_bytes) -> Cost to rank it")
    entry = registry.Algorithm(name, collective, cls, cost, bool(auto), registry.importing_builtins(), str(help))
    registry.register(entry)
