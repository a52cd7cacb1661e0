"""``auto`` with MPI's own all-reduce among its candidates (over the MPI transport only).

Where it appears (the model's table, tuning files, the tuner), that results stay exact when it runs, that
it keeps call order beside the other candidates, and that ranks passing different arguments get a
CollectiveMismatchError on every rank whichever candidate each picked.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from npddp.comm import DTYPES, OPS, CollectiveMismatchError, create
from npddp.comm.compose.costmodel import LIBRARY_NODE_BYTES, candidates, model_table, node_table
from npddp.comm.compose.library import library_name
from npddp.comm.compose.tuning import FORMAT, VERSION, check_table
from npddp.comm.algorithms.registry import LIBRARY
from npddp.util.mpilibs import LIBRARIES

from tests.helpers.groups import one_rank_group
from tests.helpers.collectives import run_case, sizes
from tests.helpers.ranks import TCP_MODE

#: runs again across pretended nodes (tests/run_all.sh: hier-mpi-4, hier-tcp-4)
pytestmark = pytest.mark.across_nodes

needs_mpi_transport = pytest.mark.skipif(TCP_MODE, reason="MPI's own all-reduce is a candidate over MPI only")


def table_file(path, transport: str, size: int, steps) -> str:
    """A tuning file for ``transport`` and ``size`` ranks whose every dtype runs ``steps``."""
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION, "transport": transport, "world_size": size,
                                "table": {"*": steps}}))
    return str(path)


@pytest.mark.parametrize("library", [*(lib.name for lib in LIBRARIES), "another MPI", None])
@pytest.mark.parametrize("size", [1, 2, 3, 8])
def test_on_one_node_mpi_goes_first_up_to_its_library_s_bound_then_shm(library, size):
    steps = node_table(size, library)
    bound = LIBRARY_NODE_BYTES.get(library, 0) if library and size > 1 else 0
    for nbytes in [0, 1, 1024, 4096, 8192, 16384, 65536, 262144, 262145, 1 << 20, 64 << 20]:
        pick = next(a for m, a in steps if m is None or nbytes <= m)
        assert pick == (LIBRARY if nbytes <= bound and bound > 0 else "shm"), (library, size, nbytes, steps)
    assert steps[-1] == [None, "shm"] and node_table(size) == [[None, "shm"]]


def test_every_library_has_a_bound_and_the_running_one_is_named():
    assert set(LIBRARY_NODE_BYTES) == {lib.name for lib in LIBRARIES}
    assert all(isinstance(b, int) and 0 <= b <= 1 << 20 for b in LIBRARY_NODE_BYTES.values())
    if not TCP_MODE:
        assert library_name() in LIBRARY_NODE_BYTES


@pytest.mark.parametrize("size", [2, 3, 4, 8])
@pytest.mark.parametrize("across", [False, True])
def test_elsewhere_mpi_ties_with_the_schedule_it_runs_and_the_hand_written_one_keeps_the_size(size, across):
    with_library = model_table("mpi", size, across_nodes=across, library=True)
    assert with_library == model_table("mpi", size, across_nodes=across)
    assert all(a in candidates() for _, a in with_library)


def test_a_table_naming_mpi_is_valid_over_mpi_only_and_refused_elsewhere_in_one_line():
    data = {"format": FORMAT, "version": VERSION, "transport": "tcp", "world_size": 2,
            "table": {"*": [[4096, LIBRARY], [None, "shm"]]}}
    with pytest.raises(ValueError) as caught:
        check_table(data, "tcp", 2, node=True)
    text = str(caught.value)
    assert "['mpi'] this job cannot run" in text and "over the MPI transport only" in text and "\n" not in text
    assert check_table({**data, "transport": "mpi"}, "mpi", 2, node=True, library=True)["*"][0] == [4096, LIBRARY]


@needs_mpi_transport
def test_over_mpi_a_tuning_file_naming_mpi_is_loaded(tmp_path):
    path = table_file(tmp_path / "t.json", "mpi", 1, [[100, "rd"], [None, LIBRARY]])
    comm = create("auto", one_rank_group(), tuning=path)
    assert LIBRARY in comm.algorithms and comm.source.startswith("tuning file")
    assert [comm.algorithm_for(n, np.float32) for n in (100, 101)] == ["rd", LIBRARY]


@pytest.mark.mpi(min_size=2)
def test_the_candidate_and_its_table_over_each_transport(world, tmp_path, assert_all_ranks):
    comm = create("auto", world.fresh())
    steps = comm.table["*"]
    if world.tcp:
        ok = LIBRARY not in comm.algorithms and LIBRARY not in {a for _, a in steps}
    elif comm.shared_memory:   # every rank on this machine: MPI's own first, then shm
        ok = LIBRARY in comm.algorithms and steps == node_table(world.size, library_name())
    else:                      # pretended nodes: a candidate the model prices as a tie, in hier's group across too
        hier = comm.algorithms.get("hier")
        ok = LIBRARY in comm.algorithms and (hier is None or LIBRARY in hier.inter.algorithms)
    assert_all_ranks(ok, f"candidates {sorted(comm.algorithms)}, table {steps}", world)
    path = table_file(tmp_path / f"t{world.rank}.json", "tcp" if world.tcp else "mpi", world.size,
                      [[None, LIBRARY]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tuned = create("auto", world.fresh(), tuning=path)
    shown = [str(w.message) for w in caught if "tuning file" in str(w.message)]
    if world.tcp:   # refused with one warning on rank 0, the model instead
        ok = tuned.source == "model" and (world.rank or (len(shown) == 1 and "over the MPI transport only" in shown[0]))
    else:
        ok = tuned.source.startswith("tuning file") and tuned.algorithm_for(8, np.float32) == LIBRARY and not shown
    assert_all_ranks(ok, f"source {tuned.source}, warnings {shown}", world)


def pinned(world, tmp_path, node: bool, monkeypatch, **options):
    """``auto`` whose every call runs MPI's own all-reduce (a tuning table); ``node`` False: no shared memory."""
    monkeypatch.setenv("NPDDP_AUTO_SHM", "1" if node else "0")
    path = table_file(tmp_path / f"pin{world.rank}.json", "mpi", world.size, [[None, LIBRARY]])
    return one_node(create("auto", world.fresh(), tuning=path, **options), node)


def one_node(comm, node: bool):
    """``comm``, or a skip where the node check is wanted and the ranks span (pretended) nodes."""
    if node and not comm.shared_memory:
        pytest.skip("the ranks span nodes (NPDDP_RANKS_PER_NODE): no node check")
    return comm


@pytest.mark.mpi(min_size=2)
@needs_mpi_transport
@pytest.mark.parametrize("node", [True, False], ids=["node-check", "signature-trade"])
def test_results_are_exact_for_every_size_dtype_and_op_when_mpi_runs(world, tmp_path, node, values, monkeypatch,
                                                                      assert_all_ranks, assert_ranks_agree_on_all):
    comm = pinned(world, tmp_path, node, monkeypatch)
    problems, results = [], []
    for n in [*sizes(comm.size), 70_001]:
        for dtype in DTYPES:
            for op in OPS:
                for inplace in (True, False):
                    got, found = run_case(comm, values, n, dtype, op, inplace)
                    problems += found
                    results.append(got)
    avg = comm.allreduce(np.full(1001, world.rank + 1.0), "avg")
    if not np.array_equal(avg, np.full(1001, (world.size + 1) / 2)):
        problems.append(f"avg: {avg[:3]}")
    ran = {comm.algorithm_for(r.nbytes, r.dtype) for r in results if r.size}
    assert_ranks_agree_on_all(results, world)
    assert_all_ranks(not problems and ran == {LIBRARY} and (comm.shared_memory == node),
                     f"{problems[:4]}; ran {ran}", world)


@pytest.mark.mpi(min_size=2)
@needs_mpi_transport
@pytest.mark.parametrize("node", [True, False], ids=["node-check", "signature-trade"])
def test_non_blocking_calls_on_mpi_and_the_others_complete_in_any_order(world, tmp_path, node, monkeypatch,
                                                                        assert_all_ranks):
    monkeypatch.setenv("NPDDP_AUTO_SHM", "1" if node else "0")
    other = "shm" if node else "rd"
    path = table_file(tmp_path / f"mix{world.rank}.json", "mpi", world.size, [[4096, LIBRARY], [None, other]])
    comm = one_node(create("auto", world.fresh(), tuning=path), node)
    counts = (10, 70_001, 300, 20_000, 3, 511)            # mpi, other, mpi, other, mpi, mpi (float64)
    data = [np.arange(n, dtype=np.float64) * (world.rank + 1) for n in counts]
    total = world.size * (world.size + 1) / 2
    bufs = [d.copy() for d in data]
    handles = [comm.iallreduce(b, "max" if i == 5 else "sum") for i, b in enumerate(bufs)]
    comm.barrier()
    for h in reversed(handles):
        h.wait()
    picks = [comm.algorithm_for(b.nbytes, b.dtype) for b in bufs]
    ok = all(np.array_equal(b, np.arange(b.size) * (world.size if i == 5 else total)) for i, b in enumerate(bufs))
    blocking = comm.allreduce(data[0].copy(), "avg")
    ok = ok and np.allclose(blocking, np.arange(10) * total / world.size)
    assert_all_ranks(ok and picks.count(LIBRARY) == 4, f"wrong sums or picks {picks}", world)


@pytest.mark.mpi(min_size=2)
@needs_mpi_transport
@pytest.mark.parametrize("node", [True, False], ids=["node-check", "signature-trade"])
@pytest.mark.parametrize("case", ["count", "op", "dtype", "other path", "non-blocking"])
def test_a_mismatch_on_the_mpi_path_raises_on_every_rank(world, tmp_path, node, case, monkeypatch, assert_all_ranks):
    """The last rank passes other arguments; "other path": a size that picks another candidate than the others'."""
    monkeypatch.setenv("NPDDP_AUTO_SHM", "1" if node else "0")
    path = table_file(tmp_path / f"mm{world.rank}.json", "mpi", world.size,
                      [[4096, LIBRARY], [None, "shm" if node else "rd"]])
    comm = one_node(create("auto", world.fresh(), tuning=path, timeout=30, check_args=True), node)
    buf, op = np.arange(1, 41, dtype=np.float32), "sum"      # 160 bytes: MPI's own
    if comm.rank == comm.size - 1:
        buf, op = {"count": (buf[:-3].copy(), op), "op": (buf, "max"), "dtype": (buf.view(np.int32), op),
                   "other path": (np.ones(2048, dtype=np.float32), op), "non-blocking": (buf[:-1].copy(), op)}[case]
    error = ""
    try:
        if case == "non-blocking":
            comm.iallreduce(buf, op).wait()
        else:
            comm.allreduce(buf, op)
    except CollectiveMismatchError as exc:
        error = str(exc)
    picked = comm.algorithm_for(buf.nbytes, buf.dtype)
    closed = ""
    try:
        comm.allreduce(np.ones(3))
    except RuntimeError as exc:
        closed = str(exc)
    ok = bool(error) and f"rank {world.size - 1}" in error and ("closed" in closed or "unusable" in closed)
    assert_all_ranks(ok, f"{case} (this rank picked {picked}): error {error!r}, after it {closed!r}", world)


@pytest.mark.slow
@needs_mpi_transport
def test_the_tuner_over_mpi_times_mpi_beside_the_others_and_writes_a_table_auto_loads(tmp_path):
    out = tmp_path / "tuned.json"
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([str(root / "mpi_run.sh"), "-n", "2", sys.executable, "-m", "npddp.tune", "-b", "1K", "-e",
                           "16K", "--iters", "2", "--budget", "0.01", "--max-rounds", "3", "--out", str(out)],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    header = next(line for line in done.stdout.splitlines() if line.split()[:1] == ["bytes"])
    assert LIBRARY in header.split() and "shm" in header.split(), header
    data = json.loads(out.read_text())
    assert data["transport"] == "mpi" and data["sizes"] == [1024, 4096, 16384]
    assert check_table(data, "mpi", 2, node=True, library=True) == data["table"]
    steps = node_table(2, library_name())
    defaults = [next(a for m, a in steps if m is None or n <= m) for n in data["sizes"]]
    assert set(defaults) <= {"shm", LIBRARY}   # the default it keeps unless another wins every round
    assert all(w == d or f"faster than default {d} in every round" in note
               for w, d, note in zip(data["winners"], defaults, data["notes"])), data["notes"]
