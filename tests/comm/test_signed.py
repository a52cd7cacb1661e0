"""The argument check's signed calls, driven in one process: rank 0 of two, its peer's messages scripted.

A scripted transport plays rank 1: each receive takes the next message it was given (a message
longer than the receive's buffer fails the receive, as MPI's truncation does), each send is
recorded and completes at once. So one process runs the real communicator and algorithm, and
the tests see every byte rank 0 sends.
"""

from collections import deque

import numpy as np
import pytest

from npddp.comm import CollectiveMismatchError
from npddp.comm import signature as sg
from npddp.comm.communicators.p2p import P2PCommunicator
from npddp.comm.engine import signed
from npddp.comm.p2p.rd import RecursiveDoubling
from npddp.comm.p2p.ring import Ring


class Done:
    """A request that has completed (or failed with ``error``)."""

    def __init__(self, error=None):
        self.error = error

    def test(self) -> bool:
        if self.error is not None:
            raise self.error
        return True

    def cancel(self) -> None:
        pass


class Pending(Done):
    """A request that never completes (the receives of aborts)."""

    def test(self) -> bool:
        return False


class Scripted:
    """Rank 0 of two; rank 1's messages are scripted with :meth:`give`; sends are kept in ``sent``."""

    name, rank, size = "scripted", 0, 2

    def __init__(self):
        self.inbox: deque = deque()
        self.sent: list[tuple[int, bytes]] = []   # (tag, bytes) of every send

    def give(self, *messages: bytes) -> None:
        self.inbox.extend(messages)

    def isend(self, buf, dest, tag):
        self.sent.append((tag, np.ascontiguousarray(buf).tobytes()))
        return Done()

    def irecv(self, buf, source, tag):
        if tag == signed.CONTROL_TAG:
            return Pending()
        message = self.inbox.popleft()
        if len(message) > buf.nbytes:
            return Done(ValueError(f"message of {len(message)} bytes, more than the {buf.nbytes} of the receive"))
        buf.reshape(-1).view(np.uint8)[:len(message)] = np.frombuffer(message, dtype=np.uint8)
        return Done()

    def split(self, colors):
        raise NotImplementedError


_words = sg.words   # kept: a test counts the calls of sg.words that the communicator makes


def signed_message(payload: np.ndarray, operation="allreduce", op="sum", like=None) -> bytes:
    """What rank 1 sends first: its signature (the number word -1: the tag carries it), then ``payload``."""
    like = payload if like is None else like
    return sg.HEAD.pack(*_words(operation, -1, like, op)) + payload.tobytes()


def checked(algorithm=RecursiveDoubling):
    transport = Scripted()
    comm = P2PCommunicator(transport, algorithm, "rd" if algorithm is RecursiveDoubling else "ring")
    comm.check_args = True
    return comm, transport


def test_a_repeated_call_shape_packs_its_signature_once(monkeypatch):
    packed = []
    words = sg.words
    monkeypatch.setattr(sg, "words", lambda *args: packed.append(args) or words(*args))
    comm, transport = checked()
    x, theirs = np.arange(256, dtype=np.float32), np.ones(256, dtype=np.float32)
    for _ in range(5):
        transport.give(signed_message(theirs))
        assert np.array_equal(comm.allreduce(x, out=np.empty_like(x)), x + 1)
    assert len(packed) == 1, packed
    transport.give(signed_message(theirs.astype(np.float64)))
    comm.allreduce(x.astype(np.float64))        # another shape: packed once more
    assert len(packed) == 2, packed


def test_the_signer_keeps_a_bounded_number_of_shapes():
    comm, transport = checked()
    for n in range(1, signed.SHAPE_CACHE_SIZE + 20):
        x = np.ones(n, dtype=np.float32)
        transport.give(signed_message(x))
        comm.allreduce(x)
    assert len(comm.signer.shapes) <= signed.SHAPE_CACHE_SIZE


@pytest.mark.parametrize("algorithm", [RecursiveDoubling, Ring])
def test_a_small_first_message_is_one_plain_transport_message_carrying_the_signature(algorithm, monkeypatch):
    """No wrapper around a small first send: the call waits on the transport's own request."""
    wrapped = []
    init = signed.SignedSend.__init__
    monkeypatch.setattr(signed.SignedSend, "__init__", lambda self, *a: wrapped.append(a) or init(self, *a))
    comm, transport = checked(algorithm)
    x = np.arange(256, dtype=np.float32)
    for _ in range(3):
        if algorithm is Ring:   # the ring at N = 2: block 1 (signed) to reduce, then the reduced block 0
            transport.give(signed_message(np.ones(128, dtype=np.float32), like=x),
                           np.full(128, 7, dtype=np.float32).tobytes())
        else:
            transport.give(signed_message(np.ones(256, dtype=np.float32)))
        comm.allreduce(x, out=np.empty_like(x))
    assert not wrapped
    firsts = transport.sent[::2] if algorithm is Ring else transport.sent
    assert len(firsts) == 3
    for tag, message in firsts:
        head, payload = message[:signed.HEAD_BYTES], message[signed.HEAD_BYTES:]
        assert sg.HEAD.unpack(head) == sg.words("allreduce", -1, x, "sum")
        assert payload == x[:len(payload) // 4].tobytes() or payload == x[len(x) - len(payload) // 4:].tobytes()


def test_a_large_first_message_still_goes_behind_a_signature_of_its_own():
    comm, transport = checked()
    x = np.ones(4 * signed.SMALL_BYTES, dtype=np.float32)
    transport.give(sg.HEAD.pack(*sg.words("allreduce", -1, x, "sum")), x.tobytes())
    assert np.array_equal(comm.allreduce(x.copy()), 2 * x)
    assert [len(m) for _, m in transport.sent] == [signed.HEAD_BYTES, x.nbytes]


@pytest.mark.parametrize("field, theirs", [
    ("dtype", lambda x: signed_message(x.view(np.int32))),
    ("count", lambda x: signed_message(x[:-3])),
    ("op", lambda x: signed_message(x, op="max")),
    ("kind", lambda x: signed_message(x, operation="broadcast", op=None)),
])
def test_a_mismatch_after_matching_calls_of_the_same_shape_names_the_call_the_rank_and_the_field(field, theirs):
    """The number no longer travels in the signature: the error and the abort sent to every rank still name it."""
    comm, transport = checked()
    x = np.arange(40, dtype=np.float32)
    for _ in range(3):
        transport.give(signed_message(x))
        comm.allreduce(x.copy())
    transport.give(theirs(x))
    with pytest.raises(CollectiveMismatchError) as caught:
        comm.allreduce(x.copy())
    text = str(caught.value)
    assert "collective #4 mismatch" in text and "rank 1 called" in text, text
    assert text.split("differing fields: ")[1].startswith(field), text
    aborts = [np.frombuffer(m, dtype=np.int64) for tag, m in transport.sent if tag == signed.CONTROL_TAG]
    assert len(aborts) == 1 and aborts[0][:2].tolist() == [0, 1]
    mine = tuple(aborts[0][2:2 + sg.WORDS].tolist())
    assert mine == sg.words("allreduce", 4, x, "sum")    # the abort's own signature carries the number
    with pytest.raises(RuntimeError, match="unusable"):
        comm.allreduce(x.copy())


def test_a_first_message_too_large_for_the_staging_buffer_is_a_mismatch():
    comm, transport = checked()
    x = np.arange(40, dtype=np.float32)
    transport.give(b"\0" * (signed.HEAD_BYTES + signed.SMALL_BYTES + 8))
    with pytest.raises(CollectiveMismatchError, match="another size"):
        comm.allreduce(x)
