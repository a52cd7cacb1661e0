"""``recv``'s status on every backend, over MPI and TCP: the count of a shorter message, the sender's dtype where
the transport carries it, and one-line ValueErrors for another dtype or a message longer than the buffer."""

import re

import numpy as np
import pytest

from npddp.comm import create
from npddp.comm.status import Status

from tests.helpers.ranks import TCP_MODE


def _refused(call, pattern: str, problems: list, what: str) -> None:
    """``call()`` must raise a one-line ValueError matching ``pattern``."""
    try:
        call()
    except ValueError as exc:
        text = str(exc)
        if "\n" in text or not re.search(pattern, text):
            problems.append(f"{what}: {text!r}")
        return
    problems.append(f"{what}: no error")


@pytest.mark.mpi(min_size=2)
def test_recv_reports_the_count_and_refuses_another_dtype_or_a_longer_message(backend, world, assert_all_ranks):
    comm = create(backend, world.raw)
    carries_dtype = TCP_MODE and backend != "mpi"       # a TCP frame names its dtype; an MPI message does not
    problems = []
    if comm.rank == 0:
        comm.send(np.arange(1, 4, dtype=np.float32), 1, tag=3)          # shorter than the buffer
        comm.send(np.arange(3, dtype=np.float16), 1, tag=4)             # 6 bytes: not whole float32s
        comm.send(np.arange(2, dtype=np.float64), 1, tag=5)             # 16 bytes: 4 float32s' worth
        comm.send(np.arange(6, dtype=np.float32), 1, tag=6)             # longer than the buffer
        comm.send(np.arange(2, dtype=np.int32), 1, tag=7)               # after the errors: still fine
    elif comm.rank == 1:
        status, buf = Status(), np.full(5, -7, np.float32)
        comm.recv(buf, 0, tag=3, status=status)
        if (status.count, status.nbytes, status.source, status.tag) != (3, 12, 0, 3) or \
                status.dtype != (np.float32 if carries_dtype else None) or buf.tolist() != [1, 2, 3, -7, -7]:
            problems.append(f"short message: {status}, {buf}")
        _refused(lambda: comm.recv(np.zeros(4, np.float32), 0, tag=4),
                 r"float16 .*float32" if carries_dtype else r"6 bytes, not a whole number of float32", problems,
                 "float16 into float32")
        if carries_dtype:
            _refused(lambda: comm.recv(np.zeros(4, np.float32), 0, tag=5),
                     r"from rank 0 \(tag 5\): the message holds 2 float64 \(16 bytes\), the receive buffer is float32",
                     problems, "float64 into float32")
        else:
            work = comm.irecv(np.zeros(4, np.float32), 0, tag=5, status=status)
            work.wait()
            if (status.count, status.dtype) != (4, None):
                problems.append(f"irecv over MPI: {status}")
        _refused(lambda: comm.recv(np.zeros(3, np.float32), 0, tag=6),
                 r"^\[rank 1\] \w+ recv: .*rank 0 with tag 6 .*(more than|longer than) the 12 bytes of the receive "
                 "buffer",
                 problems, "longer message")
        got = comm.recv(np.zeros(2, np.int32), 0, tag=7, status=status)
        if got.tolist() != [0, 1] or status.count != 2:
            problems.append(f"after the errors: {got}, {status}")
    total = comm.allreduce(np.ones(3))          # the communicator is still usable on every rank
    if total.tolist() != [comm.size] * 3:
        problems.append(f"allreduce after: {total}")
    assert_all_ranks(not problems, "; ".join(problems), world)
