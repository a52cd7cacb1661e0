"""A third transport, for teaching: named pipes (FIFOs) between the ranks of one machine.

    python -m npddp.run --nproc 3 -m npddp.check --transport pipe --backend ring --plugin examples/pipe_transport.py

Each ordered pair of ranks has a FIFO in a directory named from the job id; a message is a frame
(tag, byte count, bytes). A rank makes and opens the FIFOs it reads, then opens those it writes; once
a hello came from every peer, the names go (open descriptors keep the pipes). Nothing blocks: every
``test()`` moves every pipe as far as it goes. Messages from one rank with one tag arrive in order.
"""

import contextlib
import errno
import os
import struct
import tempfile
import time

import numpy as np

from npddp.comm import register_transport
from npddp.util import env, variables

HEADER, HELLO = struct.Struct("<qq"), -1  # a frame's (tag, bytes); the opening message's tag (others are >= 0)


class PipeRequest:
    """One send or receive; ``test()`` moves every pipe of its transport."""

    def __init__(self, transport, view: memoryview, tag: int):
        self.transport, self.view, self.tag, self.done, self.error = transport, view, tag, False, None

    def test(self) -> bool:
        """Move every pipe; True once this request has completed (a receive too small for its message raises)."""
        if not self.done:
            self.transport.progress()
        if self.error is not None:
            raise self.error
        return self.done

    def cancel(self) -> None:
        self.done = True   # abandoned after a timeout: never completes afterwards


class PipeTransport:
    """Non-blocking point-to-point messages over one FIFO per ordered pair of ranks."""

    name = "pipe"

    def __init__(self, rank: int, size: int, readers: dict, writers: dict):
        self.rank, self.size, self._readers, self._writers = rank, size, readers, writers
        self._sends = {p: [] for p in writers}           # per peer: [frame view, bytes written so far]
        self._inbox = {p: bytearray() for p in readers}  # per peer: bytes read, not yet a whole frame
        self._early = {p: [] for p in (*readers, rank)}  # per peer: whole frames no receive matched yet
        self._posted = {p: [] for p in (*readers, rank)}  # per peer: receives waiting for a frame

    def isend(self, buf: np.ndarray, dest: int, tag: int) -> PipeRequest:
        data = np.ascontiguousarray(buf).view(np.uint8).reshape(-1)
        request = PipeRequest(self, memoryview(data), tag)
        if dest == self.rank:
            self._arrived(dest, tag, bytes(data))
            request.done = True
            return request
        self._sends[dest].append([memoryview(HEADER.pack(tag, data.nbytes) + data.tobytes()), 0, request])
        self.progress()
        return request

    def irecv(self, buf: np.ndarray, source: int, tag: int) -> PipeRequest:
        request = PipeRequest(self, memoryview(buf.reshape(-1).view(np.uint8)), tag)
        early = self._early[source]
        match = next((i for i, (t, _) in enumerate(early) if t == tag), None)
        if match is None:
            self._posted[source].append(request)
            return request
        self._fill(request, source, early.pop(match)[1])
        return request

    def split(self, colors):
        raise NotImplementedError("the pipe transport has no split (backend hier needs one)")

    def progress(self) -> None:
        """Write what each pipe takes, read what each holds, and match whole frames to receives."""
        for peer, queue in self._sends.items():
            while queue:
                frame, done, request = queue[0]
                try:
                    done = queue[0][1] = done + os.write(self._writers[peer], frame[done:])
                except BlockingIOError:
                    break
                if done < len(frame):
                    break
                request.done = True
                queue.pop(0)
        for peer, fd in self._readers.items():
            inbox = self._inbox[peer]
            try:
                while chunk := os.read(fd, 1 << 16):
                    inbox += chunk
                if not chunk:
                    raise ConnectionResetError(f"rank {peer} closed its pipe to rank {self.rank}")
            except BlockingIOError:
                pass
            while len(inbox) >= HEADER.size and len(inbox) >= HEADER.size + HEADER.unpack_from(inbox)[1]:
                tag, nbytes = HEADER.unpack_from(inbox)
                self._arrived(peer, tag, bytes(inbox[HEADER.size:HEADER.size + nbytes]))
                del inbox[:HEADER.size + nbytes]

    def _arrived(self, source: int, tag: int, data: bytes) -> None:
        posted = self._posted[source]
        match = next((i for i, r in enumerate(posted) if r.tag == tag), None)
        if match is None:
            return self._early[source].append((tag, data))
        self._fill(posted.pop(match), source, data)

    def _fill(self, request: PipeRequest, source: int, data: bytes) -> None:
        if len(data) > len(request.view):   # as over TCP: the receive fails, naming the message
            request.error = ValueError(f"message from rank {source} with tag {request.tag} has {len(data)} "
                                       f"bytes, more than the {len(request.view)} bytes of its receive")
        request.view[:min(len(data), len(request.view))] = data[:len(request.view)]
        request.done = True


class PipeWorlds:
    """Builds each new world of pipes (one per communicator ``create`` makes), numbered alike on every rank."""

    count = 0

    def __call__(self, timeout: float) -> PipeTransport:
        rank, size, self.count = env.world_rank(), env.world_size(), self.count + 1
        folder = os.path.join(tempfile.gettempdir(), f"pipes-{variables.text(variables.JOB_ID) or 'job'}-{self.count}")
        os.makedirs(folder, exist_ok=True)
        name, peers = (lambda src, dst: os.path.join(folder, f"{src}-{dst}")), [p for p in range(size) if p != rank]
        for p in peers:
            os.mkfifo(name(p, rank))
        readers = {p: os.open(name(p, rank), os.O_RDONLY | os.O_NONBLOCK) for p in peers}
        writers, deadline = {}, time.monotonic() + timeout
        while len(writers) < len(peers):   # a FIFO opens for writing once its reader has opened it
            for p in set(peers) - set(writers):
                try:
                    writers[p] = os.open(name(rank, p), os.O_WRONLY | os.O_NONBLOCK)
                except OSError as exc:
                    if exc.errno not in (errno.ENOENT, errno.ENXIO) or time.monotonic() > deadline:
                        raise
            time.sleep(0.001)
        transport = PipeTransport(rank, size, readers, writers)
        waits = [transport.irecv(np.zeros(1), p, HELLO) for p in peers] + [transport.isend(np.zeros(1), p, HELLO) for p in peers]
        while not all([w.test() for w in waits]):
            time.sleep(0.0001)
        for p in peers:
            os.unlink(name(p, rank))
        with contextlib.suppress(OSError):   # the last rank to get here removes it; the others find it not empty
            os.rmdir(folder)
        return transport


register_transport("pipe", PipeWorlds())
