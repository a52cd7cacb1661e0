"""benchmarks/mpi_algorithms.py: each MPI library's own all-reduce algorithms, forced in turn, merged into one dump,
and drawn by the report beside npddp's algorithms."""

import json
import re
import sys
import time

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from benchmarks import _common as bc
from benchmarks import _plots as plots
from benchmarks import collectives as ar
from benchmarks import mpi_algorithms as ma
from benchmarks import report
from benchmarks import results

VERSIONS = {"MPICH": "MPICH Version:      5.0.2\nMPICH Release date: Fri Sep 25\n",
            "Open MPI": "Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11\x00",
            "Intel MPI": "Intel(R) MPI Library 2021.18.1 for Linux* OS\n"}
SIZES = ["-b", "1K", "-e", "4K", "-f", "4"]


def sweep_rows(backends, times, n=2, wrong=0, dtype="float32", raw=True):
    """allreduce.py's rows (its own row()) for ``backends`` at 1K and 4K; ``times[backend]``: median seconds
    (the ``raw`` row beside ``mpi`` takes mpi's time; ``raw=False`` leaves it out, as dumps made before it did)."""
    cfg = ar.parse_config(["--backends", ",".join(backends), *SIZES, "--dtype", dtype], verbose=False)
    rows = []
    for count in ar.sizes(cfg, n):
        for g in ar.groups(cfg):
            if g.backend == "raw" and not raw:
                continue
            t = times.get(g.backend, times.get("mpi", 1e-5)) * count / 256   # the raw row: as fast as mpi
            rows.append(ar.row(cfg, g, g.backend, n, int(count), t * np.array([0.95, 1.0, 1.05]), wrong))
    return rows


def write_sweep(path, rows, n=2, dtype="float32"):
    """A sweep dump of ``rows`` with one raw row per table row."""
    results.write_dump(path, "allreduce_sweep", rows, world_size=n, raw={"time_s": np.full((len(rows), 3), 1e-5)},
                       attrs={"collective": "allreduce", "dtype": dtype, "op": "sum"})
    return path


# ----------------------------------------------------------------------------- the table

@pytest.mark.parametrize("family", list(VERSIONS))
@pytest.mark.parametrize("collective", list(ma.CALLS))
def test_each_library_is_found_from_its_version_string_and_forces_distinct_algorithms(family, collective):
    lib = ma.detect(VERSIONS[family])
    assert lib is not None and lib.family == family
    menu = lib.menu(collective)
    names = [a.name for a in menu]
    assert len(names) == len(set(names)) >= 4 and ma.DEFAULT not in names
    assert all(a.env and a.about for a in menu)
    assert len({tuple(sorted(a.env.items())) for a in menu}) == len(names)   # each sets something else
    calls = ma.CALLS[collective]   # every variable names this collective's call (or is the library's general switch)
    assert all(any(call in k.upper() for call in calls) or k in GENERAL for a in menu for k in a.env), collective
    assert lib.source and lib.all_variables() >= {k for a in menu for k in a.env}


GENERAL = {"MPIR_CVAR_DEVICE_COLLECTIVES", "MPIR_CVAR_COLLECTIVE_FALLBACK", "OMPI_MCA_coll_tuned_use_dynamic_rules",
           "OMPI_MCA_coll", "OMPI_MCA_coll_han_priority", "OMPI_MCA_coll_xhc_priority"}


def test_the_table_says_how_each_library_forces_an_algorithm():
    mpich, ompi, intel = (ma.detect(VERSIONS[f]) for f in VERSIONS)
    ring = {a.name: a.env for a in mpich.menu("allreduce")}["ring"]
    assert ring == {"MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "ring", "MPIR_CVAR_DEVICE_COLLECTIVES": "none",
                    "MPIR_CVAR_COLLECTIVE_FALLBACK": "print"}
    tuned = {a.name: a.env for a in ompi.menu("allreduce")}
    assert tuned["rabenseifner"]["OMPI_MCA_coll_tuned_allreduce_algorithm"] == "6"
    assert tuned["ring"]["OMPI_MCA_coll_tuned_use_dynamic_rules"] == "1"
    assert {a.name for a in ompi.menu("allreduce") if a.component} == {"han_simple", "han_reproducible", "xhc"}
    assert [a.env["I_MPI_ADJUST_ALLREDUCE"] for a in intel.menu("allreduce")] == [str(k) for k in range(1, 13)]
    # the other collectives: each library's own variable of the call, both calls of a reduce-scatter where both have it
    assert {a.name: a.env for a in mpich.menu("allgather")}["brucks"]["MPIR_CVAR_ALLGATHER_INTRA_ALGORITHM"] == "brucks"
    pairwise = {a.name: a.env for a in mpich.menu("reduce_scatter")}["pairwise"]
    assert pairwise["MPIR_CVAR_REDUCE_SCATTER_INTRA_ALGORITHM"] == pairwise[
        "MPIR_CVAR_REDUCE_SCATTER_BLOCK_INTRA_ALGORITHM"] == "pairwise"
    rs = {a.name: a.env for a in ompi.menu("reduce_scatter")}
    assert (rs["recursive_halving"]["OMPI_MCA_coll_tuned_reduce_scatter_algorithm"],
            rs["recursive_halving"]["OMPI_MCA_coll_tuned_reduce_scatter_block_algorithm"]) == ("2", "3")
    assert "OMPI_MCA_coll_tuned_reduce_scatter_block_algorithm" not in rs["ring"]
    assert {a.name: a.env for a in ompi.menu("broadcast")}["chain"]["OMPI_MCA_coll_tuned_bcast_algorithm"] == "2"
    assert [a.env["I_MPI_ADJUST_ALLTOALL"] for a in intel.menu("alltoall")] == ["1", "2", "3", "4"]
    assert all(a.env["I_MPI_ADJUST_REDUCE_SCATTER"] == a.env["I_MPI_ADJUST_REDUCE_SCATTER_BLOCK"]
               for a in intel.menu("reduce_scatter"))
    assert mpich.menu("gather") == ()
    assert ma.detect("FooMPI 1.0\n") is None


def test_the_default_run_unsets_every_variable_of_the_library(monkeypatch):
    lib = ma.detect(VERSIONS["MPICH"])
    monkeypatch.setenv("MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM", "tree")        # left over in the user's shell
    default, ring = ma.plan(lib, ["ring"])
    assert (default.backend, ring.backend) == ("mpi:default", "mpi:ring")
    env = ma.run_environment(lib, default, "/opt/mpi/bin/mpirun")
    assert "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM" not in env and env["PATH"].startswith("/opt/mpi/bin")
    assert ma.run_environment(lib, ring, "/x/mpirun")["MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM"] == "ring"
    assert ma.child_args(["--iters", "3"], "ring,mpi", True) == ["--iters", "3", "--collective", "allreduce",
                                                                  "--backends", "mpi,ring"]
    assert ma.child_args(["--iters", "3"], "ring", False, "broadcast") == [
        "--iters", "3", "--collective", "broadcast", "--backends", "mpi", "--transports", "mpi"]
    if not bc.offered("alltoall"):   # MPI's own all-to-all: the bare loop alone, until npddp has one
        assert ma.child_args([], "", False, "alltoall")[:4] == ["--collective", "alltoall", "--backends", "raw"]
    ring = ma.plan(lib, ["ring"], "allgather")[1]
    assert ma.run_environment(lib, ring, "/x/mpirun")["MPIR_CVAR_ALLGATHER_INTRA_ALGORITHM"] == "ring"
    assert "MPIR_CVAR_ALLGATHER_INTRA_ALGORITHM" not in ma.run_environment(lib, default, "/x/mpirun")


# ----------------------------------------------------------------------------- arguments

@pytest.fixture
def no_runs(monkeypatch):
    """The library is MPICH; starting a run fails the test."""
    monkeypatch.setattr(ma, "library_version", lambda: VERSIONS["MPICH"])

    def refuse(*args, **kwargs):
        raise AssertionError("a run started after bad arguments")
    monkeypatch.setattr(ma, "relaunch", refuse)


@pytest.mark.parametrize("argv, says", [
    (["--algorithms", "ring,bogus"], r"--algorithms: 'bogus' is not one of MPICH's allreduce algorithms \(each once\): "
                                     r"auto, nb, "),
    (["--algorithms", "ring,ring"], r"--algorithms: 'ring,ring' is not one of MPICH's allreduce algorithms"),
    (["--collective", "broadcast", "--algorithms", "ring"], r"'ring' is not one of MPICH's broadcast algorithms "
                                                            r"\(each once\): auto, binomial, "),
    (["--timeout", "0"], r"--timeout must be > 0 seconds, got 0.0"),
    (["-n", "0"], r"argument -n/--nproc"),
    (["--collective", "gather"], r"argument --collective: invalid choice: 'gather'"),
    (["--out", "/no/such/dir/a.h5"], r"--out '/no/such/dir/a.h5': directory '/no/such/dir' does not exist"),
    (["--csv", "/dev/null"], r"--csv '/dev/null' is a device, not a regular file"),
])
def test_bad_arguments_are_one_error_line_and_exit_2_before_any_run(no_runs, capsys, argv, says):
    with pytest.raises(SystemExit) as e:
        ma.main(argv)
    assert e.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and re.search(says, errors[0]), errors


def test_an_unknown_library_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(ma, "library_version", lambda: "FooMPI 1.0 (c) nobody\nmore\n")
    with pytest.raises(SystemExit) as e:
        ma.main(["-n", "2"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "error: unknown MPI library 'FooMPI 1.0 (c) nobody'; known: MPICH, Open MPI, Intel MPI" in err


def test_list_prints_every_algorithm_with_its_variables(monkeypatch, capsys):
    monkeypatch.setattr(ma, "library_version", lambda: VERSIONS["Intel MPI"])
    assert ma.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "Intel(R) MPI Library 2021.18.1" in out and "mpi:shumilin_ring" in out and "I_MPI_ADJUST_ALLREDUCE=7" in out


# ----------------------------------------------------------------------------- runs

def test_a_run_past_its_limit_is_stopped_and_a_crash_keeps_its_exit_status(tmp_path):
    t0 = time.perf_counter()
    code, log, seconds = ma.relaunch([sys.executable, "-c", "print('started', flush=True); import time; time.sleep(60)"],
                                     None, 1.0, tmp_path, "slow")
    assert code is None and "started" in log and seconds < 10 and time.perf_counter() - t0 < 15
    code, log, _ = ma.relaunch([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], None, 30, tmp_path, "bad")
    assert (code, log.strip()) == (3, "boom")
    lib = ma.detect(VERSIONS["MPICH"])
    run = ma.Run("mpi:smp", lib.menu("allreduce")[2])
    ma.judge(run, None, "", 1.0, lib)
    assert run.status == "timed out after 1 s" and not run.ok
    ma.judge(run, 3, "Allreduce smp cannot be applied.\nAllreduce smp cannot be applied.\n", 1.0, lib)
    assert (run.status, run.fallbacks) == ("failed (exit 3)", 2)
    ma.judge(run, 1, "# Wrong values       : 4 FAILED\n", 1.0, lib)
    assert run.status == "wrong results"


def test_an_algorithm_no_faster_or_slower_than_default_beyond_the_spread_is_suspect():
    rows = sweep_rows(["mpi", "ring"], {"mpi": 1e-5, "ring": 1e-5})
    for r in rows:
        r["backend"] = "mpi:default" if r["backend"] == "mpi" else "mpi:same"
    assert ma.honoured(rows, "mpi:same") is False
    assert ma.honoured(rows, "mpi:absent") is None
    slower = sweep_rows(["mpi"], {"mpi": 2e-5})
    for r in slower:
        r["backend"] = "mpi:slower"
    assert ma.honoured(rows + slower, "mpi:slower") is True
    assert ma.ratios(rows + slower, "mpi:slower") == pytest.approx((2.0, 2.0))


def test_a_collective_timed_by_the_bare_loop_alone_is_judged_by_its_raw_rows():
    """All-to-all before npddp has one: each run's rows are raw:<algorithm>, and the summary judges them."""
    rows = []
    for name, t in (("default", 1e-5), ("same", 1e-5), ("slower", 3e-5)):
        part = sweep_rows(["raw"], {"raw": t})
        for r in part:
            r["backend"] = r["algorithm"] = f"raw:{name}"
        rows += part
    runs = [ma.Run(f"mpi:{name}", None) for name in ("default", "same", "slower")]
    for run in runs:
        run.status = "ok"
    assert [ma.judged(rows, run.backend) for run in runs] == ["raw:default", "raw:same", "raw:slower"]
    assert ma.judged(rows + [dict(rows[0], backend="mpi:same")], "mpi:same") == "mpi:same"
    assert ma.honoured(rows, "raw:same") is False and ma.honoured(rows, "raw:slower") is True
    lines = ma.summary(runs, rows)
    cells = {line.split()[0]: line for line in lines[1:]}
    assert "3.00-3.00" in cells["mpi:slower"] and "judged by raw:slower" in cells["mpi:slower"]
    assert "suspect: not honoured?" in cells["mpi:same"] and "suspect" not in cells["mpi:slower"]
    assert cells["mpi:default"].split()[2] == "0"   # its #wrong: rows found, not '-'


def test_runs_merge_into_one_dump_with_failures_reported(tmp_path, monkeypatch, capsys):
    """Fake runs: default and ring exact, tree wrong, smp timed out, nb crashed; one dump of what ran, exit 1."""
    lib = ma.detect(VERSIONS["MPICH"])
    times = {"default": 1e-5, "ring": 3e-5, "tree": 1e-5}

    def fake(command, env, limit_s, workdir, name):
        out = command[command.index("--out") + 1]
        if name == "smp":
            return None, "", limit_s
        if name == "nb":
            return 139, "Segmentation fault\n", 0.5
        backends = command[command.index("--backends") + 1].split(",")
        wrong = 5 if name == "tree" else 0
        rows = sweep_rows(backends, {b: times[name] if b == "mpi" else 2e-5 for b in backends}, wrong=wrong)
        write_sweep(out, rows)
        return (1 if wrong else 0), f"# Wrong values       : {wrong} {'FAILED' if wrong else 'OK'}\n", 0.5

    monkeypatch.setattr(ma, "library_version", lambda: VERSIONS["MPICH"])
    monkeypatch.setattr(ma, "relaunch", fake)
    path = tmp_path / "mpi.h5"
    code = ma.main(["-n", "2", "--algorithms", "ring,tree,smp,nb", "--backends", "ring", "--timeout", "7",
                    *SIZES, "--out", str(path), "--csv", str(tmp_path / "mpi.csv")])
    assert code == 1
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.split("# backend")[1].splitlines()[1:]}
    assert re.search(r"mpi:default +ok +0 +1\.00-1\.00", lines["mpi:default"])
    assert re.search(r"mpi:ring +ok +0 +3\.00-3\.00 *$", lines["mpi:ring"])
    assert re.search(r"mpi:tree +wrong results +20 .*suspect: not honoured\?", lines["mpi:tree"])
    assert "timed out after 7 s" in lines["mpi:smp"] and "failed (exit 139)" in lines["mpi:nb"]
    assert "#   | Segmentation fault" in out
    df, meta = results.read_table(path), results.read_meta(path)
    backends = list(dict.fromkeys(df["backend"]))
    assert [b for b in backends if not b.startswith("raw:")] == ["mpi:default", "ring", "mpi:tree", "mpi:ring"]  # order
    assert {b for b in backends if b.startswith("raw:")} == {"raw:default", "raw:tree", "raw:ring"}  # bare loops
    assert (df["algorithm"][df["backend"].str.startswith("mpi:")] == df["backend"][df["backend"].str.startswith(
        "mpi:")]).all()
    assert int(df["wrong"].sum()) == 5 * 8 and results.read_raw(path, "time_s").shape == (len(df), 3)
    assert meta["mpi_family"] == "MPICH" and meta["mpi_library"] == "MPICH Version: 5.0.2"
    record = {r["backend"]: r for r in json.loads(meta["mpi_algorithms"])}
    assert record["mpi:smp"]["status"] == "timed out after 7 s" and record["mpi:ring"]["honoured"] is True
    assert record["mpi:ring"]["variables"]["MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM"] == "ring"
    assert (tmp_path / "mpi.csv").read_text().count("\n") == len(df) + 1


def test_bad_flags_for_allreduce_end_everything_at_the_default_run(tmp_path, monkeypatch, capsys):
    calls = []

    def fake(command, env, limit_s, workdir, name):
        calls.append(name)
        return 2, "allreduce.py: error: -f/--factor must be an int >= 2, got 1\n", 0.1
    monkeypatch.setattr(ma, "library_version", lambda: VERSIONS["MPICH"])
    monkeypatch.setattr(ma, "relaunch", fake)
    assert ma.main(["-f", "1", "--out", str(tmp_path / "x.h5")]) == 2
    assert calls == ["default"] and not (tmp_path / "x.h5").exists()
    assert "error: -f/--factor must be an int >= 2" in capsys.readouterr().err


def test_two_algorithms_under_the_active_mpi_end_to_end(tmp_path, capsys):
    """The real thing under the main environment's MPI (MPICH): default and two forced algorithms, exact."""
    path = tmp_path / "mpich.h5"
    t0 = time.perf_counter()
    code = ma.main(["-n", "2", "--algorithms", "ring,recursive_doubling", *SIZES, "--iters", "3", "--warmup", "1",
                    "--budget", "0.01", "--timeout", "60", "--out", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    df, meta = results.read_table(path), results.read_meta(path)
    forced = ("default", "ring", "recursive_doubling")
    assert set(df["backend"]) == {f"{kind}:{name}" for kind in ("mpi", "raw") for name in forced}
    assert int(df["wrong"].sum()) == 0 and len(df) == 3 * 2 * 2 * 2    # runs x (mpi, raw) x sizes x places
    assert meta["mpi_library"].startswith(meta["mpi_family"].split()[0])
    print(f"end to end: {time.perf_counter() - t0:.1f} s", file=sys.stderr)


# ----------------------------------------------------------------------------- the report

def test_the_report_draws_mpi_algorithms_from_a_separate_dump_beside_npddps(tmp_path, capsys):
    ours = write_sweep(tmp_path / "ar.h5", sweep_rows(["mpi", "ring"], {"mpi": 1e-5, "ring": 2e-5}, raw=False))
    theirs_rows = sweep_rows(["mpi", "ring", "rd"], {"mpi": 1e-5, "ring": 3e-5, "rd": 4e-5}, raw=False)
    for r in theirs_rows:
        r["backend"] = r["algorithm"] = {"mpi": "mpi:default", "ring": "mpi:ring", "rd": "mpi:tree"}[r["backend"]]
    theirs = write_sweep(tmp_path / "mpialg.h5", theirs_rows)
    other_dtype = write_sweep(tmp_path / "f64.h5", sweep_rows(["mpi"], {"mpi": 1e-5}, dtype="float64", raw=False),
                              dtype="float64")
    assert report.main([str(ours), str(theirs), str(other_dtype), "--outdir", str(tmp_path / "plots")]) == 0
    written = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert written == ["ar+mpialg_busbw.png", "ar+mpialg_ratio.png", "f64_busbw.png", "projection.png"]
    out = capsys.readouterr().out
    ratio = out.split("median time / mpi's (> 1: slower):\n")[1].split("#wrong")[0].splitlines()
    assert ratio[0].split()[1:] == ["ring", "outofplace", "ring", "inplace", "mpi:default", "outofplace",
                                    "mpi:default", "inplace", "mpi:ring", "outofplace", "mpi:ring", "inplace",
                                    "mpi:tree", "outofplace", "mpi:tree", "inplace"]
    assert ratio[2].split()[1:] == ["2.00", "2.00", "1.00", "1.00", "3.00", "3.00", "4.00", "4.00"]


def test_a_dump_of_mpi_algorithms_alone_is_compared_with_mpis_default(tmp_path, capsys):
    rows = sweep_rows(["mpi", "ring"], {"mpi": 1e-5, "ring": 3e-5})
    for r in rows:
        r["backend"] = r["algorithm"] = "mpi:default" if r["backend"] == "mpi" else "mpi:ring"
    path = write_sweep(tmp_path / "alone.h5", rows)
    assert report.main([str(path), "--outdir", str(tmp_path / "plots")]) == 0
    assert "alone_ratio.png" in {p.name for p in (tmp_path / "plots").iterdir()}
    out = capsys.readouterr().out
    assert "median time / mpi:default's (> 1: slower):" in out


def test_every_mpi_algorithm_in_a_figure_has_a_colour_of_its_own():
    mpich = ma.detect(VERSIONS["MPICH"])
    names = ["mpi", "ring", "rd", "auto"] + [f"mpi:{a.name}" for a in mpich.menu("allreduce")] + ["mpi:default"]
    rows = sweep_rows(["mpi"], {"mpi": 1e-5})
    frame = []
    for i, name in enumerate(names):
        for r in rows:
            frame.append({**r, "backend": name, "algorithm": name, "time_median_s": r["time_median_s"] * (1 + i)})
    df = pd.DataFrame(frame)
    meta = {"collective": "allreduce", "dtype": "float32", "world_size": 2}
    seen = []
    for fig, drawn in ((plots.sweep_busbw(df, meta), names), (plots.sweep_ratio(df, meta, "mpi"), names[1:])):
        colours = {}
        for line in fig.axes[0].get_lines():
            if not line.get_label().startswith("_") and "(1.0)" not in line.get_label():
                colours.setdefault(line.get_label().split()[0], set()).add(to_hex(line.get_color()))
        assert sorted(colours) == sorted(drawn) and all(len(c) == 1 for c in colours.values())
        assert len({next(iter(c)) for c in colours.values()}) == len(drawn)            # no two backends share one
        assert colours["ring"] == {plots.BACKEND_COLOURS["ring"]}
        seen.append(colours)
    assert plots.backend_colours(reversed(names)) == plots.backend_colours(names)
    assert all(seen[0][name] == seen[1][name] for name in names[1:])                 # the same in both figures
