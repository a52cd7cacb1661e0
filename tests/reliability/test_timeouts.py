"""Timeouts of every backend: a peer that never arrives is a TimeoutError naming what (and, point-to-point, who).

Serial tests: the defaults and the environment, and a receive that nothing matches. MPI tests:
the last rank skips a collective on a communicator of its own (an ``MPI_Comm_dup`` that is never
freed, since messages of the skipped call may still be in flight); every rank that waits for it
raises TimeoutError after about ``TIMEOUT`` seconds, naming the operation, its number and the
ranks it waits for, and its communicator refuses further calls.
"""

import time

import numpy as np
import pytest

from npddp.comm import BACKENDS, DEFAULT_TIMEOUT, create
from npddp.comm.transports.tcp import TCPWorld

from tests.helpers.ranks import RUN_BACKENDS

#: watches the whole machine or times a job's end: never beside another test (run_all.sh: serial-alone)
pytestmark = pytest.mark.alone

TIMEOUT = 0.2
SLACK = 5.0          # oversubscribed ranks may be scheduled late
every = pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: f"{b}-backend")
run = pytest.mark.parametrize("backend", RUN_BACKENDS, ids=lambda b: f"{b}-backend")


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch):
    """These tests choose debug mode and timeouts themselves."""
    monkeypatch.delenv("NPDDP_DEBUG", raising=False)
    monkeypatch.delenv("NPDDP_TIMEOUT", raising=False)


@every
def test_the_default_and_the_environment_set_the_timeout(backend, monkeypatch):
    from mpi4py import MPI
    monkeypatch.delenv("NPDDP_TIMEOUT", raising=False)
    assert create(backend, MPI.COMM_SELF).timeout == DEFAULT_TIMEOUT == 300.0
    monkeypatch.setenv("NPDDP_TIMEOUT", "2.5")
    assert create(backend, MPI.COMM_SELF).timeout == 2.5
    assert create(backend, MPI.COMM_SELF, timeout=7).timeout == 7.0            # the argument wins
    assert create(backend, MPI.COMM_SELF, debug=True).timeout == 2.5           # seen through the debug wrapper
    monkeypatch.setenv("NPDDP_TIMEOUT", "inf")
    assert create(backend, MPI.COMM_SELF).timeout == float("inf")


@pytest.mark.parametrize("backend, transport", [(b, "mpi") for b in BACKENDS] + [(b, "tcp") for b in BACKENDS
                                                                                  if b != "mpi"])
def test_a_receive_nothing_matches_times_out_and_the_communicator_then_refuses_calls(backend, transport):
    if transport == "tcp":
        group = TCPWorld(0, 1, [None], ["self"]).transport()
    else:
        from mpi4py import MPI
        group = MPI.COMM_SELF.Dup()
    comm = create(backend, group, timeout=TIMEOUT)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        comm.recv(np.zeros(4), source=0, tag=3)
    waited = time.monotonic() - t0
    assert TIMEOUT <= waited < TIMEOUT + SLACK
    text = str(info.value)
    assert text.startswith(f"[rank 0] {backend} recv (tag 3) timed out after {TIMEOUT:g} s waiting to receive "
                           "from rank 0: "), text
    assert "NPDDP_DEBUG=1" in text and "unusable" in text
    for call in (comm.barrier, lambda: comm.allreduce(np.ones(3)), lambda: comm.send(np.ones(1), 0)):
        with pytest.raises(RuntimeError, match="unusable after an earlier failure: .* recv \\(tag 3\\) timed out"):
            call()


#: Operations the last rank skips; all but gather and recv keep every other rank waiting for it.
SKIPPED = ("barrier", "broadcast", "allreduce", "iallreduce", "reduce_scatter", "allgather", "scatter", "gather",
           "recv")
ONLY_RANK_0_WAITS = ("gather", "recv")


def _call(comm, operation, skipper):
    """Make the call ``operation`` on ``comm``, rooted at the rank that skips it where there is a root."""
    k, x = comm.size, np.ones(1000)
    calls = {"barrier": comm.barrier, "broadcast": lambda: comm.broadcast(x, root=skipper),
             "allreduce": lambda: comm.allreduce(x), "iallreduce": lambda: comm.iallreduce(x).wait(),
             "reduce_scatter": lambda: comm.reduce_scatter(x), "allgather": lambda: comm.allgather(x),
             "scatter": lambda: comm.scatter(np.ones((k, 10)), root=skipper),
             "gather": lambda: comm.gather(x, root=0), "recv": lambda: comm.recv(x, source=skipper, tag=5)}
    calls[operation]()


@pytest.fixture(scope="module")
def abandoned():
    """Communicators left with messages in flight: kept alive, never freed, so MPI never reuses their context."""
    return []


@pytest.mark.mpi(min_size=2)
@run
def test_a_peer_that_never_arrives_raises_timeout_error_on_the_waiting_ranks(backend, world, abandoned,
                                                                              assert_all_ranks):
    size, rank = world.size, world.rank
    skipper = size - 1
    problems = []
    for operation in SKIPPED:
        abandoned.append(world.fresh())
        comm = create(backend, abandoned[-1], timeout=TIMEOUT)
        waiting = rank == 0 if operation in ONLY_RANK_0_WAITS else rank != skipper
        waited, text = 0.0, ""
        if rank != skipper and (rank == 0 or operation != "recv"):
            t0 = time.monotonic()
            try:
                _call(comm, operation, skipper)
            except TimeoutError as err:
                waited, text = time.monotonic() - t0, str(err)
            except Exception as err:  # noqa: BLE001  (reported below, on every rank)
                problems.append(f"{operation}: {err!r}")
        world.barrier()
        names = (f"from rank {skipper}" in text or f"for rank {skipper} to arrive" in text
                 or f"ranks {skipper - 1}, {skipper} to arrive" in text)
        named = world.allgather(np.array([names], dtype=np.int8))[:, 0]  # (size,)
        if rank == 0 and not named.any() and backend != "mpi":  # MPI's collectives cannot say who is missing
            problems.append(f"{operation}: no rank named rank {skipper} as the one it waits for")
        if text:
            head = f"[rank {rank}] {backend} {operation} ("
            tagged = "collective #1)" if backend == "mpi" else "collective #1, tag "
            if not (text.startswith(head) and f"timed out after {TIMEOUT:g} s waiting " in text
                    and (operation == "recv" or tagged in text)):
                problems.append(f"{operation}: message {text!r}")
            if not TIMEOUT <= waited < TIMEOUT + SLACK:
                problems.append(f"{operation}: raised after {waited:.2f} s")
            try:
                comm.barrier()
                problems.append(f"{operation}: the communicator still accepts calls after the timeout")
            except RuntimeError as err:
                if "unusable after an earlier failure" not in str(err):
                    problems.append(f"{operation}: {err}")
        elif waiting:
            problems.append(f"{operation}: no TimeoutError")
    assert_all_ranks(not problems, "; ".join(problems), world)


@pytest.mark.mpi(min_size=2)
@run
def test_a_timeout_abandons_every_outstanding_handle(backend, world, abandoned, assert_all_ranks):
    """Two all-reduces in flight, one rank never joins: waiting on the second times out, the first is void."""
    abandoned.append(world.fresh())
    # mpi's argument check is a blocking all-reduce when a call starts, so its handles would never be outstanding
    comm = create(backend, abandoned[-1], timeout=TIMEOUT, check_args=backend != "mpi")
    skipper, problems = comm.size - 1, []
    if comm.rank != skipper:
        try:
            first, second = comm.iallreduce(np.ones(100)), comm.iallreduce(np.ones(200))
        except Exception as err:  # noqa: BLE001  (reported below, on every rank)
            problems.append(f"starting the all-reduces: {err!r}")
            first = second = None
        if second is not None:
            try:
                second.wait()
                problems.append("the second handle completed")
            except TimeoutError as err:
                if "iallreduce (collective #2" not in str(err):
                    problems.append(f"message {err}")
            for what, call in (("test", first.test), ("wait", first.wait)):
                try:
                    call()
                    problems.append(f"the first handle's {what} returned")
                except RuntimeError as err:
                    if "iallreduce (collective #2" not in str(err):
                        problems.append(f"first.{what}: {err}")
    assert_all_ranks(not problems, "; ".join(problems), world)


@pytest.mark.mpi(min_size=2)
def test_debug_mode_names_the_collective_whose_check_timed_out(world, abandoned, assert_all_ranks):
    abandoned.append(world.fresh())
    comm = create("ring", abandoned[-1], debug=True, timeout=TIMEOUT)
    text = "skipped"
    if comm.rank != comm.size - 1:
        try:
            comm.allreduce(np.ones(10, np.float32), "max")
            text = "no error"
        except TimeoutError as err:
            text = str(err)
    ok = text == "skipped" or text.startswith("collective #1 allreduce(op=max, float32, shape (10,)): the ranks "
                                              "did not all arrive for its debug check: [rank ")
    assert_all_ranks(ok, text, world)
