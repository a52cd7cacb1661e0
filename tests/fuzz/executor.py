"""One rank of a fuzzing job: ``python -m tests.fuzz.executor DIR`` runs the programs DIR/plan.json lists.

For each program the rank builds a fresh communicator, runs its ops, checks every result against
NumPy (:mod:`tests.fuzz.oracle`) and writes what happened to ``DIR/<program>.<rank>.json``: per op
a digest of the result's bytes and any difference from NumPy, and the exception that ended the
program, if one did. Then it waits until every rank's file of that program exists: the ranks step
from program to program through the file system, never through the backend under test, so one
program's failure cannot leak into the next one's verdict and the driver compares the ranks' files.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

from npddp.comm import CollectiveMismatchError, create
from npddp.util import env

from tests.fuzz import oracle
from tests.fuzz.program import NONBLOCKING, Op, Program, generate


def digest(a) -> str | None:
    """A short hash of an array's dtype, shape and bytes (None for None)."""
    if a is None:
        return None
    a = np.ascontiguousarray(a)
    return hashlib.blake2b(f"{a.dtype.str}{a.shape}".encode() + a.tobytes(), digest_size=8).hexdigest()


class PollHang(Exception):
    """A loop of ``Work.test()`` that neither completed nor raised within the timeout and a margin."""


class Rank:
    """The state of one program on one rank: its communicators, open handles, and what it recorded."""

    def __init__(self, program: Program, rank: int, timeout: float):
        self.program, self.rank, self.timeout = program, rank, timeout
        self.comms: dict = {}
        self.pending: dict = {}       # start index -> (work, check(got) -> [problems], result holder)
        self.records: list = []       # [index, digest, problem or None, group]
        p = program.perturbation
        self.unchecked = set() if p is None else {p.index, p.index + 1} if p.field == "order" else {p.index}

    # --- helpers -------------------------------------------------------------------------------
    def where(self, op: Op) -> tuple:
        """(communicator, members, rank in it) of ``op`` for this rank."""
        members = self.program.members(op.comm, self.rank)
        return self.comms[op.comm], members, members.index(self.rank)

    def mine(self, index: int, op: Op, size: int) -> np.ndarray:
        """This rank's input to op ``index``."""
        return oracle.values(self.program.seed, index, self.rank, op, oracle.buffer_shape(op, size))

    def record(self, index: int, op: Op, result, problems: list, members: tuple) -> None:
        """Note op ``index``'s result digest and problems (an op whose arguments differ on purpose is not compared)."""
        text = "; ".join(p for p in problems if p) or None
        if index in self.unchecked:
            text = None
        self.records.append([index, digest(result), text, ",".join(map(str, members))])

    def expect(self, index: int, fn) -> str | None:
        """``fn()``'s verdict, or None where the op's arguments were changed on purpose (no oracle exists)."""
        return None if index in self.unchecked else fn()

    # --- ops -----------------------------------------------------------------------------------
    def allreduce(self, index, op):
        comm, members, me = self.where(op)
        x = self.mine(index, op, len(members))
        keep = x.copy()
        out = {"in": None, "alias": x, "out": np.full(x.shape, oracle.SENTINEL, dtype=x.dtype)}[op.place]
        got = comm.allreduce(x, op.op) if out is None else comm.allreduce(x, op.op, out=out)
        result = x if out is None else out
        problems = [None if got is result else "did not return its output buffer",
                    None if op.place != "out" or np.array_equal(x, keep) else "changed its input out of place"]
        problems.append(self.expect(index, lambda: self._reduced(index, op, members, result)))
        self.record(index, op, result, problems, members)

    def _reduced(self, index, op, members, got, block: int | None = None):
        want, stacked = oracle.reduced(self.program, index, members)
        if block is not None:
            want = np.array_split(want.ravel(), len(members))[block]
            stacked = np.stack([np.array_split(s.ravel(), len(members))[block] for s in stacked])
        return oracle.compare(got, want, op.dtype, op.values == "exact", stacked, op.op)

    def iallreduce(self, index, op):
        comm, members, me = self.where(op)
        x = self.mine(index, op, len(members))
        work = comm.iallreduce(x, op.op)
        self.pending[index] = (work, lambda got: (got if got is x else None, [
            None if got is x else "wait() did not return the buffer",
            self.expect(index, lambda: self._reduced(index, op, members, x))]), members)

    def reduce_scatter(self, index, op):
        comm, members, me = self.where(op)
        x = self.mine(index, op, len(members))
        keep = x.copy()
        got = comm.reduce_scatter(x, op.op)
        problems = [None if np.array_equal(x, keep) else "changed its input",
                    self.expect(index, lambda: self._reduced(index, op, members, got, me))]
        self.record(index, op, got, problems, ())

    def ireduce_scatter(self, index, op):
        comm, members, me = self.where(op)
        x = self.mine(index, op, len(members))
        keep = x.copy()
        n = len(np.array_split(np.empty(op.count), len(members))[me])
        out = None if op.place == "in" else np.full(n, oracle.SENTINEL, dtype=x.dtype)
        work = comm.ireduce_scatter(x, op.op, out)
        self.pending[index] = (work, lambda got: (got, [
            None if out is None or got is out else "wait() did not return out",
            None if np.array_equal(x, keep) else "changed its input",
            self.expect(index, lambda: self._reduced(index, op, members, got, me))]), ())

    def _gathered(self, index, members):
        return np.stack([oracle.input_of(self.program, index, r, len(members)) for r in members])

    def allgather(self, index, op):
        comm, members, me = self.where(op)
        x = self.mine(index, op, len(members))
        keep = x.copy()
        got = comm.allgather(x)
        problems = [None if np.array_equal(x, keep) else "changed its input",
                    self.expect(index, lambda: oracle.compare(got, self._gathered(index, members), op.dtype, True))]
        self.record(index, op, got, problems, members)

    def iallgather(self, index, op):
        comm, members, me = self.where(op)
        x = self.mine(index, op, len(members))
        out = None if op.place == "in" else np.full((len(members), *x.shape), oracle.SENTINEL, dtype=x.dtype)
        buf = x
        if op.place == "alias":
            out[me] = x
            buf = out[me, ...]              # a view, 0-d included
        work = comm.iallgather(buf, out)
        self.pending[index] = (work, lambda got: (got, [
            None if out is None or got is out else "wait() did not return out",
            self.expect(index, lambda: oracle.compare(got, self._gathered(index, members), op.dtype, True))]), members)

    def alltoall(self, index, op):
        comm, members, me = self.where(op)
        x = self.mine(index, op, len(members))   # (size, *block)
        keep = x.copy()
        got = comm.alltoall(x)
        problems = [None if np.array_equal(x, keep) else "changed its input",
                    self.expect(index, lambda: oracle.compare(got, self._alltoall_result(index, members, me),
                                                              op.dtype, True))]
        self.record(index, op, got, problems, ())

    def _alltoall_result(self, index, members, me):
        return np.stack([oracle.input_of(self.program, index, r, len(members))[me] for r in members])

    def ialltoall(self, index, op):
        comm, members, me = self.where(op)
        x = self.mine(index, op, len(members))
        out = None if op.place == "in" else np.full(x.shape, oracle.SENTINEL, dtype=x.dtype)
        work = comm.ialltoall(x, out)
        self.pending[index] = (work, lambda got: (got, [
            None if out is None or got is out else "wait() did not return out",
            self.expect(index, lambda: oracle.compare(got, self._alltoall_result(index, members, me), op.dtype,
                                                      True))]), ())

    def alltoallv(self, index, op):
        comm, members, me = self.where(op)
        x, send, recv = oracle.alltoallv_input(self.program, index, self.rank, me, len(members))
        keep = x.copy()
        got = comm.alltoallv(x, send, recv)
        problems = [None if np.array_equal(x, keep) else "changed its input",
                    self.expect(index, lambda: oracle.compare(
                        got, oracle.alltoallv_result(self.program, index, members, me), op.dtype, True))]
        self.record(index, op, got, problems, ())

    def ialltoallv(self, index, op):
        comm, members, me = self.where(op)
        x, send, recv = oracle.alltoallv_input(self.program, index, self.rank, me, len(members))
        out = None if op.place == "in" else np.full(int(recv.sum()), oracle.SENTINEL, dtype=x.dtype)
        work = comm.ialltoallv(x, send.tolist(), recv, out)
        self.pending[index] = (work, lambda got: (got, [
            None if out is None or got is out else "wait() did not return out",
            self.expect(index, lambda: oracle.compare(
                got, oracle.alltoallv_result(self.program, index, members, me), op.dtype, True))]), ())

    def broadcast(self, index, op):
        comm, members, me = self.where(op)
        root = op.root % len(members)
        buf = self.mine(index, op, len(members))
        got = comm.broadcast(buf, root)
        problems = [None if got is buf else "did not return its buffer", self.expect(index, lambda: oracle.compare(
            buf, oracle.input_of(self.program, index, members[root], len(members)), op.dtype, True))]
        self.record(index, op, buf, problems, members)

    def gather(self, index, op):
        comm, members, me = self.where(op)
        root = op.root % len(members)
        x = self.mine(index, op, len(members))
        keep = x.copy()
        got = comm.gather(x, root)
        problems = [None if np.array_equal(x, keep) else "changed its input"]
        if me == root:
            problems.append(self.expect(index, lambda: oracle.compare(got, self._gathered(index, members),
                                                                       op.dtype, True)))
        elif got is not None:
            problems.append(f"a non-root got {type(got).__name__}, expected None")
        self.record(index, op, got, problems, ())

    def scatter(self, index, op):
        comm, members, me = self.where(op)
        root = op.root % len(members)
        buf = self.mine(index, op, len(members))
        keep = buf.copy()
        got = comm.scatter(buf, root)
        problems = [None if me != root or np.array_equal(buf, keep) else "changed root's buffer",
                    self.expect(index, lambda: oracle.compare(
                        got, oracle.input_of(self.program, index, members[root], len(members))[me], op.dtype, True))]
        self.record(index, op, got, problems, ())

    def barrier(self, index, op):
        comm, members, me = self.where(op)
        comm.barrier()
        self.record(index, op, None, [], members)

    def wait(self, index, op):
        work, check, members = self.pending.pop(op.handle)
        if op.place == "poll":              # the loop of the docs' example: test() until done, then wait()
            limit = time.monotonic() + 1.5 * self.timeout + 5
            while not work.test():
                if time.monotonic() > limit:
                    raise PollHang(f"test() still False {1.5 * self.timeout + 5:g} s after it began (neither "
                                   "done nor an error, past the timeout)")
        result, problems = check(work.wait())
        self.record(op.handle, self.program.ops[op.handle], result, problems, members)

    def test(self, index, op):
        work = self.pending[op.handle][0]
        work.test()

    def split(self, index, op):
        comm, members, me = self.where(op)
        color = op.colors[self.rank]
        child = comm.split(None if color < 0 else color, op.keys[self.rank])
        want = self.program.members(index + 1, self.rank)
        if child is None:
            problem = None if not want else f"split gave None, expected a group of {len(want)}"
        else:
            self.comms[index + 1] = child
            problem = None if (child.size, child.rank) == (len(want), want.index(self.rank) if want else -1) else (
                f"split gave rank {child.rank} of {child.size}, expected {want.index(self.rank) if want else None} "
                f"of {len(want)}")
        self.record(index, op, None, [problem], ())

    def p2p(self, index, op):
        comm = self.comms[0]
        theirs = {j: self.program.op_of(m[0], index).messages[j]     # what each message's sender passes
                  for j, m in enumerate(op.messages) if m[1] == self.rank}
        work, received = [], []
        for j, (src, dst, tag, dtype, n) in enumerate(op.messages):   # op: this rank's own arguments
            if src == self.rank:
                data = oracle.values(self.program.seed, index, src, Op("p2p", dtype=dtype, values=op.values), (n,), j)
                work.append(("send", comm.send(data, dst, tag) if op.blocking else comm.isend(data, dst, tag), None))
            if dst == self.rank:
                buf = np.full(n, oracle.SENTINEL, dtype=dtype)
                received.append((j, buf))
                work.append(("recv", comm.recv(buf, src, tag) if op.blocking else comm.irecv(buf, src, tag), buf))
        if not op.blocking:
            order = np.random.default_rng([self.program.seed & (2**63 - 1), index, self.rank]).permutation(len(work))
            for k in order:
                what, w, buf = work[k]
                got = w.wait()
                if what == "recv" and got is not buf:
                    self.records.append([index, None, "irecv's wait() did not return the buffer", ""])
        elif work and work[0][0] == "recv" and work[0][1] is not work[0][2]:
            self.records.append([index, None, "recv did not return the buffer", ""])
        for j, buf in received:
            self.records.append([index, digest(buf), self._message_problem(index, j, buf, theirs[j], op), ""])

    def _message_problem(self, index, j, buf, sent, op):
        """None when ``buf`` holds what the sender sent (a shorter message: its elements, then the sentinel)."""
        src, _, _, dtype, n = sent
        if dtype != buf.dtype.name or n > buf.size:
            return (f"received without error a message of {n} {dtype} from rank {src} into {buf.size} "
                    f"{buf.dtype.name}")
        want = np.full(buf.size, oracle.SENTINEL, dtype=buf.dtype)
        want[:n] = oracle.values(self.program.seed, index, src, Op("p2p", dtype=dtype, values=op.values), (n,), j)
        return oracle.compare(buf, want, buf.dtype, True)


def _where(e: BaseException) -> str:
    """The innermost frame of ``e``'s traceback inside npddp, as ``path:line``."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "/npddp/" in f.filename]
    return f"{frames[-1].filename.rsplit('/npddp/', 1)[-1]}:{frames[-1].lineno}" if frames else ""


def run(program: Program, rank: int, timeout: float, keep: list | None = None) -> dict:
    """Run ``program`` as ``rank``; what happened, as the driver reads it. ``keep``: a list that gets the program's
    communicators, so the caller drops them only once every rank has ended the program (a peer's late message
    then has arrived, and the MPI transport keeps a context that holds one instead of giving it to the next)."""
    state = Rank(program, rank, timeout)
    if keep is not None:
        keep.append(state.comms)
    error, started = None, time.monotonic()
    index = -1
    try:
        state.comms[0] = create(program.backend, timeout=timeout, debug=program.mode == "debug",
                                progress="thread" if program.mode == "thread" else "caller")
        for index, op in program.ops_for(rank):
            if op.kind != "p2p" and not program.members(op.comm, rank):
                continue
            began = time.monotonic()
            try:
                getattr(state, op.kind)(index, op)
            except Exception as e:  # noqa: BLE001 - every failure is what the driver judges
                error = {"index": index, "type": type(e).__name__, "module": type(e).__module__, "where": _where(e),
                         "mismatch": isinstance(e, CollectiveMismatchError), "timeout": isinstance(e, TimeoutError),
                         "value": isinstance(e, (ValueError, TypeError)), "message": str(e)[:400], "elapsed": round(time.monotonic() - began, 3)}
                break
    except Exception as e:  # noqa: BLE001 - create failed
        error = {"index": index, "type": type(e).__name__, "module": type(e).__module__, "mismatch": False,
                 "timeout": isinstance(e, TimeoutError), "value": False, "message": str(e)[:400], "elapsed": 0.0}
    return {"rank": rank, "records": state.records, "error": error,
            "seconds": round(time.monotonic() - started, 3)}


def _write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _wait_for_driver(directory: Path, number: int, limit: float) -> bool:
    """Wait until the driver, having read every rank's file of program ``number``, says go on (True) or stop
    (False); exit 3 after ``limit`` seconds."""
    deadline, nap = time.monotonic() + limit, 0.001
    go, stop = directory / f"go.{number}", directory / "stop"
    while not go.exists():
        if stop.exists():
            return False
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(nap)
        nap = min(nap * 2, 0.02)
    return True


def main(argv=None) -> int:
    directory = Path((argv or sys.argv[1:])[0])
    plan = json.loads((directory / "plan.json").read_text())
    rank, size = env.world_rank(), env.world_size()
    for number, (seed, backend, perturbed) in enumerate(plan["programs"]):
        if number < plan.get("start", 0):
            continue
        program = generate(seed, size, backend, perturbed)
        kept: list = []
        _write(directory / f"{number}.{rank}.json", run(program, rank, plan["timeout"], kept))
        going = _wait_for_driver(directory, number, 4 * plan["wall"])
        del kept
        gc.collect()
        if not going:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
