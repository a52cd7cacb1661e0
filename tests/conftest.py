"""Fixtures and hooks of the whole suite: the group of ranks a test runs on and its checks (from tests/helpers/ranks.py),
a directory every rank shares, and the clean-up of what aborted jobs left. The markers are setup.cfg's.

Under ``npddp.run`` the suite runs with ``-p no:pytest_mpi``: distributed tests whose
``min_size`` the world meets run, tests marked ``needs_mpi`` (they call mpi4py themselves) and
serial tests are deselected (the serial and ``mpirun`` runs cover them).
"""

from __future__ import annotations

import contextlib
import glob
import os

import pytest

from tests.helpers.ranks import TCP_MODE, agreed_directory, as_group, check_all_ranks, check_ranks_agree, \
    check_ranks_agree_on_all


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
    """Under npddp.run keep only the distributed tests this world can run."""
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


@pytest.fixture
def agreed_tmpdir():
    """A fresh directory shared by every rank of the world (see :func:`agreed_directory`)."""
    with agreed_directory() as path:
        yield path
