"""``auto``: the cost model, the size table, tuning files (good, corrupt, for another job) and the tuner.

The correctness of every algorithm ``auto`` can pick is covered with every other backend in
the property tests (``BACKENDS`` includes ``auto``); here: which algorithm it picks, and from where.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import warnings

import numpy as np
import pytest

from npddp.comm import ALGORITHMS, create
from npddp.comm.compose.costmodel import CANDIDATES, candidates, hier_time, model_table, network_time, predict
from npddp.comm.compose.tuning import FORMAT, VERSION, check_table
from npddp.comm.engine.cost import MODEL
from npddp.tools.tune import decide, stable, steps_from

from tests.helpers.groups import one_rank_group

#: runs again across pretended nodes (tests/run_all.sh: hier-mpi-4, hier-tcp-4)
pytestmark = pytest.mark.across_nodes


def tuning(tmp_path, **change):
    data = {"format": FORMAT, "version": VERSION, "transport": "mpi", "world_size": 1,
            "table": {"*": [[4096, "tree"], [1 << 20, "rd"], [None, "ring"]], "float16": [[None, "naive"]]}}
    data.update(change)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("size", [2, 3, 4, 5, 8, 16, 1024])
@pytest.mark.parametrize("transport", list(MODEL))
def test_the_model_table_picks_the_cheapest_candidate_at_every_size(size, transport):
    alpha, beta, gamma = MODEL[transport]
    steps = model_table(transport, size)
    assert steps[-1][0] is None and all(a in candidates() for _, a in steps)  # registered ones with a cost too
    bounds = [m for m, _ in steps[:-1]]
    assert bounds == sorted(bounds) and len(set(a for _, a in steps)) == len(steps)  # merged runs
    for nbytes in (8, 1000, 70_000, 3 << 20, 100 << 20):
        pick = next(a for m, a in steps if m is None or nbytes <= m)
        costs = {a: predict(a, 1 << (nbytes - 1).bit_length(), size, alpha, beta, gamma) for a in candidates()}
        assert costs[pick] == min(costs.values()), (nbytes, pick, costs)


def test_the_model_prefers_few_steps_for_small_vectors_and_bandwidth_for_large():
    alpha, beta, gamma = MODEL["mpi"]
    for n in (16, 1024):
        assert predict("rd", 8, n, alpha, beta, gamma) < predict("ring", 8, n, alpha, beta, gamma)
        assert predict("rd", 1 << 28, n, alpha, beta, gamma) > predict("ring", 1 << 28, n, alpha, beta, gamma)
    assert predict("naive", 1 << 20, 8, alpha, beta, gamma) > predict("ring", 1 << 20, 8, alpha, beta, gamma)


def test_a_tuning_file_sets_the_choice_per_size_and_dtype(tmp_path, monkeypatch):
    monkeypatch.delenv("NPDDP_TUNING", raising=False)
    comm = create("auto", one_rank_group(), tuning=str(tuning(tmp_path)))
    assert comm.source == f"tuning file {tmp_path / 't.json'}"
    picks = [comm.algorithm_for(n, np.float32) for n in (1, 4096, 4097, 1 << 20, (1 << 20) + 1)]
    assert picks == ["tree", "tree", "rd", "rd", "ring"]
    assert comm.algorithm_for(10, np.float16) == "naive"
    monkeypatch.setenv("NPDDP_TUNING", str(tuning(tmp_path, table={"*": [[None, "rabenseifner"]]})))
    assert create("auto", one_rank_group()).algorithm_for(5, "float64") == "rabenseifner"


@pytest.mark.parametrize("change, text", [
    ({"format": "other"}, "not an npddp tuning file"),
    ({"version": 99}, "version 99"),
    ({"world_size": 4}, "measured on 4 ranks, this job has 1"),
    ({"transport": "tcp"}, "over transport 'tcp', this job uses 'mpi'"),
    ({"table": {"float32": [[None, "rd"]]}}, "no '*' entry"),
    ({"table": {"*": [[10, "rd"]]}}, "ending with [null, algorithm]"),
    ({"table": {"*": [[10, "rd"], [5, "ring"], [None, "rd"]]}}, "max_bytes must be increasing"),
    ({"table": {"*": [[None, "fast"]]}}, "algorithms ['fast'] this job cannot run"),
    ({"table": {"complex": [[None, "rd"]], "*": [[None, "rd"]]}}, "unknown dtype 'complex'"),
])
def test_a_bad_tuning_file_falls_back_to_the_model_with_one_warning(tmp_path, change, text):
    path = tuning(tmp_path, **change)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        comm = create("auto", one_rank_group(), tuning=str(path))
    assert len(caught) == 1 and text in str(caught[0].message) and "using the cost model" in str(caught[0].message)
    assert comm.source == "model"


def test_missing_and_corrupt_files_fall_back_too(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    for path, text in ((tmp_path / "none.json", "cannot read it"), (broken, "Expecting")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            comm = create("auto", one_rank_group(), tuning=str(path))
        assert comm.source == "model" and len(caught) == 1 and text in str(caught[0].message)


def test_tuning_applies_to_auto_only():
    with pytest.raises(ValueError, match="tuning='x.json' applies to backend 'auto' only"):
        create("ring", one_rank_group(), tuning="x.json")


def test_the_tuner_merges_winners_into_steps_that_end_between_sizes():
    sizes = [1024, 4096, 16384, 65536, 262144]
    assert steps_from(sizes, ["rd", "rd", "tree", "ring", "ring"]) == [[8192, "rd"], [32768, "tree"], [None, "ring"]]
    assert steps_from(sizes[:1], ["ring"]) == [[None, "ring"]]
    table = {"*": steps_from(sizes, ["rd", "ring", "rd", "rd", "ring"])}
    check_table({"format": FORMAT, "version": VERSION, "transport": "mpi", "world_size": 2, "table": table}, "mpi", 2)
    assert set(a for _, a in table["*"]) <= set(ALGORITHMS)


def test_the_tuner_keeps_the_default_unless_another_wins_every_round():
    clear = {"ring": [1.0, 1.1, 1.05], "shm": [1.3, 1.4, 1.35]}
    assert decide(clear, "shm")[0] == "ring" and "faster than default shm in every round" in decide(clear, "shm")[1]
    overlap = {"ring": [1.0, 1.5, 1.05], "shm": [1.3, 1.4, 1.35]}  # faster by median, not in every round
    choice, why = decide(overlap, "shm")
    assert choice == "shm" and why.startswith("kept: within noise (ring")
    assert decide({"ring": [2.0, 2.0, 2.0], "shm": [1.0, 3.0, 1.1]}, "shm") == ("shm", "default fastest")
    for rounds in (clear, overlap):  # never a choice slower than the default by its median
        choice, _ = decide(rounds, "shm")
        assert sorted(rounds[choice])[1] <= sorted(rounds["shm"])[1]


def test_the_tuner_is_stable_once_best_and_default_vary_little():
    assert stable({"ring": [1.0, 1.01, 1.02], "shm": [2.0, 2.02, 2.01]}, "shm", 0.05)
    assert not stable({"ring": [1.0, 1.3, 1.02], "shm": [2.0, 2.02, 2.01]}, "shm", 0.05)  # the best is noisy
    assert not stable({"ring": [1.0, 1.0], "shm": [2.0, 2.0]}, "shm", 0.05)  # too few rounds


@pytest.mark.mpi(min_size=2)
def test_every_rank_makes_the_same_choice(world, tmp_path, assert_ranks_agree, assert_all_ranks):
    comm = create("auto", world.raw)
    names = [*ALGORITHMS, "shm", "hier", "mpi"]
    picks = np.array([names.index(comm.algorithm_for(1 << k, np.float32)) for k in range(0, 30, 3)])
    assert_ranks_agree(picks, world)
    assert_all_ranks(comm.source == "model", comm.source, world)


@pytest.mark.slow
def test_the_tuner_writes_a_table_auto_loads(tmp_path):
    out = tmp_path / "tuned.json"
    done = subprocess.run([sys.executable, "-m", "npddp.run", "--nproc", "2", "-m", "npddp.tune", "-b", "1K", "-e",
                           "16K", "--iters", "2", "--budget", "0.01", "--max-rounds", "3", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["transport"] == "tcp" and data["world_size"] == 2 and data["sizes"] == [1024, 4096, 16384]
    assert check_table(data, "tcp", 2, node=True) == data["table"] and "best" in done.stdout
    assert "shm" in done.stdout.splitlines()[1]  # both ranks on this machine: shared memory competes too
    assert "mpi" not in done.stdout.splitlines()[1].split()  # MPI's own all-reduce: over the MPI transport only
    assert len(data["notes"]) == 3 and all(line.split()[-len(n.split()):] == n.split()
                                            for line, n in zip(done.stdout.splitlines()[2:5], data["notes"]))
    assert all(w == "shm" or "faster than default shm in every round" in n for w, n in zip(data["winners"], data["notes"]))


@pytest.mark.parametrize("argv, message", [(["--max-rounds", "2"], "--max-rounds 2 is out of range"),
                                           (["--tolerance", "0"], "--tolerance 0.0 is out of range")])
def test_the_tuner_refuses_bad_round_options(argv, message, capsys):
    from npddp.tools.tune import parse_args
    with pytest.raises(SystemExit) as e:
        parse_args(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("kind, message", [("fifo", "is a FIFO, not a regular file"),
                                           ("source", "exists and is not an npddp tuning table")])
def test_the_tuner_refuses_an_out_path_it_would_destroy(tmp_path, kind, message, capsys):
    from npddp.tools.tune import parse_args
    out = tmp_path / "t.json"
    if kind == "fifo":
        os.mkfifo(out)
    else:
        out.write_text("print('a user file')\n")
    with pytest.raises(SystemExit) as e:
        parse_args(["--out", str(out)])
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert stat.S_ISFIFO(os.stat(out).st_mode) if kind == "fifo" else out.read_text() == "print('a user file')\n"


@pytest.mark.parametrize("size", [2, 3, 4, 8])
def test_across_nodes_the_model_takes_few_steps_small_and_the_pipelined_ring_beyond_one_chunk(size):
    steps = model_table("mpi", size, 1 << 20, across_nodes=True)
    assert steps[0][1] == "rd" and steps[-1] == [None, "ring"] and steps[-2][0] <= 1 << 20
    assert model_table("tcp", size, 1 << 20, across_nodes=True) == steps    # the network, not the transport, prices
    for nbytes in (1 << 10, 1 << 16, 1 << 22, 1 << 26):
        pick = next(a for limit, a in steps if limit is None or nbytes <= limit)
        assert network_time(pick, nbytes, size) == min(network_time(a, nbytes, size) for a in CANDIDATES)


@pytest.mark.parametrize("nodes, per_node", [(2, 2), (2, 4), (4, 2), (8, 2)])
def test_with_several_ranks_per_node_the_model_weighs_hier_against_flat_algorithms_sharing_a_link(nodes, per_node):
    size = nodes * per_node
    steps = model_table("mpi", size, across_nodes=True, per_node=per_node)
    assert "hier" in {a for _, a in steps}
    for k in range(10, 27, 2):
        pick = next(a for limit, a in steps if limit is None or 1 << k <= limit)
        flat = min(network_time(a, (1 << k) * (1 if a == "ring" else per_node), size) for a in CANDIDATES)
        assert (pick == "hier") == (hier_time(1 << k, size, per_node) <= flat), (k, pick)
    assert "hier" not in {a for _, a in model_table("mpi", size, across_nodes=True)}  # one rank per node: flat
    table = {"format": FORMAT, "version": VERSION, "transport": "mpi", "world_size": size,
             "table": {"*": [[4096, "rd"], [None, "hier"]]}}
    assert check_table(table, "mpi", size, hier=True)["*"][-1] == [None, "hier"]
    with pytest.raises(ValueError, match="hier"):
        check_table(table, "mpi", size)


@pytest.mark.mpi(min_size=2)
def test_auto_composes_hier_across_nodes_with_several_ranks_each(world, tmp_path, assert_all_ranks):
    """Pretended nodes of equal size > 1 (NPDDP_RANKS_PER_NODE): hier's composition is a candidate, and its calls
    interleave with flat ones in flight; elsewhere auto offers it nowhere."""
    import os
    per_node = int(os.environ.get("NPDDP_RANKS_PER_NODE") or world.size)
    composed = 1 < per_node < world.size and world.size % per_node == 0
    path = tmp_path / f"t{world.rank}.json"
    path.write_text(json.dumps({"format": FORMAT, "version": VERSION, "transport": "tcp" if world.tcp else "mpi",
                               "world_size": world.size, "table": {"*": [[4096, "rd"], [None, "hier"]]}}))
    comm = create("auto", world.fresh(), tuning=str(path) if composed else None)
    assert_all_ranks(("hier" in comm.algorithms) == composed and comm.per_node == (per_node if composed else 1),
                     f"per_node {comm.per_node}, candidates {sorted(comm.algorithms)}", world)
    if not composed:
        return
    assert_all_ranks(comm.source.startswith("tuning file") and comm.algorithm_for(1 << 20, np.float32) == "hier",
                     comm.source, world)
    rng = np.random.default_rng(world.rank)
    sizes = (10, 70_001, 1000, 300_000, 3)                # rd, hier, rd, hier, rd (float64: 8 bytes each)
    data = [rng.standard_normal(n) for n in sizes]
    # every rank's inputs, rebuilt from the seeds in the same order they were drawn
    want = [np.zeros(n) for n in sizes]
    for r in range(world.size):
        other = np.random.default_rng(r)
        for i, n in enumerate(sizes):
            want[i] += other.standard_normal(n)
    bufs = [d.copy() for d in data]
    handles = [comm.iallreduce(b) for b in bufs]
    comm.barrier()                                         # waits for the calls in flight first
    for h in reversed(handles):
        h.wait()
    ok = all(np.allclose(b, w, rtol=1e-12, atol=1e-12) for b, w in zip(bufs, want))
    blocking = [comm.allreduce(d.copy(), op="avg") for d in data]
    ok = ok and all(np.allclose(b, w / world.size, rtol=1e-12, atol=1e-12) for b, w in zip(blocking, want))
    assert_all_ranks(ok, "wrong sums from interleaved rd and hier calls", world)


_CANDIDATES_SCRIPT = r"""
import os
import numpy as np
from npddp.comm import create
comm = create("auto")
buf = np.arange(300_000, dtype=np.float64) + comm.rank
comm.allreduce(buf)
ok = np.array_equal(buf, 4 * np.arange(300_000.0) + 6)
line = f"RESULT {comm.rank} {comm.per_node} {'hier' in comm.algorithms} {comm.algorithm_for(buf.nbytes, buf.dtype)} {ok}"
os.write(1, (line + "\n").encode())  # one write per line: the ranks share stdout
"""


@pytest.mark.parametrize("auto_shm", ["1", "0"])
@pytest.mark.slow
def test_pretended_nodes_of_two_ranks_give_auto_hier_unless_shared_memory_is_off(tmp_path, auto_shm):
    """4 ranks as 2 nodes x 2 (NPDDP_RANKS_PER_NODE=2): auto composes hier; NPDDP_AUTO_SHM=0 keeps it flat."""
    import os
    script = tmp_path / "candidates.py"
    script.write_text(_CANDIDATES_SCRIPT)
    env = {**os.environ, "NPDDP_RANKS_PER_NODE": "2", "NPDDP_AUTO_SHM": auto_shm}
    done = subprocess.run([sys.executable, "-m", "npddp.run", "--nproc", "4", str(script)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = sorted(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("RESULT"))
    composed = auto_shm == "1"
    want = ["2", "True", "hier"] if composed else ["1", "False", "ring"]
    assert rows == [[str(r), *want, "True"] for r in range(4)], done.stdout
