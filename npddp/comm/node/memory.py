"""Shared memory among the ranks of one node: which ranks share a node, shared segments, and node barriers.

Nodes. Ranks share a node when they report the same host name and boot id. The test-only
variable ``NPDDP_RANKS_PER_NODE=K`` pretends instead that ranks ``0..K-1`` are one node, ``K..2K-1``
the next, and so on, so one machine can exercise the paths meant for several.

Segments. A segment is a file in ``/dev/shm`` named after the job (:mod:`npddp.comm.node.names`).
The node's first rank creates it, sends its name to the others over the transport, and unlinks
it as soon as every one of them has mapped it: from then on the memory has no name, so nothing
is left in ``/dev/shm`` when the job ends, whether it finishes or is killed.

Node barriers. Each rank owns one 128-byte line of a control segment: a sequence number, a few
words describing where its data lies this call, the CPU it last waited on, and its process id.
A rank writes its words, then its sequence number; a peer reads the sequence number, then the words. On x86-64 (total store order) plain aligned
8-byte stores and loads give exactly that order; on other architectures a lock round trip (a
full barrier) is placed between them. Waiting polls the peers' sequence numbers, yielding the
CPU between polls, and every so often checks the deadline and that every peer process is alive,
so a killed peer ends the wait at once.

Two ranks on one CPU. Ranks that wait by yielding never sleep, so the kernel, which spreads tasks
over idle CPUs mostly when they wake, can leave two of them taking turns on one CPU for tens of
milliseconds while another idles (at N = 2, 1 MiB: 175-185 us a call against 75-79 on two CPUs;
a short sleep did not help, the sleeper woke on the same CPU). So when the node's ranks fit the
CPUs they may use, a wait that does not end at once notes the CPU it runs on, and when a rank it
waits for last noted the same one, it moves itself to a CPU no rank of the node noted: its
affinity narrowed to that CPU (the kernel migrates it at once), then restored.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import secrets
import socket
import threading
import time
from functools import partial

import numpy as np

from npddp.comm.engine.deadline import CLOCK_EVERY, SPIN_ROUNDS, wait_until
from npddp.comm.node.names import SHM_DIR, job_id, segment_name
from npddp.util import variables

#: Words (int64) in each rank's control line: sequence number, then what the algorithm publishes.
LINE = 16
SEQ, CPU, PID = 0, LINE - 2, LINE - 1
SIZE_WORDS = (5, 6)  # words of a rank's line: the byte count of its all-reduce (alternating calls)
_NAME_BYTES = 128
_TSO = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
_FENCE = threading.Lock()
_LIVENESS_EVERY = 16  # clock reads between two checks that the peers are alive
#: The most shared waits let pass between two moves off a CPU while moves do not last (see NodeSync.leave_shared_cpu).
_MOST_SKIPPED = 1024


def _bind_getcpu():
    """The C library's ``sched_getcpu`` (the CPU this thread runs on), or None where there is none."""
    try:
        getcpu = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    getcpu.argtypes, getcpu.restype = [], ctypes.c_int
    return getcpu


_GETCPU = _bind_getcpu()


def usable_cpus() -> int:
    """How many CPUs this thread may run on (0 where the platform cannot say or set it)."""
    if not hasattr(os, "sched_setaffinity"):
        return 0
    return len(os.sched_getaffinity(0))


def fence() -> None:
    """Order this process's earlier memory accesses before its later ones (a no-op on x86-64)."""
    if not _TSO:
        _FENCE.acquire()
        _FENCE.release()


def host_id() -> str:
    """This machine's identity: host name and boot id."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def node_ids(comm, environ=None) -> list[int]:
    """The node of every rank of ``comm`` (0, 1, ... in order of first rank); an all-gather over its transport."""
    per_node = variables.integer(variables.RANKS_PER_NODE, environ, minimum=1)
    if per_node is not None:
        return [r // per_node for r in range(comm.size)]
    name = host_id().encode()[:_NAME_BYTES].ljust(_NAME_BYTES, b"\0")
    table = comm.allgather(np.frombuffer(name, dtype=np.int64))  # (size, _NAME_BYTES / 8)
    first: dict[bytes, int] = {}
    return [first.setdefault(table[r].tobytes(), len(first)) for r in range(comm.size)]


class Segment:
    """A mapped shared segment; ``array`` is all of it as bytes."""

    def __init__(self, fd: int, nbytes: int):
        self.map = mmap.mmap(fd, nbytes)
        self.array = np.frombuffer(self.map, dtype=np.uint8)  # (nbytes,)
        self.address = self.array.ctypes.data
        self.nbytes = nbytes


def create_segment(comm, local: list[int], nbytes: int, call) -> Segment:
    """Make a segment of ``nbytes`` mapped by every rank of ``local`` (ranks of ``comm`` on this node).

    Collective over ``local``, messages under ``call``'s tag: the first rank creates and sizes the
    file and sends its name, the others map it and answer, then the first rank unlinks it.
    """
    me, leader = comm.rank, local[0]
    name = np.zeros(_NAME_BYTES // 8, dtype=np.int64)  # the file name's bytes
    status = np.zeros(1, dtype=np.int64)
    if me == leader:
        file = segment_name(job_id(), secrets.token_hex(6))
        path = os.path.join(SHM_DIR, file)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, nbytes)
            segment = Segment(fd, nbytes)
        except BaseException:  # whatever stopped the mapping, the file must not outlive it
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        name.view(np.uint8)[:len(file)] = np.frombuffer(file.encode(), dtype=np.uint8)
        try:
            call.transfer(sends=[(name, r) for r in local[1:]])
            answers = np.zeros((len(local), 1), dtype=np.int64)  # (local, 1) 0: mapped, else errno
            call.transfer(recvs=[(answers[i], r) for i, r in enumerate(local) if i])
        finally:
            os.unlink(path)
        failed = [local[i] for i in range(1, len(local)) if answers[i, 0]]
        if failed:
            raise OSError(f"ranks {failed} could not map shared segment {file}: ranks that look like one node "
                          f"do not share /dev/shm (set {variables.RANKS_PER_NODE.name}=1 to use no shared memory)")
        return segment
    call.transfer(recvs=[(name, leader)])
    file = bytes(name).rstrip(b"\0").decode()
    segment, fd = None, -1
    try:
        fd = os.open(os.path.join(SHM_DIR, file), os.O_RDWR)
        segment = Segment(fd, nbytes)
    except OSError as exc:
        status[0] = exc.errno or 1
    finally:
        if fd >= 0:
            os.close(fd)
    call.transfer(sends=[(status, leader)])
    if segment is None:
        _abort_first(comm)
        raise OSError(f"rank {me} could not map shared segment {file} made by rank {leader}")
    return segment


#: Seconds a rank that could not map a segment waits for a peer's abort (the leader removes the file when it hears one).
ABORT_GRACE_S = 2.0


def _abort_first(comm) -> None:
    """Raise a peer's abort (CollectiveMismatchError) if one arrives within ``ABORT_GRACE_S``: a leader that heard one
    while this rank mapped removed the file, and the mismatch, not the missing file, is the error to report."""
    if comm.watch is None:
        return
    expires = time.monotonic() + ABORT_GRACE_S
    while time.monotonic() < expires:
        comm.heard_abort()
        time.sleep(0.001)


class NodeSync:
    """The control lines of the node's ranks: publish words, arrive at a barrier, wait for the others."""

    def __init__(self, ctrl: np.ndarray, me: int, peers_rank: list[int]):
        self.lines = ctrl.reshape(-1, LINE)                      # (local ranks, LINE) int64
        self.words = memoryview(ctrl).cast("B").cast("q")        # the same, as fast scalar slots
        self.me, self.n, self.ranks = me, len(peers_rank), peers_rank
        self.words[me * LINE + PID] = os.getpid()
        self.words[me * LINE + CPU] = -1
        self.others = [i for i in range(self.n) if i != me]
        self._polls = 0
        #: Whether a wait moves off a CPU shared with a rank it waits for (the node's ranks fit its CPUs).
        self.spread = _GETCPU is not None and self.n <= usable_cpus()
        self._backoff = self._skip = self._apart = 0   # see leave_shared_cpu

    def publish(self, *values: int) -> None:
        """Write this rank's words 1.. (before it arrives)."""
        w, base = self.words, self.me * LINE
        for i, v in enumerate(values, 1):
            w[base + i] = v

    def word(self, local: int, index: int) -> int:
        """Word ``index`` of local rank ``local``'s line."""
        return self.words[local * LINE + index]

    def arrive(self, seq: int) -> None:
        """Announce this rank has reached barrier ``seq`` (everything written before is visible first)."""
        fence()
        self.words[self.me * LINE + SEQ] = seq

    def arrived(self, seq: int) -> bool:
        """True once every rank of the node has reached barrier ``seq``."""
        w = self.words
        for i in self.others:
            if w[i * LINE + SEQ] < seq:
                return False
        fence()
        return True

    def poll(self, seq: int) -> bool:
        """``arrived(seq)``, checking every so often that the peers live (for callers that only test)."""
        if self.arrived(seq):
            return True
        self._polls += 1
        if not self._polls % CLOCK_EVERY:
            self.check_alive()
        return False

    def wait(self, seq: int, call, watch=None) -> None:
        """Block until every rank has reached barrier ``seq``; Overdue past ``call``'s deadline. ``watch()``, if
        given, runs at each clock read once the wait naps (it raises to end the wait)."""
        if self.arrived(seq):
            return
        if self.spread:
            self.leave_shared_cpu(seq)
        rounds = iter(range(1, 1 << 62))

        def every() -> None:  # one liveness check every _LIVENESS_EVERY clock reads
            n = next(rounds)
            if not n % _LIVENESS_EVERY:
                self.check_alive()
            if watch is not None and n >= SPIN_ROUNDS:
                watch()
        wait_until(partial(self.arrived, seq), call.overdue, every)

    def leave_shared_cpu(self, seq: int) -> bool:
        """Note this rank's CPU; if a rank that has not reached ``seq`` last noted the same, move to a CPU no
        rank of the node noted, when there is one (True if this rank moved).

        Where the other CPUs are busy the kernel may put the rank back, so each move doubles the
        shared waits let pass before the next (up to ``_MOST_SKIPPED``); as many waits in a row
        apart start over."""
        w, cpu = self.words, _GETCPU()
        w[self.me * LINE + CPU] = cpu
        for i in self.others:
            if w[i * LINE + SEQ] < seq and w[i * LINE + CPU] == cpu:
                break
        else:
            self._apart += 1
            if self._apart >= _MOST_SKIPPED:
                self._backoff = self._skip = 0
            return False
        self._apart = 0
        if self._skip:
            self._skip -= 1
            return False
        self._backoff = self._skip = min(2 * self._backoff or 1, _MOST_SKIPPED)
        allowed = os.sched_getaffinity(0)
        free = sorted(allowed.difference(w[i * LINE + CPU] for i in range(self.n)))
        if not free:
            return False
        os.sched_setaffinity(0, free[:1])   # the kernel moves this thread there before the call returns
        os.sched_setaffinity(0, allowed)    # and leaves it there while that CPU has nothing else to run
        w[self.me * LINE + CPU] = free[0]
        return True

    def late(self, seq: int) -> list[int]:
        """Ranks (of the communicator) that have not reached barrier ``seq``."""
        return [self.ranks[i] for i in self.others if self.words[i * LINE + SEQ] < seq]

    def check_alive(self) -> None:
        """ConnectionError naming a peer whose process is gone."""
        for i in self.others:
            pid = self.words[i * LINE + PID]
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                raise ConnectionError(f"rank {self.ranks[i]} (process {pid}) on this node has died") from None
            except PermissionError:
                pass
