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
from npddp.comm import checks as c
from npddp.comm import signature as sg
from npddp.comm.communicators.p2p import P2PCommunicator
from npddp.comm.engine import signed
from npddp.comm.engine.abort import CONTROL_TAG
from npddp.comm.algorithms.rd import RecursiveDoubling
from npddp.comm.algorithms.ring import Ring


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
        if tag == CONTROL_TAG:
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
    aborts = [np.frombuffer(m, dtype=np.int64) for tag, m in transport.sent if tag == CONTROL_TAG]
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


# ----------------------------------------------------------------------------- signatures' indices in the tags

class Indexed(Scripted):
    """A scripted peer whose transport carries large tags and shows what arrived unreceived (``stray``)."""

    def __init__(self, tag_bound=(1 << 29) - 1):
        super().__init__()
        self.tag_bound = tag_bound
        self.stray: list[int] = []   # tags of rank 1's messages that no receive has taken
        self.stalled = False         # True: receives of collectives never complete

    def irecv(self, buf, source, tag):
        if self.stalled and tag != CONTROL_TAG:
            return Pending()
        return super().irecv(buf, source, tag)

    def unmatched_tags(self, source):
        return list(self.stray)


def indexed(tag_bound=(1 << 29) - 1):
    transport = Indexed(tag_bound)
    comm = P2PCommunicator(transport, RecursiveDoubling, "rd", timeout=2)
    comm.check_args = True
    return comm, transport


def test_a_shape_signed_in_full_once_then_goes_plain_under_its_index_in_the_tag():
    comm, transport = indexed()
    x, y = np.arange(40, dtype=np.float32), np.arange(40, dtype=np.float64)
    for k in range(3):
        for a in (x, y):   # two shapes, interleaved: index 1 and index 2
            transport.give(signed_message(a) if k == 0 else a.tobytes())
            assert np.array_equal(comm.allreduce(a, out=np.empty_like(a)), 2 * a)
    tags = [tag for tag, _ in transport.sent]
    lengths = [len(m) for _, m in transport.sent]
    assert [t >> signed.INDEX_SHIFT for t in tags] == [0, 0, 1, 2, 1, 2]
    assert [t & signed.CALL_MASK for t in tags] == [c.USER_TAG_LIMIT + k for k in range(6)]
    assert lengths == [signed.HEAD_BYTES + x.nbytes, signed.HEAD_BYTES + y.nbytes] + [x.nbytes, y.nbytes] * 2
    assert comm.signer.signatures[1:] == [sg.words("allreduce", -1, x, "sum"), sg.words("allreduce", -1, y, "sum")]


@pytest.mark.parametrize("bound, indices", [(32767, 0), ((1 << 17) - 1, 3), ((1 << 29) - 1, 5)])
def test_indices_stop_where_the_transports_tags_end_and_later_shapes_are_signed_in_full(bound, indices):
    """MPI's least tag bound (32767) holds no index, 2**17 - 1 holds 3: the 4th and 5th shapes have none."""
    comm, transport = indexed(bound)
    shapes = [np.ones(n, dtype=np.float32) for n in range(1, 6)]
    for a in shapes:
        transport.give(signed_message(a))
        comm.allreduce(a)
    assert comm.signer.limit == min(((bound + 1) >> signed.INDEX_SHIFT) - 1, signed.MAX_INDICES)
    for _ in range(2):
        for k, a in enumerate(shapes):
            transport.give(a.tobytes() if k < indices else signed_message(a))
            comm.allreduce(a)
    later = transport.sent[len(shapes):]
    assert [len(m) - a.nbytes for (_, m), a in zip(later, shapes * 2)] == \
        ([0] * indices + [signed.HEAD_BYTES] * (len(shapes) - indices)) * 2
    assert [tag >> signed.INDEX_SHIFT for tag, _ in later] == ([*range(1, indices + 1)] + [0] * (5 - indices)) * 2


def test_a_transport_that_cannot_show_unreceived_messages_is_signed_in_full_at_every_call():
    transport = Indexed()
    transport.unmatched_tags = None
    comm = P2PCommunicator(transport, RecursiveDoubling, "rd")
    comm.check_args = True
    x = np.arange(40, dtype=np.float32)
    for _ in range(3):
        transport.give(signed_message(x))
        comm.allreduce(x)
    assert comm.signer.limit == 0 and all(len(m) == signed.HEAD_BYTES + x.nbytes for _, m in transport.sent)


@pytest.mark.parametrize("field, other", [
    ("dtype", lambda x: x.view(np.int32)), ("count", lambda x: x[:-3]), ("op", lambda x: x),
])
def test_a_stalled_call_that_finds_its_peers_message_under_another_index_raises_naming_the_field(field, other):
    comm, transport = indexed()
    x = np.arange(40, dtype=np.float32)
    y, op = other(x), "max" if field == "op" else "sum"
    for k in range(2):   # both shapes known: indices 1 (x) and 2 (y)
        transport.give(signed_message(x) if k == 0 else x.tobytes())
        comm.allreduce(x.copy())
        transport.give(signed_message(y, op=op) if k == 0 else y.tobytes())
        comm.allreduce(y.copy(), op)
    transport.stalled = True
    transport.stray = [c.USER_TAG_LIMIT + 4 | 2 << signed.INDEX_SHIFT]   # rank 1's message of call #5, y's index
    with pytest.raises(CollectiveMismatchError) as caught:
        comm.allreduce(x.copy())
    text = str(caught.value)
    assert "collective #5 mismatch" in text and "rank 1 called" in text, text
    assert text.split("differing fields: ")[1].startswith(field + ";"), text
    aborts = [tag for tag, _ in transport.sent if tag == CONTROL_TAG]
    assert len(aborts) == 1


_CALL3 = c.USER_TAG_LIMIT + 2   # the third collective's tag, without an index


@pytest.mark.parametrize("stray", [_CALL3 + 1 | 2 << signed.INDEX_SHIFT,   # the next call, under y's index
                                   _CALL3 | 9 << signed.INDEX_SHIFT,       # this call, an index never handed out
                                   _CALL3 | 1 << signed.INDEX_SHIFT,       # this call, its own index
                                   5],                                     # a user's tag
                         ids=["next-call", "unknown-index", "own-index", "user-tag"])
def test_what_is_not_this_calls_message_under_a_known_other_index_is_no_mismatch(stray):
    comm, transport = indexed()
    x, y = np.arange(40, dtype=np.float32), np.arange(40, dtype=np.float64)
    for a in (x, y):   # indices 1 and 2
        transport.give(signed_message(a))
        comm.allreduce(a.copy())
    transport.stalled, transport.stray = True, [stray]
    comm.timeout = 0.3
    with pytest.raises(TimeoutError):
        comm.allreduce(x.copy())   # call #3 under x's index


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", None])
def test_a_shapes_signature_folds_into_the_shared_memory_size_word_as_pack_does(dtype, op):
    """The node path publishes ``nbytes << PACK_BITS | signature.low``, the packed bits kept with the shape."""
    from npddp.comm.node.allreduce import NodeGroup

    comm, transport = checked()
    for n in (0, 1, 1000, 1 << 20):
        buf = np.zeros(n, dtype=dtype)
        call = comm._begin("allreduce" if op else "broadcast", None, buf, op)
        assert isinstance(call.signature, sg.Signature) and call.signature == sg.words(call.operation, -1, buf, op)
        assert NodeGroup.size_value(call, buf.nbytes) == sg.pack(call.signature, buf.nbytes)
        assert sg.unpack(NodeGroup.size_value(call, buf.nbytes))[0] == buf.nbytes
