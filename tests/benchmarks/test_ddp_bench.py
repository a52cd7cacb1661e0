"""Tests of benchmarks/ddp.py: options, combinations, the row arithmetic, sweeps and their dumps.

Serial tests run the benchmark on ``MPI.COMM_SELF``; the MPI tests run it in-process on
``COMM_WORLD`` with the tiny model and a few steps, and check every rank's view; one serial
test launches the script under ``mpirun -n 2`` to see bad arguments end every rank with 2.
"""

import itertools
import json
import os
import shutil
import stat
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

from benchmarks import _common as bc
from benchmarks import ddp as bd
from benchmarks import results
from benchmarks.columns import KINDS
from npddp.parallel.ddp import SYNCS
from npddp.nn import mlp
from tests.helpers.bench import DDP_TINY as TINY
from tests.helpers.jobs import ROOT, mpirun, outside_env

SCRIPT = ROOT / "benchmarks" / "ddp.py"
# 0.001 MiB holds no two tiny-model tensors (one bucket each); 1000 MiB holds them all
BUCKETS = ["--bucket-mb", "0.001,1000"]



def read_dump(path):
    """(root attributes, the table as a DataFrame)."""
    return results.read_meta(path), results.read_table(path)


def expected_ops(sync, bucket_mb, tensors):
    """All-reduce calls per step for the tiny model with the buckets of BUCKETS."""
    if sync == "per_param" or (sync in bd.BUCKETED and bucket_mb < 1):
        return tensors
    return 1


# ----------------------------------------------------------------------------- options

def test_model_sizes_are_as_documented():
    for name, (low, high, tensors) in {"tiny": (0.9e6, 1.2e6, 6), "small": (4.5e6, 5.5e6, 12),
                                       "medium": (15e6, 25e6, 12)}.items():
        count = bc.param_count(name)
        assert low <= count <= high, (name, count)
        assert f"{count:,}" in bd.__doc__
        if name != "medium":  # building it takes a second; its count follows from the same formula
            model = mlp(bc.IN_FEATURES, bc.MODELS[name], bc.OUT_FEATURES, seed=0)
            assert model.num_parameters() == count and len(model.parameters()) == tensors


def test_combinations_sweep_bucket_caps_only_where_they_matter():
    for k in range(1, len(SYNCS) + 1):
        for syncs in itertools.combinations(SYNCS, k):
            for caps in ("25", "1,25", "0.5,4,64"):
                argv = ["--models", "tiny,medium", "--syncs", ",".join(syncs), "--backends", "mpi,ring",
                        "--bucket-mb", caps]
                todo = bd.combos(bd.parse_config(argv))
                ncaps = len(caps.split(","))
                per_model = sum(ncaps if s in bd.BUCKETED else 1 for s in syncs) * 2
                assert len(todo) == 2 * per_model and len(set(todo)) == len(todo)
                for c in todo:
                    assert (c.bucket_mb > 0) == (c.sync in bd.BUCKETED), c


def test_transports_pair_every_hand_written_backend_with_each_and_mpi_with_mpi_only():
    todo = bd.combos(bd.parse_config(["--models", "tiny", "--syncs", "flat", "--backends", "mpi,ring,auto",
                                      "--transports", "mpi,tcp", "--no-comm"]))
    assert [(c.backend, c.transport) for c in todo] == [
        ("mpi", "mpi"), ("ring", "mpi"), ("ring", "tcp"), ("auto", "mpi"), ("auto", "tcp"), ("none", "none")]
    only_tcp = bd.combos(bd.parse_config(["--models", "tiny", "--syncs", "flat", "--backends", "mpi,ring",
                                          "--transports", "tcp"]))
    assert [(c.backend, c.transport) for c in only_tcp] == [("ring", "tcp"), ("mpi", "mpi")]
    assert bd.parse_config([]).progress == "caller" and bd.parse_config(["--progress", "thread"]).progress == "thread"


def test_defaults_differ_between_breakdown_and_weak_scaling():
    cfg = bd.parse_config([])
    assert cfg.models == ("tiny", "small", "medium") and cfg.syncs == SYNCS
    assert cfg.backends == ("mpi", "ring") and cfg.bucket_mb == (1.0, 25.0) and not cfg.weak_scaling
    assert cfg.repeats == 1 and not cfg.no_comm and all(c.backend != "none" for c in bd.combos(cfg))
    ws = bd.parse_config(["--weak-scaling"])
    assert ws.models == ("small",) and ws.syncs == ("overlap",) and ws.bucket_mb == (25.0,) and ws.weak_scaling
    assert ws.repeats == 3
    nc = bd.combos(bd.parse_config(["--no-comm", "--models", "tiny", "--syncs", "flat"]))
    assert [c.backend for c in nc] == ["mpi", "ring", "none"]  # the ceiling interleaved with the backends
    assert bd.parse_config(["--weak-scaling", "--models", "tiny"]).models == ("tiny",)


@pytest.mark.parametrize("argv, message", [
    (["--models", "tiny,huge"], "unknown name 'huge'; valid: tiny, base, small, medium"),
    (["--syncs", "flat,flat"], "names something twice"),
    (["--syncs", "async"], "unknown name 'async'"),
    (["--backends", "nccl"], "unknown name 'nccl'"),
    (["--bucket-mb", "0"], "distinct finite numbers > 0"),
    (["--bucket-mb", "1,x"], "expected comma-separated numbers"),
    (["--batch", "0"], "must be >= 1, got 0"),
    (["--steps", "two"], "expected an integer, got 'two'"),
    (["--warmup", "-1"], "must be >= 0, got -1"),
    (["--dtype", "float16"], "invalid choice: 'float16'"),
    (["--transports", "udp"], "unknown name 'udp'; valid: mpi, tcp"),
    (["--progress", "eager"], "invalid choice: 'eager'"),
    (["--repeats", "2"], "--repeats applies to --weak-scaling only"),
    (["--weak-scaling", "--repeats", "0"], "must be >= 1, got 0"),
    (["--rounds", "0"], "must be >= 1, got 0"),
    (["--steps", "3", "--rounds", "4"], "--rounds 4 exceeds --steps 3; valid: 1 to 3"),
    (["--weak-scaling", "--bare"], "--bare applies to the breakdown only"),
])
def test_bad_arguments_exit_2_with_a_clear_message(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        bd.parse_config(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        bd.parse_config(argv, verbose=False)  # ranks other than 0: same exit, nothing printed
    assert e.value.code == 2
    assert capsys.readouterr() == ("", "")


def test_rounds_default_to_five_or_the_step_count():
    assert bd.parse_config([]).rounds == 5 and bd.parse_config(["--steps", "40"]).rounds == 5
    assert bd.parse_config(["--steps", "3"]).rounds == 3 and bd.parse_config(["--rounds", "2"]).rounds == 2


def test_rounds_split_the_steps_evenly_and_in_order():
    for steps in range(1, 25):
        for rounds in range(1, steps + 1):
            split = bd.round_steps(steps, rounds)
            counts = [count for _, count in split]
            assert len(split) == rounds and sum(counts) == steps and max(counts) - min(counts) <= 1
            assert [first for first, _ in split] == [sum(counts[:r]) for r in range(rounds)]


def test_backends_of_one_group_take_turns_round_by_round(monkeypatch):
    """Every round runs each backend of a (model, sync, cap) in turn; warm-up steps only in the first."""
    calls = []

    def fake_steps(ddp, opt, x, y, harness, steps, warmup):
        calls.append((ddp.comm.name, steps, warmup))
        return np.full((steps, len(bd.FIELDS)), float(len(calls)))

    monkeypatch.setattr(bd, "train_steps", fake_steps)
    cfg = bd.parse_config(["--models", "tiny", "--syncs", "flat,overlap", "--bucket-mb", "25", "--backends",
                           "mpi,ring", "--no-comm", "--steps", "7", "--rounds", "3", "--warmup", "2"])
    todo = bd.combos(cfg)
    records = bd.run_combos(cfg, todo, MPI.COMM_SELF)
    per_group = [(name, count, 2 if r == 0 else 0) for r, count in enumerate((3, 2, 2))
                 for name in ("mpi", "ring", "none")]
    assert calls == per_group * 2  # flat's three backends in turns, then overlap's
    for i, c in enumerate(todo):  # each combination's steps, filled round by round in order
        group = i // 3
        expected = [9 * group + 3 * r + i % 3 + 1 for r, count in enumerate((3, 2, 2)) for _ in range(count)]
        assert records[i, :, 0].tolist() == expected, c


def test_scaling_sizes_are_powers_of_two_then_the_world():
    for k in range(1, 40):
        sizes = bd.scaling_sizes(k)
        assert sizes[0] == 1 and sizes[-1] == k and sizes == sorted(set(sizes))
        assert all(n & (n - 1) == 0 for n in sizes[:-1]) and sizes[-2:][0] * 2 >= k


# ----------------------------------------------------------------------------- row arithmetic

def test_rows_take_the_slowest_rank_for_the_step_and_the_mean_for_its_parts():
    rng = np.random.default_rng(0)
    f = {name: i for i, name in enumerate(bd.FIELDS)}
    todo = [bd.Combo("tiny", "overlap", "mpi", 25.0), bd.Combo("small", "flat", "ring", 0.0),
            bd.Combo("small", "flat", "none", 0.0)]
    for n, steps in itertools.product((1, 2, 3, 4), (1, 2, 5)):
        ranks = np.zeros((n, len(todo), steps, len(bd.FIELDS)))  # (ranks, combos, steps, fields)
        parts = rng.uniform(0.001, 0.01, size=(n, len(todo), steps, 4))  # forward, compute-backward, issue, exposed
        opt = rng.uniform(0.001, 0.01, size=(n, len(todo), steps))
        ranks[..., f["forward_s"]] = parts[..., 0]
        ranks[..., f["comm_issue_s"]] = parts[..., 2]
        ranks[..., f["backward_s"]] = parts[..., 1] + parts[..., 2]
        ranks[..., f["comm_exposed_s"]] = parts[..., 3]
        ranks[..., f["optimizer_s"]] = opt
        ranks[..., f["total_s"]] = parts.sum(axis=-1) + opt + rng.uniform(0, 0.001, size=opt.shape)
        ranks[..., f["comm_calls"]] = 3
        ranks[..., f["comm_bytes"]] = 4000
        rows = bd.breakdown_rows(todo, ranks.max(axis=0), ranks.mean(axis=0), n, 8)
        for c, row in enumerate(rows):
            total = ranks[:, c, :, f["total_s"]].max(axis=0)  # (steps,) slowest rank per step
            assert row["step_ms"] == pytest.approx(np.median(total) * 1e3)
            order = [row[k] for k in ("step_ms_min", "step_ms_p10", "step_ms", "step_ms_p90", "step_ms_max")]
            assert order == sorted(order)
            assert row["step_ms_min"] == pytest.approx(total.min() * 1e3) and row["steps"] == steps
            comm = (parts[:, c, :, 2] + parts[:, c, :, 3]).mean(axis=0)
            assert row["comm_ms"] == pytest.approx(np.median(comm) * 1e3)
            assert row["comm_issued_ms"] == pytest.approx(np.median(parts[:, c, :, 2].mean(axis=0)) * 1e3)
            assert row["comm_exposed_ms"] == pytest.approx(np.median(parts[:, c, :, 3].mean(axis=0)) * 1e3)
            assert row["backward_ms"] == pytest.approx(np.median(parts[:, c, :, 1].mean(axis=0)) * 1e3)
            compute = (parts[:, c, :, 0] + parts[:, c, :, 1] + opt[:, c]).mean(axis=0)
            assert row["compute_ms"] == pytest.approx(np.median(compute) * 1e3)
            assert row["comm_fraction"] == pytest.approx(row["comm_ms"] / row["step_ms"])
            assert row["samples_per_s"] == pytest.approx(n * 8 / np.median(total))
            silent = todo[c].backend == "none"
            assert (row["num_comm_ops"], row["comm_bytes"]) == ((0, 0) if silent else (3, 4000))
            assert row["world_size"] == n and row["transport"] == ("none" if silent else "mpi")
            assert row["params"] == bc.param_count(todo[c].model) and row["bucket_mb"] == todo[c].bucket_mb
        assert np.isnan(rows[0]["ddp_efficiency"])  # no ceiling measured for tiny overlap
        assert rows[1]["ddp_efficiency"] == pytest.approx(rows[2]["step_ms"] / rows[1]["step_ms"])
        assert rows[2]["ddp_efficiency"] == 1.0


def test_weak_scaling_efficiency_shares_one_reference_per_repeat():
    rows = []
    for repeat, base in ((0, 100.0), (1, 50.0)):  # the second repeat ran on a machine twice as slow
        for n in (1, 2, 4):
            for backend, sps in (("mpi", 0.9 * base), ("ring", 1.1 * base), ("none", base)):
                rows.append({"model": "tiny", "sync": "flat", "bucket_mb": 0.0, "world_size": n, "repeat": repeat,
                             "backend": backend, "samples_per_s": sps * n * (0.8 if n > 1 else 1.0),
                             "step_ms": 1e3 / sps})
    bd.add_efficiency(rows)
    for r in rows:
        base = 100.0 if r["repeat"] == 0 else 50.0  # the median of the three one-rank figures
        assert r["efficiency"] == pytest.approx(r["samples_per_s"] / (r["world_size"] * base))
        ceiling = 1e3 / (100.0 if r["repeat"] == 0 else 50.0)
        assert r["ddp_efficiency"] == pytest.approx(ceiling / r["step_ms"])
    one = [r["efficiency"] for r in rows if r["world_size"] == 1]
    assert sorted(set(np.round(one, 6))) == [0.9, 1.0, 1.1]  # one reference: the backends keep their differences


# ----------------------------------------------------------------------------- one rank

def check_breakdown(path, argv, n):
    """Problems found in a breakdown dump (empty when it matches the sweep's combinations)."""
    cfg = bd.parse_config(argv, verbose=False)
    todo = bd.combos(cfg)
    problems = results.check(path)
    if problems:
        return problems
    attrs, rows = read_dump(path)

    def expect(ok, what):
        if not ok:
            problems.append(what)
    expect(attrs["kind"] == "ddp_breakdown" and attrs["schema_version"] == results.SCHEMA_VERSION, "kind")
    expect(attrs["world_size"] == n and attrs["backend"] == ",".join(cfg.backends), "world size / backend")
    expect(json.loads(attrs["argv"]) == argv and attrs["config.steps"] == cfg.steps, "argv / config")
    expect(list(rows.columns) == list(KINDS["ddp_breakdown"].names), "columns")
    expect(len(rows) == len(todo), "one row per combination")
    got = list(zip(rows["model"], rows["sync"], rows["backend"], rows["bucket_mb"], rows["transport"]))
    expect(got == [(c.model, c.sync, c.backend, c.bucket_mb, c.transport) for c in todo], f"combinations {got}")
    tensors = len(mlp(bc.IN_FEATURES, bc.MODELS["tiny"], bc.OUT_FEATURES).parameters())
    for i, c in enumerate(todo):
        moves = n > 1 and c.backend not in ("none", "bare")
        ops = expected_ops(c.sync, c.bucket_mb, tensors) if moves else 0
        expect(rows["num_comm_ops"][i] == ops, f"{c}: {rows['num_comm_ops'][i]} ops, expected {ops}")
        expect(rows["comm_bytes"][i] == (bc.param_count("tiny") * 4 if moves else 0), f"{c}: comm_bytes")
        expect(0 <= rows["comm_fraction"][i] <= 1, f"{c}: comm_fraction {rows['comm_fraction'][i]}")
        expect(rows["samples_per_s"][i] == pytest.approx(n * cfg.batch / rows["step_ms"][i] * 1e3), "samples/s")
        expect(cfg.no_comm == np.isfinite(rows["ddp_efficiency"][i]), f"{c}: ddp_efficiency")
        expect(cfg.bare == np.isfinite(rows["bare_efficiency"][i]), f"{c}: bare_efficiency")
        if cfg.bare:  # step(bare) of the same model, sync and cap over this row's step
            bare = rows[(rows["backend"] == "bare") & (rows["model"] == c.model) & (rows["sync"] == c.sync)
                        & (rows["bucket_mb"] == c.bucket_mb)]["step_ms"]
            expect(len(bare) == 1 and rows["bare_efficiency"][i] == pytest.approx(float(bare.iloc[0]) /
                                                                                  rows["step_ms"][i]), f"{c}: bare")
    return problems


def test_one_rank_sweep_prints_the_table_and_writes_the_layout(tmp_path, capsys):
    path = tmp_path / "ddp.h5"
    argv = TINY + BUCKETS + ["--backends", "mpi", "--no-comm", "--bare", "--out", str(path)]
    assert bd.main(argv, mpi_comm=MPI.COMM_SELF) == 0
    assert check_breakdown(path, argv, 1) == []
    out = capsys.readouterr().out
    lines = out.splitlines()
    at = [i for i, line in enumerate(lines) if line.split()[:1] == ["model"]]
    assert len(at) == 1, out
    header = lines[at[0]].split()
    for head in ("step_ms", "p10", "p90", "fwd", "bwd", "issued", "exposed", "opt", "comm%", "ops", "samples/s",
                 "ddp_eff", "bare_eff"):
        assert head in header, head
    table = [line.split() for line in lines[at[0] + 1:at[0] + 1 + len(bd.combos(bd.parse_config(argv)))]]
    assert [(r[0], r[1], r[2], float(r[3])) for r in table] == [
        (c.model, c.sync, c.backend, c.bucket_mb) for c in bd.combos(bd.parse_config(argv))]
    assert all(len(r) == len(header) for r in table)
    assert os.listdir(tmp_path) == ["ddp.h5"]


def test_bad_out_directory_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bd.main(TINY + ["--out", str(tmp_path / "missing" / "x.h5")], mpi_comm=MPI.COMM_SELF)
    assert e.value.code == 2 and "does not exist" in capsys.readouterr().err


def test_a_fifo_at_out_exits_2_and_is_left_alone(tmp_path, capsys):
    os.mkfifo(tmp_path / "x.h5")
    with pytest.raises(SystemExit) as e:
        bd.main(TINY + ["--out", str(tmp_path / "x.h5")], mpi_comm=MPI.COMM_SELF)
    assert e.value.code == 2 and "is a FIFO, not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO(os.stat(tmp_path / "x.h5").st_mode)


def test_script_bad_arguments_exit_2_on_every_rank_without_hanging():
    done = subprocess.run([mpirun(), "-n", "2", sys.executable, str(SCRIPT), "--syncs", "overlap,bogus"],
                          capture_output=True, text=True, timeout=120, env=outside_env(), cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("ddp.py: error: argument --syncs: unknown name 'bogus'") == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


# ----------------------------------------------------------------------------- MPI

@pytest.mark.mpi(min_size=2)
@pytest.mark.needs_mpi  # the benchmarks time over mpi4py communicators
def test_records_reduce_to_the_max_and_the_mean_over_ranks(assert_ranks_agree):
    comm = MPI.COMM_WORLD
    n, rank = comm.Get_size(), comm.Get_rank()
    records = np.full((3, 2, len(bd.FIELDS)), rank + 1.0)
    worst, mean = bd.reduce_records(records, comm)
    assert_ranks_agree(np.stack([worst, mean]))
    assert np.all(worst == n) and np.allclose(mean, (n + 1) / 2) and np.all(records == rank + 1.0)


@pytest.mark.mpi(min_size=2)
@pytest.mark.needs_mpi  # the benchmarks time over mpi4py communicators
@pytest.mark.parametrize("extra", [["--bare"], ["--transports", "mpi,tcp", "--progress", "thread"]])
@pytest.mark.slow
def test_breakdown_sweep_dump_matches_the_combinations(assert_all_ranks, agreed_tmpdir, extra):
    comm = MPI.COMM_WORLD
    directory = agreed_tmpdir
    path = directory / "ddp.h5"
    argv = TINY + BUCKETS + ["--no-comm", "--out", str(path), *extra]
    rc = bd.main(argv, mpi_comm=comm)
    comm.Barrier()
    problems = check_breakdown(path, argv, comm.Get_size()) if comm.Get_rank() == 0 else []
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(directory)
    assert_all_ranks(rc == 0 and not problems, f"rc={rc}, problems: {problems}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.needs_mpi  # the benchmarks time over mpi4py communicators
@pytest.mark.slow
def test_weak_scaling_runs_each_size_and_repeat(assert_all_ranks, agreed_tmpdir):
    comm = MPI.COMM_WORLD
    n = comm.Get_size()
    directory = agreed_tmpdir
    path = directory / "ws.h5"
    argv = ["--weak-scaling"] + TINY + ["--syncs", "flat", "--backends", "mpi,ring", "--no-comm", "--repeats", "2",
                                        "--out", str(path)]
    rc = bd.main(argv, mpi_comm=comm)
    comm.Barrier()
    problems = []
    if comm.Get_rank() == 0:
        problems = results.check(path)
        attrs, rows = read_dump(path)
        todo = bd.combos(bd.parse_config(argv))
        sizes = bd.scaling_sizes(n)
        if attrs["kind"] != "weak_scaling" or attrs["world_size"] != n:
            problems.append(f"attrs {attrs['kind']} {attrs['world_size']}")
        if list(zip(rows["repeat"], rows["world_size"], rows["backend"])) != [
                (r, k, c.backend) for r in range(2) for k in sizes for c in todo]:
            problems.append(f"rows {list(zip(rows['repeat'], rows['world_size']))}")
        for i, k in enumerate(rows["world_size"]):
            ones = rows[(rows["world_size"] == 1) & (rows["repeat"] == rows["repeat"][i])]["samples_per_s"]
            if rows["efficiency"][i] != pytest.approx(rows["samples_per_s"][i] / (k * np.median(ones))):
                problems.append(f"row {i}: efficiency")
            if rows["step_ms"][i] != pytest.approx(k * 4 / rows["samples_per_s"][i] * 1e3):
                problems.append(f"row {i}: step_ms")
        if not (rows[rows["backend"] == "none"]["ddp_efficiency"] == 1.0).all():
            problems.append("the ceiling's own DDP efficiency is not 1.0")
        shutil.rmtree(directory)
    assert_all_ranks(rc == 0 and not problems, f"rc={rc}, problems: {problems}")


def test_a_sweep_says_where_it_is_after_every_setting(capsys):
    argv = TINY + BUCKETS + ["--syncs", "flat,bucketed", "--backends", "mpi", "--no-comm"]
    assert bd.main(argv, mpi_comm=MPI.COMM_SELF) == 0
    lines = capsys.readouterr().out.splitlines()
    progress = [line for line in lines if line.startswith("# measured ")]
    assert [line.split(":")[0] for line in progress] == [
        "# measured tiny flat (2 backends)", "# measured tiny bucketed 0.001 MiB (2 backends)",
        "# measured tiny bucketed 1000 MiB (2 backends)"], lines
    assert [line.split(": ")[1].split(",")[0] for line in progress] == ["1/3 settings", "2/3 settings", "3/3 settings"]
    table = next(i for i, line in enumerate(lines) if line.split()[:1] == ["model"])
    assert lines.index(progress[-1]) < table          # printed while measuring, before the table
