"""Fixtures shared by the whole suite: the group of ranks a test runs on, and checks that keep them in step.

A distributed test (marked ``mpi``) runs on every rank of a group: under ``mpirun`` that is
mpi4py's ``COMM_WORLD``; under ``python -m npddp.run`` (the TCP transport, no MPI) it is the
TCP world built from the launcher's environment. :class:`Group` offers both the same few
calls the checks need. Tests make every collective call on all ranks before asserting; the
checks then gather what each rank saw through the group's own exchange (mpi4py's buffer
collectives, or plain messages of the transport, never the algorithms under test), so a
failure seen on one rank fails every rank at the same point instead of leaving the others waiting.

Under ``npddp.run`` the suite runs with ``-p no:pytest_mpi``: distributed tests whose
``min_size`` the world meets run, tests marked ``needs_mpi`` (they call mpi4py themselves) and
serial tests are deselected (the serial and ``mpirun`` runs cover them).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import tempfile
import time
import weakref
from pathlib import Path

import numpy as np
import pytest

from npddp.comm import BACKENDS
from npddp.comm.transports.base import is_transport, resolve_transport
from npddp.nn import Module, Parameter

#: True when this test process is one rank of a ``python -m npddp.run`` job (TCP transport).
TCP_MODE = resolve_transport("auto") == "tcp"
#: Backends of this run: MPI's own collectives need the mpi transport.
RUN_BACKENDS = tuple(b for b in BACKENDS if not (TCP_MODE and b == "mpi"))
_CHECK_TAG = 1
_CHECK_TIMEOUT_S = 120.0


#: Tests that watch the whole machine (its processes, /dev/shm, /tmp, network namespaces) or time how fast a job ends:
#: marked ``alone``, they run in a pytest run of their own, never beside another test (tests/run_all.sh: serial-alone).
ALONE = ("tests/reliability/", "tests/cluster/", "tests/process/test_cleanup.py", "tests/test_run_all.py",
         "tests/test_session_cleanup.py")


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_mpi: calls mpi4py itself, so it runs under mpirun only")
    config.addinivalue_line("markers", "alone: watches the whole machine or times a job's end: never run beside "
                                       "another test (not under pytest-xdist's -n); set for the paths in ALONE")


#: Hydra's topology file (MPICH, Intel MPI): its proxy makes it in /tmp (whatever TMPDIR says) and holds it open
#: while the job runs; a plain ``mpirun`` job that is killed or aborts leaves it behind.
HYDRA_TOPOLOGY_FILES = "/tmp/hydra_hwloc_xmlfile_*"
_PRESENT_AT_START = pytest.StashKey[tuple]()


def _sees_the_whole_run(config) -> bool:
    """True in the process that outlives every test of the run: not a rank of a job, not a pytest-xdist worker."""
    from npddp.util import env
    return env.world_size() <= 1 and not hasattr(config, "workerinput")


def _leftover_kinds() -> tuple[set[str], set[str]]:
    """What aborted jobs may leave, present now: names in /dev/shm, and hydra's topology files."""
    from npddp.process.cleanup import SHM
    return set(os.listdir(SHM)) if SHM.is_dir() else set(), set(glob.glob(HYDRA_TOPOLOGY_FILES))


def pytest_sessionstart(session):
    if _sees_the_whole_run(session.config):
        session.config.stash[_PRESENT_AT_START] = _leftover_kinds()


def pytest_sessionfinish(session):
    """Remove what the jobs this run aborted or killed on purpose left: MPI's /dev/shm segments and hydra's topology
    files that appeared during the run and that no live process maps or holds open."""
    from npddp.process.cleanup import held_temp_entries, orphans, remove_unused
    if _PRESENT_AT_START not in session.config.stash:
        return
    shm_before, hydra_before = session.config.stash[_PRESENT_AT_START]
    remove_unused([p for p in orphans(min_age_s=0.0) if p.name not in shm_before])
    new = set(glob.glob(HYDRA_TOPOLOGY_FILES)) - hydra_before
    held = set()
    for pid in (int(entry) for entry in os.listdir("/proc") if entry.isdigit()) if new else ():
        held |= held_temp_entries(pid, "/tmp")
    for path in new - held:
        with contextlib.suppress(OSError):
            if os.lstat(path).st_uid == os.getuid():
                os.unlink(path)


@pytest.hookimpl(tryfirst=True)   # before -m selects by marker
def pytest_collection_modifyitems(config, items):
    """Mark the tests under ALONE ``alone``; under npddp.run keep only the distributed tests this world can run."""
    root = Path(__file__).resolve().parent.parent
    for item in items:
        path = item.path.resolve()
        where = path.relative_to(root).as_posix() if path.is_relative_to(root) else ""
        if where.startswith(ALONE):
            item.add_marker("alone")
    if not TCP_MODE:
        return
    size = int(os.environ["WORLD_SIZE"])
    keep, drop = [], []
    for item in items:
        mark = item.get_closest_marker("mpi")
        runs = (mark is not None and item.get_closest_marker("needs_mpi") is None
                and size >= mark.kwargs.get("min_size", 1))
        (keep if runs else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


class Group:
    """The ranks of a test, over mpi4py or the TCP transport: rank, size, allgather, barrier, fresh."""

    def __init__(self, raw):
        self.raw = raw
        self.tcp = is_transport(raw) and raw.name == "tcp"
        if self.tcp:
            self.rank, self.size = raw.rank, raw.size
            self._checker = raw.world.transport(raw.ranks)  # a message context of the checks' own
        else:
            self.rank, self.size = raw.Get_rank(), raw.Get_size()

    def allgather(self, local: np.ndarray) -> np.ndarray:
        """Every rank's ``local`` (same dtype and shape everywhere), stacked: ``(size, *local.shape)``."""
        local = np.ascontiguousarray(local)
        out = np.empty((self.size, *local.shape), dtype=local.dtype)
        if not self.tcp:
            self.raw.Allgather(local, out)
            return out
        out[self.rank] = local
        t = self._checker
        others = [r for r in range(self.size) if r != self.rank]
        requests = [t.irecv(out[r], r, _CHECK_TAG) for r in others] + [t.isend(local, r, _CHECK_TAG) for r in others]
        deadline = time.monotonic() + _CHECK_TIMEOUT_S
        while not all([r.test() for r in requests]):
            if time.monotonic() > deadline:
                raise TimeoutError(f"test check: rank {self.rank} waited {_CHECK_TIMEOUT_S:g} s for its peers")
            os.sched_yield()
        return out

    def barrier(self) -> None:
        """Return once every rank has arrived."""
        if self.tcp:
            self.allgather(np.zeros(1, dtype=np.uint8))
        else:
            self.raw.Barrier()

    def fresh(self):
        """A new group over the same ranks whose messages cannot meet this one's (MPI: a Dup, never freed)."""
        return self.raw.world.transport(self.raw.ranks) if self.tcp else self.raw.Dup()


_GROUPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def world_raw():
    """The world of this run: mpi4py's COMM_WORLD, or the TCP world under npddp.run."""
    if TCP_MODE:
        from npddp.comm.transports.world import world_from_env
        return world_from_env(300.0)
    from mpi4py import MPI
    return MPI.COMM_WORLD


def as_group(raw=None) -> Group:
    """The :class:`Group` of ``raw`` (an mpi4py communicator or a transport; None: the world)."""
    if isinstance(raw, Group):
        return raw
    raw = world_raw() if raw is None else raw
    if is_transport(raw):
        group = _GROUPS.get(raw)
        if group is None:
            group = _GROUPS[raw] = Group(raw)
        return group
    return Group(raw)


def check_all_ranks(ok: bool, message: str = "", group=None) -> None:
    """Fail on every rank unless ``ok`` holds on every rank; the error names the failing ranks."""
    g = as_group(group)
    flags = g.allgather(np.array([1 if ok else 0], dtype=np.int32))[:, 0]  # (size,)
    bad = np.flatnonzero(flags == 0).tolist()
    assert not bad, f"failed on ranks {bad}" + (f"; on rank {g.rank}: {message}" if not ok else "")


def check_ranks_agree(array: np.ndarray, group=None) -> np.ndarray:
    """All-gather ``array`` and fail on every rank unless all copies have the same dtype, shape and bits.

    Returns the gathered bytes, shape ``(size, array.nbytes)``.
    """
    g = as_group(group)
    meta = np.frombuffer(f"{array.dtype.str}{array.shape}".encode()[:64].ljust(64), dtype=np.uint8)
    metas = g.allgather(meta)  # (size, 64)
    differ = [r for r in range(g.size) if not np.array_equal(metas[r], metas[0])]
    assert not differ, f"ranks {differ} hold a different dtype/shape than rank 0: " + \
        ", ".join(bytes(metas[r]).decode().strip() for r in range(g.size))
    local = np.ascontiguousarray(array).reshape(-1).view(np.uint8)  # (nbytes,)
    gathered = g.allgather(local)  # (size, nbytes)
    differ = [r for r in range(g.size) if not np.array_equal(gathered[r], gathered[0])]
    assert not differ, f"ranks {differ} hold different bits than rank 0 ({array.dtype}, shape {array.shape})"
    return gathered


def check_ranks_agree_on_all(arrays, group=None) -> None:
    """:func:`check_ranks_agree` on many arrays at once: their dtypes, shapes and bits in one exchange."""
    arrays = [np.ascontiguousarray(a) for a in arrays]
    meta = np.frombuffer(";".join(f"{a.dtype.str}{a.shape}" for a in arrays).encode(), dtype=np.uint8)
    blob = np.concatenate([meta] + [a.reshape(-1).view(np.uint8) for a in arrays])  # (bytes,)
    check_ranks_agree(blob, group)



class IallreduceSpy:
    """Communicator wrapper that appends ``("iallreduce", buf)`` to ``events`` as each non-blocking all-reduce starts."""

    def __init__(self, inner, events: list):
        self.inner, self.events = inner, events

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def iallreduce(self, buf, op="sum"):
        self.events.append(("iallreduce", buf))
        return self.inner.iallreduce(buf, op)

@pytest.fixture
def comm_world():
    """mpi4py's ``MPI.COMM_WORLD`` (tests using it are marked needs_mpi)."""
    from mpi4py import MPI
    return MPI.COMM_WORLD


@pytest.fixture
def world():
    """The :class:`Group` of every rank of this run, over MPI or TCP."""
    return as_group()


@pytest.fixture
def assert_all_ranks():
    """``assert_all_ranks(ok, message="", group=None)``: fail everywhere unless ``ok`` on every rank."""
    return check_all_ranks


@pytest.fixture
def assert_ranks_agree():
    """``assert_ranks_agree(array, group=None)``: fail everywhere unless every rank holds the same bits."""
    return check_ranks_agree


@pytest.fixture
def assert_ranks_agree_on_all():
    """``assert_ranks_agree_on_all(arrays, group=None)``: one exchange checks every array's bits across ranks."""
    return check_ranks_agree_on_all


@contextlib.contextmanager
def agreed_directory(group=None):
    """A fresh directory made by rank 0 of ``group``, its path shared with every rank as bytes; removed by
    rank 0 once every rank is done with it."""
    g = as_group(group)
    buf = np.zeros(4096, dtype=np.uint8)
    if g.rank == 0:
        raw = tempfile.mkdtemp(prefix="npddp-test-").encode()
        buf[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
    path = Path(bytes(g.allgather(buf)[0]).rstrip(b"\0").decode())
    try:
        yield path
    finally:
        g.barrier()
        if g.rank == 0:
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def agreed_tmpdir():
    """A fresh directory shared by every rank of the world (see :func:`agreed_directory`)."""
    with agreed_directory() as path:
        yield path


class Idle(Module):
    """A layer whose parameter its backward writes only when ``writes`` (an unused parameter otherwise)."""

    def __init__(self, writes: bool = False):
        super().__init__()
        self.scale = Parameter(np.ones(3))
        self.writes = writes

    def forward(self, x):
        return x

    def backward(self, dout):
        if self.writes:
            self.scale.grad += 1.0
        return dout


def stale_then_backward(wrapper, model, x, via="model"):
    """Gradients full of stale 5s, a lazy zero_grad (of the model or of the wrapper), one backward through ``wrapper``."""
    for p in model.parameters():
        p.grad[...] = 5.0
    (model if via == "model" else wrapper).zero_grad()
    wrapper.backward(np.ones_like(wrapper(x)))


class OneRank:
    """The communicator of a world of one (nothing is ever sent): stands in for a Communicator in serial tests."""

    rank, size, name, shared_memory = 0, 1, "mpi", False

    def empty(self, n, dtype=np.float32):
        return np.zeros(n, dtype=dtype)

    def broadcast(self, buf, root=0):
        return buf

    def allreduce(self, buf, op="sum", out=None):
        return buf

    def allgather(self, buf):
        return buf[None].copy()
