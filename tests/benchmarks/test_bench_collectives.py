"""Tests of benchmarks/allreduce.py (and its exact data, benchmarks/_exact.py): argument errors,
the sweep, its nccl-tests-style text, its HDF5 dump and CSV.

Serial tests run the sweep on ``MPI.COMM_SELF``; the MPI tests run it in-process on
``COMM_WORLD`` and check that every rank agrees; one serial test launches the script under
``mpirun -n 2`` to see bad arguments end every rank with exit status 2.
"""

import csv
import json
import os
import shutil

import numpy as np
import pytest
from mpi4py import MPI

import npddp.comm as npcomm
from benchmarks import _common as bc
from benchmarks import _exact as ex
from benchmarks import collectives as ar
from benchmarks import results
from benchmarks._raw import RawMPI

TINY = ["-b", "4", "-e", "1K", "-f", "7", "--iters", "4", "--warmup", "2", "--budget", "0.001"]


def _simulate(inputs, op, order):
    """Reduce the ranks' arrays one at a time in ``order``, in their own dtype."""
    acc = inputs[order[0]].copy()
    for r in order[1:]:
        npcomm.OPS[op](acc, inputs[r], out=acc)
    return acc


@pytest.mark.parametrize("dtype", npcomm.DTYPES)
def test_check_data_reduces_exactly_in_any_order(dtype):
    rng = np.random.default_rng(1)
    for op in npcomm.OPS:
        for n in (1, 2, 3, 4, 7, 64) + ((1024,) if dtype == "float16" and op == "sum" else ()):
            f = ex.data_table(op, dtype, n)
            count = 2 * f.size + 5
            inputs = [ex.periodic(f, r, count, dtype) for r in range(n)]
            assert all(x.dtype == np.dtype(dtype) and x.shape == (count,) for x in inputs)
            expected = ex.periodic(ex.reduced_table(f, op, n), 0, count, dtype)
            for order in (list(range(n)), list(range(n))[::-1], list(rng.permutation(n))):
                assert np.array_equal(_simulate(inputs, op, order), expected), (op, n, order)
            if f.size > 1:  # the data varies along the vector, so a shifted block is seen
                assert np.unique(inputs[0]).size > 1


def test_check_data_sees_a_block_shifted_by_any_block_size():
    f = ex.data_table("sum", "float32", 4)
    data = ex.periodic(f, 0, 4096, "float32")
    for shift in range(1, 1021):
        assert not np.array_equal(data[shift:], data[:-shift]), shift


def test_block_matches_array_split():
    for count in (0, 1, 3, 7, 10, 64):
        for n in (1, 2, 3, 4):
            parts = np.array_split(np.arange(count), n)
            for rank in range(n):
                lo, hi = ex.block(count, n, rank)
                assert np.array_equal(np.arange(lo, hi), parts[rank])


def test_sizes_round_to_whole_elements_and_drop_duplicates():
    cfg = ar.parse_config(["-b", "12", "-e", "100", "-f", "2", "--dtype", "float64"])
    assert ar.sizes(cfg, 2).tolist() == [1, 3, 6, 12]  # 12, 24, 48, 96 bytes, rounded down to whole float64s
    cfg = ar.parse_config(["-b", "8", "-e", "100", "-f", "3", "--dtype", "float32", "--collective", "allgather"])
    assert ar.sizes(cfg, 3).tolist() == [6, 18]  # 8 B -> 2 -> 0 (dropped); 24 B -> 6; 72 B -> 18
    cfg = ar.parse_config(["-b", "8", "-e", "256M"])
    counts = ar.sizes(cfg, 2)
    assert counts[0] == 2 and counts[-1] == 64 << 20 and np.all(counts[1:] == 2 * counts[:-1])


@pytest.mark.parametrize("argv, message", [
    (["--backends", "mpi,bogus"], "unknown backend 'bogus'"),
    (["--backends", "mpi,mpi"], "names a backend twice"),
    (["-b", "1M", "-e", "1K"], "is larger than -e"),
    (["-b", "2", "--dtype", "float32"], "smaller than one float32 element"),
    (["--dtype", "float8"], "invalid choice: 'float8'"),
    (["--op", "avg"], "invalid choice: 'avg'"),
    (["--collective", "allgather", "--op", "max"], "--op applies to allreduce and reduce_scatter"),
    (["-f", "1"], "factor must be an int >= 2"),
    (["-e", "12Q"], "bad size '12Q'"),
    (["--iters", "0"], "must be >= 1"),
    (["--budget", "0"], "--budget must be > 0"),
    (["-b", "1T", "-e", "1T"], "-e/--maxbytes 1T: a sweep to 1T needs about 3 buffers of that size on each rank"),
    (["-e", "1T", "-f", "4"], "a sweep to 512G needs about 3 buffers"),
])
def test_bad_arguments_exit_2_with_a_clear_message(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        ar.parse_config(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        ar.parse_config(argv, verbose=False)  # ranks other than 0: same exit, nothing printed
    assert e.value.code == 2
    assert capsys.readouterr() == ("", "")


def test_op_is_none_for_collectives_that_do_not_reduce():
    assert ar.parse_config(["--collective", "broadcast"]).op == "none"
    assert ar.parse_config(["--collective", "reduce_scatter"]).op == "sum"
    assert ar.parse_config(["--op", "max"]).op == "max"


# ----------------------------------------------------------------------------- checking on one rank

class Faulty:
    """A communicator that delegates to the mpi backend and then spoils one thing."""

    def __init__(self, inner, fault):
        self._inner, self._fault = inner, fault
        self.rank, self.size, self.name = inner.rank, inner.size, "faulty"

    def barrier(self):
        self._inner.barrier()

    def allreduce(self, buf, op="sum", out=None):
        if self._fault == "ignore_out" and out is not None:
            return out
        result = self._inner.allreduce(buf, op, out=out)
        if self._fault == "clobber_input" and out is not None:
            buf[-1] += 1
        elif self._fault == "bump":
            result[result.size // 2] += 1
        return result

    def broadcast(self, buf, root=0):
        self._inner.broadcast(buf, root)
        if self._fault == "bump":
            buf[0] += 1
        return buf

    def allgather(self, buf):
        out = self._inner.allgather(buf)
        if self._fault == "bump":
            out[0, -1] += 1
        return out

    def reduce_scatter(self, buf, op="sum"):
        out = self._inner.reduce_scatter(buf, op)
        if self._fault == "bump":
            out[0] += 1
        return out

    def alltoall(self, buf):
        out = self._inner.alltoall(buf)
        if self._fault == "bump":
            out[0, 0] += 1
        elif self._fault == "clobber_input":
            buf[-1, -1] += 1
        return out


CASES = [(c, p) for c in bc.COLLECTIVES for p in ar.PLACES[c]]


@pytest.mark.parametrize("collective, place", CASES)
def test_check_counts_zero_for_every_backend_and_catches_faults(collective, place):
    dtype, op = "float32", ("sum" if collective in ar.REDUCING else "none")
    comms = [npcomm.create(name, MPI.COMM_SELF) for name in npcomm.BACKENDS if bc.offered(collective)]
    for comm in [RawMPI(MPI.COMM_SELF), *comms]:   # MPI's own call in a bare loop checks as every backend does
        run, check = ex.kernel(comm, collective, place, 10, dtype, op)
        run()
        run()  # timed iterations may leave anything in the buffers; the check starts afresh
        assert check() == 0, comm.name
    inner = npcomm.create("mpi", MPI.COMM_SELF) if bc.offered(collective) else RawMPI(MPI.COMM_SELF)
    assert ex.kernel(Faulty(inner, "bump"), collective, place, 10, dtype, op)[1]() == 1
    if place == "outofplace" and collective == "allreduce":
        assert ex.kernel(Faulty(inner, "ignore_out"), collective, place, 10, dtype, op)[1]() == 10
    if place == "outofplace" and collective in ("allreduce", "alltoall"):
        assert ex.kernel(Faulty(inner, "clobber_input"), collective, place, 10, dtype, op)[1]() == 1


def test_measure_times_a_bounded_number_of_iterations():
    calls = []
    times, wrong = ar.measure(lambda: calls.append(1), lambda: 5, MPI.COMM_SELF, iters=20, warmup=3, budget=10.0)
    assert times.shape == (20,) and np.all(times >= 0) and wrong == 5
    assert len(calls) == 1 + 2 + 20  # first warm-up sizes the run, two more, then the timed ones
    slow = lambda: __import__("time").sleep(0.02)  # noqa: E731
    times, _ = ar.measure(slow, lambda: 0, MPI.COMM_SELF, iters=20, warmup=5, budget=0.03)
    assert times.shape == (ar.MIN_ITERS,) and np.all(times >= 0.02)


@pytest.mark.parametrize("calls", [1, 3, 8])
def test_measure_with_several_calls_per_iteration_reports_the_time_of_one(calls):
    count = []
    times, _ = ar.measure(lambda: count.append(1), lambda: 0, MPI.COMM_SELF, iters=4, warmup=2, budget=10.0,
                          calls=calls)
    assert times.shape == (4,) and len(count) == calls * (1 + 1 + 4)
    slow = lambda: __import__("time").sleep(0.01)  # noqa: E731
    times, _ = ar.measure(slow, lambda: 0, MPI.COMM_SELF, iters=50, warmup=1, budget=0.1, calls=calls)
    # each iteration is `calls` sleeps; the budget counts whole iterations, the times one call each
    assert np.all(times >= 0.01) and np.all(times < 0.01 * 3) and ar.MIN_ITERS <= times.size <= max(ar.MIN_ITERS, 10 // calls)
    assert ar.parse_config(["--calls", str(calls)], verbose=False).calls == calls


def check_dump(path, argv, n, collective="allreduce", dtype="float32"):
    """Problems found in a sweep dump (empty when it matches what the sweep ran)."""
    problems = []

    def expect(ok, what):
        if not ok:
            problems.append(what)
    cfg = ar.parse_config(argv)
    counts = ar.sizes(cfg, n)
    a, df = results.read_meta(path), results.read_table(path)
    raw = results.read_raw(path, "time_s")
    expect(a["kind"] == "allreduce_sweep" and a["collective"] == collective and a["dtype"] == dtype, "kind")
    expect(a["world_size"] == n and a["backends"] == list(cfg.backends), "world size / backends")
    expect(json.loads(a["argv"]) == argv and json.loads(a["config"])["iters"] == cfg.iters, "argv/config")
    groups = ar.groups(cfg)
    expect(len(df) == counts.size * len(groups), f"{len(df)} rows")
    want = [(int(c), g.backend, g.transport, g.place) for c in counts for g in groups]
    expect(list(zip(df["count"], df["backend"], df["transport"], df["place"])) == want, "row order")
    expect((df["bytes"] == df["count"] * np.dtype(dtype).itemsize).all(), "bytes")
    fixed = df["backend"] != "auto"  # every other backend runs the algorithm it is named after
    named = (set(npcomm.ALGORITHMS) | set(npcomm.BACKENDS)) - {"auto"}  # what auto may pick
    expect((df["algorithm"][fixed] == df["backend"][fixed]).all() and df["algorithm"][~fixed].isin(named).all()
           and (df["op"] == cfg.op).all(), f"algorithm / op: {sorted(set(df['algorithm']))}")
    expect(raw.shape == (len(df), cfg.iters), f"raw shape {raw.shape}")
    filled = np.isfinite(raw)
    expect(np.array_equal(filled.sum(axis=1), df["iters"]) and (df["iters"] >= ar.MIN_ITERS).all()
           and filled[:, :ar.MIN_ITERS].all(), "iters / NaN padding")
    for q, column in ((0, "time_min_s"), (10, "time_p10_s"), (50, "time_median_s"), (90, "time_p90_s"),
                      (100, "time_max_s")):
        expect(np.allclose(np.nanpercentile(raw, q, axis=1), df[column]), column)
    expect(np.allclose(df["algbw_GBps"], df["bytes"] / df["time_median_s"] / 1e9), "algbw")
    expect(np.allclose(df["busbw_GBps"], df["algbw_GBps"] * bc.busbw_factor(collective, n)), "busbw")
    expect(not df["wrong"].any(), f"wrong {df['wrong'].tolist()}")
    return problems


def test_main_on_one_rank_prints_nccl_style_rows_and_writes_the_dump_and_csv(tmp_path, capsys):
    path, sheet = tmp_path / "ar.h5", tmp_path / "ar.csv"
    argv = TINY + ["--out", str(path), "--csv", str(sheet)]
    assert ar.main(argv, mpi_comm=MPI.COMM_SELF) == 0
    assert check_dump(path, argv, 1) == []
    out = capsys.readouterr().out.splitlines()
    df = results.read_table(path)
    rows = [line.split() for line in out if not line.startswith("#")]
    assert len(rows) == len(df) // 2  # one line per size and backend, both places side by side
    assert max(len(line) for line in out if not line.startswith(("# npddp", "# time", "# wrote"))) <= 130
    assert out[3].split() == ["#", "size", "count", "type", "redop", "backend", "algorithm"] + \
        ["time", "algbw", "busbw", "#wrong"] * 2
    assert out[2].split() == ["#", "out-of-place", "in-place"]
    for line, (_, r) in zip(rows, df[df["place"] == "outofplace"].iterrows()):
        assert line[:6] == [str(r["bytes"]), str(r["count"]), "float32", "sum", r["backend"], r["algorithm"]]
        assert float(line[6]) == pytest.approx(r["time_median_s"] * 1e6, abs=0.006) and line[9] == "0"
    assert "# Wrong values       : 0 OK" in out
    averages = [line.split() for line in out if line.startswith("# Avg bus bandwidth")]
    assert [a[-1] for a in averages] == ["raw", *npcomm.BACKENDS]   # MPI as a program sees it, beside mpi
    for a in averages:  # awk '{print $6}' takes the value, as with nccl-tests
        assert float(a[5]) == pytest.approx(df[df["backend"] == a[-1]]["busbw_GBps"].mean(), abs=1e-4)
    with open(sheet, newline="", encoding="utf-8") as f:
        table = list(csv.reader(f))
    assert table[0] == list(df.columns) and len(table) == len(df) + 1
    assert [row[1] for row in table[1:]] == df["backend"].tolist()
    assert [float(row[13]) for row in table[1:]] == df["time_median_s"].tolist()  # full precision
    assert sorted(os.listdir(tmp_path)) == ["ar.csv", "ar.h5"]


class Picking:
    """A backend that says which algorithm it runs per size (as an 'auto' backend does)."""

    def __init__(self, inner):
        self._inner = inner

    def algorithm_for(self, nbytes, dtype):
        return "small-alg" if nbytes < 64 else f"big-alg-{np.dtype(dtype).name}"

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_the_algorithm_column_asks_the_backend_which_algorithm_ran(monkeypatch, tmp_path, capsys):
    real = bc.create_comm
    monkeypatch.setattr(bc, "create_comm", lambda name, c, transport="mpi", world=None, check_args=None, **_: Picking(real("ring", c)))
    path = tmp_path / "ar.h5"
    assert ar.main(TINY + ["--backends", "ring", "--out", str(path)], mpi_comm=MPI.COMM_SELF) == 0
    df = results.read_table(path)
    assert df["algorithm"].tolist() == ["small-alg" if b < 64 else "big-alg-float32" for b in df["bytes"]]
    assert "big-alg-float32" in capsys.readouterr().out


def test_every_backend_that_npddp_lists_is_swept_with_the_raw_mpi_row_beside_mpi():
    cfg = ar.parse_config([])
    assert cfg.backends == ("raw", *npcomm.BACKENDS) and cfg.transports == (bc.DEFAULT_TRANSPORT,)
    assert len(ar.groups(cfg)) == 2 * (len(npcomm.BACKENDS) + 1)
    assert ar.parse_config(["--backends", "ring,mpi"]).backends == ("ring", "raw", "mpi")
    assert ar.parse_config(["--backends", "mpi,raw"]).backends == ("mpi", "raw")
    for collective in ("broadcast", "allgather", "reduce_scatter"):   # MPI's own call beside every collective's mpi row
        assert ar.parse_config(["--backends", "mpi", "--collective", collective]).backends == ("raw", "mpi")
        assert ar.parse_config(["--collective", collective]).backends == ("raw", *ar.default_backends(collective))
    cfg = ar.parse_config(["--backends", "raw", "--transports", "tcp", "--check-args", "both"])
    assert [(g.backend, g.transport, g.check) for g in ar.groups(cfg)] == [("raw", "mpi", True)] * 2


def test_the_raw_row_is_a_bare_mpi4py_allreduce_in_the_dump_and_the_report(tmp_path, capsys):
    from benchmarks import report
    from benchmarks._raw import RawMPI
    x = np.arange(5.0)
    assert RawMPI(MPI.COMM_SELF).allreduce(x, "avg", out=np.empty(5)).tolist() == x.tolist()
    path = tmp_path / "ar.h5"
    assert ar.main(TINY + ["--backends", "mpi,ring", "--out", str(path)], mpi_comm=MPI.COMM_SELF) == 0
    df = results.read_table(path)
    assert df["backend"].unique().tolist() == ["raw", "mpi", "ring"]
    assert (df[df["backend"] == "raw"]["algorithm"] == "raw").all() and not df["wrong"].any()
    assert report.resolve_baseline(df, "raw") == "raw"
    assert report.resolve_baseline(df[df["backend"] != "raw"], "raw") == "mpi"
    assert "median time / raw's" in report.sweep_tables(df, results.read_meta(path), "raw")


def test_every_collective_has_its_raw_row_and_alltoall_its_npddp_rows_once_the_protocol_declares_it(tmp_path):
    assert all(bc.offered(c) for c in ("allreduce", "allgather", "reduce_scatter", "broadcast"))
    with pytest.raises(ValueError, match="unknown collective 'reduce'"):
        bc.offered("reduce")
    for collective in bc.COLLECTIVES:
        path = tmp_path / f"{collective}.h5"
        assert ar.main(TINY + ["--collective", collective, "--out", str(path)], mpi_comm=MPI.COMM_SELF) == 0
        df, meta = results.read_table(path), results.read_meta(path)
        expected = ["raw", *ar.default_backends(collective)] if bc.offered(collective) else ["raw"]
        assert df["backend"].unique().tolist() == expected and meta["collective"] == collective
        assert (df["collective"] == collective).all() and not df["wrong"].any()
    if not bc.offered("alltoall"):   # naming a backend for a collective npddp lacks is an error, raised up front
        with pytest.raises(SystemExit) as info:
            ar.parse_config(["--collective", "alltoall", "--backends", "ring"], verbose=False)
        assert info.value.code == 2


def test_blocked_collectives_round_sizes_to_whole_blocks_and_the_raw_calls_match_mpi_semantics():
    for collective in ar.BLOCKED:
        cfg = ar.parse_config(["-b", "8", "-e", "100", "-f", "3", "--collective", collective], verbose=False)
        assert ar.sizes(cfg, 3).tolist() == [6, 18]   # 8 B -> 2 elements -> 0 (dropped); 24 B -> 6; 72 B -> 18
    raw = RawMPI(MPI.COMM_SELF)
    x = np.arange(6.0).reshape(1, 6)
    row = x[0]
    assert raw.allgather(row).tolist() == x.tolist() and raw.alltoall(x).tolist() == x.tolist()
    assert raw.reduce_scatter(row, "avg").tolist() == row.tolist() and raw.broadcast(row, 0) is row
    assert raw.allgather(row) is raw.allgather(row + 1)   # one output array per shape and dtype, reused


def test_transports_put_the_hand_written_backends_over_tcp_and_mpi_over_mpi_only(tmp_path):
    cfg = ar.parse_config(["--backends", "mpi,ring", "--transports", "mpi,tcp"])
    assert [(g.backend, g.transport) for g in ar.groups(cfg)][::2] == [("raw", "mpi"), ("mpi", "mpi"), ("ring", "mpi"),
                                                                      ("ring", "tcp")]
    path = tmp_path / "ar.h5"
    assert ar.main(TINY + ["--backends", "ring,rd", "--transports", "tcp,mpi", "--out", str(path)],
                   mpi_comm=MPI.COMM_SELF) == 0
    df = results.read_table(path)
    assert set(zip(df["backend"], df["transport"])) == {(b, t) for b in ("ring", "rd") for t in ("tcp", "mpi")}
    for argv in (["--transports", "udp"], ["--transports", "tcp,tcp"], ["--backends", "gloo", "--collective",
                                                                          "broadcast"]):
        with pytest.raises(SystemExit) as info:
            ar.parse_config(argv, verbose=False)
        assert info.value.code == 2


def test_main_returns_1_when_any_result_is_wrong(monkeypatch, capsys):
    real = npcomm.create
    monkeypatch.setattr(npcomm, "create", lambda name, c=None, **kw: Faulty(real("mpi", c), "bump"))
    assert ar.main(TINY + ["--backends", "ring"], mpi_comm=MPI.COMM_SELF) == 1
    assert "# Wrong values       : " in capsys.readouterr().out


def test_script_bad_arguments_exit_2_on_every_rank_without_hanging(run_script):
    done = run_script(2, "allreduce.py", "--backends", "mpi,bogus")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("allreduce.py: error: --backends: unknown backend 'bogus'") == 1, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


# ----------------------------------------------------------------------------- MPI


@pytest.mark.mpi(min_size=2)
@pytest.mark.needs_mpi  # the benchmarks time over mpi4py communicators
def test_sweep_dump_written_by_rank_0(assert_all_ranks, agreed_tmpdir):
    comm = MPI.COMM_WORLD
    directory = agreed_tmpdir
    path = directory / "ar.h5"
    argv = TINY + ["--out", str(path)]
    rc = ar.main(argv, mpi_comm=comm)
    comm.Barrier()
    problems = check_dump(path, argv, comm.Get_size()) if comm.Get_rank() == 0 else []
    if comm.Get_rank() == 0:
        shutil.rmtree(directory)
    assert_all_ranks(rc == 0 and not problems, f"rc={rc}, problems: {problems}")


@pytest.mark.mpi(min_size=2)
@pytest.mark.needs_mpi  # the benchmarks time over mpi4py communicators
def test_every_collective_times_mpis_own_call_beside_npddps_exactly(assert_all_ranks, assert_ranks_agree):
    comm = MPI.COMM_WORLD
    n, failures = comm.Get_size(), []
    for collective in bc.COLLECTIVES:
        backends = "raw,mpi,ring" if bc.offered(collective) else "raw"
        cfg = ar.parse_config(TINY + ["-b", "48", "-e", "3K", "-f", "8", "--collective", collective, "--backends",
                                      backends, "--iters", "3"], verbose=False)
        rows, raw = ar.run_sweep(cfg, comm)
        seen = list(dict.fromkeys(r["backend"] for r in rows))
        if seen != backends.split(","):
            failures.append(f"{collective}: rows of {seen}")
        failures += [f"{collective} {r['backend']} {r['bytes']} B: wrong {r['wrong']}" for r in rows if r["wrong"]]
        if collective in ar.BLOCKED:   # whole blocks: 48 B and 384 B (3K) of float32, cut to a multiple of n elements
            failures += [f"{collective}: count {r['count']}" for r in rows if r["count"] % n]
        assert_ranks_agree(np.nan_to_num(raw, nan=-1.0))
    assert_all_ranks(not failures, "; ".join(failures))


@pytest.mark.mpi(min_size=2)
@pytest.mark.needs_mpi  # the benchmarks time over mpi4py communicators
@pytest.mark.slow
def test_every_backend_is_exact_and_ranks_agree_on_the_results(assert_all_ranks, assert_ranks_agree):
    comm = MPI.COMM_WORLD
    combos = list(zip(npcomm.DTYPES, ["sum", "prod", "max", "min", "sum"]))  # every dtype, every op
    failures = []
    for collective in bc.COLLECTIVES:
        for dtype, op in (combos if collective in ar.REDUCING else combos[:2]):
            itemsize = np.dtype(dtype).itemsize  # counts 1, 7, 49: fewer than, and not divisible by, the ranks
            argv = TINY + ["-b", str(itemsize), "-e", str(64 * itemsize), "--collective", collective,
                           "--dtype", dtype, "--iters", "3"]
            if collective in ar.REDUCING:
                argv += ["--op", op]
            cfg = ar.parse_config(argv, verbose=False)
            rows, raw = ar.run_sweep(cfg, comm)
            for r in rows:
                if r["wrong"]:
                    failures.append(f"{collective} {dtype} {op} {r['backend']} {r['place']} {r['bytes']} B: "
                                    f"wrong {r['wrong']}")
            assert_ranks_agree(np.nan_to_num(raw, nan=-1.0))  # max over ranks, so identical everywhere
    assert_all_ranks(not failures, "; ".join(failures))


def test_buffers_both_times_shared_and_private_buffers_side_by_side(tmp_path, capsys):
    path = tmp_path / "ar.h5"
    argv = TINY + ["--backends", "mpi,auto", "--buffers", "both", "--out", str(path)]
    assert ar.main(argv, mpi_comm=MPI.COMM_SELF) == 0
    df = results.read_table(path)
    keys = list(zip(df["count"], df["backend"], df["place"], df["buffers"]))
    assert len(set(keys)) == len(keys) and set(df["buffers"]) == {"shared", "private"}
    for kind in ("shared", "private"):  # every size, backend and place once per kind of buffer
        assert sorted(k[:3] for k in keys if k[3] == kind) == sorted({k[:3] for k in keys})
    assert not df["wrong"].any()
    out = capsys.readouterr().out
    assert "auto/priv" in out and "# Avg bus bandwidth  : " in out and "auto (private buffers)" in out
    assert ar.parse_config(TINY, verbose=False).buffers == ("shared",)
    assert ar.parse_config(TINY + ["--buffers", "private"], verbose=False).buffers == ("private",)


@pytest.mark.parametrize("argv, message", [(["--buffers", "pinned"], "invalid choice: 'pinned'"),
                                           (["--buffers", "private", "--collective", "allgather"],
                                            "applies to allreduce only")])
def test_bad_buffers_option_is_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        ar.parse_config(TINY + argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_each_size_starts_with_an_untimed_run_of_its_first_group(monkeypatch):
    built = []   # (count, place) of every group's buffers, in order
    real = ar.kernel
    monkeypatch.setattr(ar, "kernel", lambda comm, collective, place, count, *a: built.append((count, place))
                        or real(comm, collective, place, count, *a))
    cfg = ar.parse_config(TINY + ["--backends", "ring,rd"])
    rows, _ = ar.run_sweep(cfg, MPI.COMM_SELF)
    counts = ar.sizes(cfg, 1).tolist()
    assert built == [(n, p) for n in counts for p in ("outofplace", "outofplace", "inplace", "outofplace", "inplace")]
    assert len(rows) == 4 * len(counts), "the untimed run gives no row"


@pytest.mark.parametrize("rounds, iters", [(1, 6), (2, 6), (3, 7), (4, 4)])
def test_rounds_measure_the_groups_in_turn_and_pool_their_iterations(monkeypatch, rounds, iters):
    order, asked = [], []   # the group measured, and the (iterations, budget) it was given, call by call
    real = ar.measure

    def measure(run, check, harness, k, warmup, budget, calls=1):
        asked.append((k, budget))
        return real(run, check, harness, k, warmup, budget, calls)

    monkeypatch.setattr(ar, "measure", measure)
    cfg = ar.parse_config(TINY + ["--backends", "ring,rd", "-b", "64", "-e", "64", "--iters", str(iters),
                                  "--budget", "30", "--rounds", str(rounds)], verbose=False)
    comms = {(b, "mpi", True): bc.create_comm(b, MPI.COMM_SELF, "mpi", None) for b in ("ring", "rd")}
    backend_of = {id(c): key[0] for key, c in comms.items()}
    monkeypatch.setattr(ar, "kernel", lambda comm, collective, place, count, *a:
                        order.append((backend_of[id(comm)], place)) or ex.kernel(comm, collective, place, count, *a))
    todo = ar.groups(cfg)
    times, wrong = ar.measure_size(cfg, comms, todo, 16, MPI.COMM_SELF)
    names = [(g.backend, g.place) for g in todo]
    expected = [names[0]] + [names[(k + j) % len(names)] for k in range(rounds) for j in range(len(names))]
    assert order == expected, "an untimed first group, then each round one group later"
    assert asked == [(iters // rounds, 30 / rounds)] * len(expected)
    assert times.shape == (len(todo), iters) and not wrong.any()
    assert (np.isfinite(times).sum(axis=1) == rounds * (iters // rounds)).all(), "every round's iterations pooled"
    assert np.isnan(times[:, rounds * (iters // rounds):]).all()


@pytest.mark.parametrize("argv, message", [(["--rounds", "0"], "must be >= 1"),
                                           (["--iters", "4", "--rounds", "5"], "--rounds 5 is more than --iters 4")])
def test_bad_rounds_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        ar.parse_config(TINY + argv)
    assert e.value.code == 2 and message in capsys.readouterr().err
