"""benchmarks/mpi_study.py: one command per MPI runs every setting's sweep of MPI's own algorithms beside npddp's,
and its report prints the tables, winners and fits of each setting and draws one figure per setting."""

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import mpi_algorithms as ma
from benchmarks import mpi_study as ms
from benchmarks import results


def test_each_setting_runs_npddps_algorithms_that_fit_it_and_its_cluster_under_the_lock():
    args = argparse.Namespace(lock="/tmp/x.lock", timeout=60.0, iters=3, budget=0.1, rounds=2,
                             algorithms="", maxbytes="")
    one = ms.command(ms.BY_NAME["1x2"], ms.Path("d"), "Open MPI", args)
    assert one[one.index("--backends") + 1] == "ring,rd,rabenseifner,tree,naive,auto,shm,hier"
    assert one[one.index("-n") + 1] == "2" and "--cluster" not in one and "--lock" not in one
    assert one[one.index("--out") + 1] == "d/openmpi_1x2.h5" and one[one.index("--rounds") + 1] == "2"
    wide = ms.command(ms.BY_NAME["4x1@10gbit"], ms.Path("d"), "Intel MPI", args)
    assert wide[wide.index("--backends") + 1] == "ring,rd,rabenseifner,tree,naive,auto"
    assert wide[wide.index("--cluster") + 1] == "4x1@10gbit" and wide[wide.index("--lock") + 1] == "/tmp/x.lock"
    assert wide[wide.index("--out") + 1] == "d/intelmpi_4x1_10gbit.h5"
    pair = ms.command(ms.BY_NAME["2x2@10gbit"], ms.Path("d"), "MPICH", args)
    assert pair[pair.index("--backends") + 1].endswith(",auto,hier")


def test_a_cluster_job_is_the_emulated_clusters_launcher_under_flock():
    lib = ma.detect("MPICH Version: 5.0.2\n")
    job = ma.launch_command(lib, "/x/mpirun", 4, ["--out", "a.h5"], ma.parse_cluster("2x2@10gbit"), "/tmp/l")
    assert job[:2] == ["flock", "/tmp/l"]
    assert job[job.index("--nodes") + 1] == "2" and job[job.index("--ranks-per-node") + 1] == "2"
    assert job[job.index("--rate") + 1] == "10gbit" and job[job.index("--launcher") + 1] == "mpi"
    assert "/x/mpirun" not in job and job[-2:] == ["--out", "a.h5"]
    assert ma.launch_command(lib, "/x/mpirun", 2, [])[:3] == ["/x/mpirun", "-n", "2"]


@pytest.mark.parametrize("text", ["2x1", "2@1gbit", "0x1@1gbit", "2x1@fast", "axb@1gbit"])
def test_a_bad_cluster_is_one_error_line_and_exit_2(text, capsys):
    with pytest.raises(SystemExit) as e:
        ma.main(["--cluster", text, "--out", "x.h5"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len([line for line in err if "error:" in line]) == 1 and text in err[-1]


def test_a_bad_setting_is_one_error_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        ms.main(["--settings", "3x3@1gbit"])
    assert e.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "'3x3@1gbit' is not one of 1x2, 2x1@1gbit, 4x1@10gbit, 2x2@10gbit" in errors[0]


def test_one_node_smoke_run_merges_mpis_and_npddps_backends_and_the_report_reads_it(tmp_path, capsys):
    """The real thing under the active MPI: tiny sizes, the default run and one forced algorithm."""
    lib = ma.detect(ma.library_version())
    forced = lib.menu("allreduce")[-2].name if lib.family == "Open MPI" else next(
        a.name for a in lib.menu("allreduce") if "ring" in a.name)
    code = ms.main(["--out", str(tmp_path), "--settings", "1x2", "--algorithms", forced, "--maxbytes", "4K",
                    "--iters", "2", "--budget", "0.02", "--timeout", "120", "--rounds", "1"])
    assert code == 0
    path = tmp_path / f"{ms.family_slug(lib.family)}_1x2.h5"
    table, meta = results.read_table(path), results.read_meta(path)
    for column in ("backend", "algorithm", "transport", "place", "bytes", "time_median_s", "time_p10_s",
                   "time_p90_s", "wrong"):
        assert column in table
    backends = set(np.asarray(table["backend"]).astype(str))
    assert backends == {"mpi:default", f"mpi:{forced}", "raw:default", f"raw:{forced}", *ms.BY_NAME["1x2"].backends}
    assert set(np.asarray(table["bytes"]).tolist()) == {1024, 4096}
    assert int(np.asarray(table["wrong"]).sum()) == 0
    record = json.loads(meta["mpi_algorithms"])
    assert [r["backend"] for r in record] == ["mpi:default", f"mpi:{forced}"]
    assert all(len(r["load_average"]) == 2 and r["load_average"][0] >= 0 for r in record)
    capsys.readouterr()
    assert ms.main(["--report", str(tmp_path), "--plots", str(tmp_path / "img")]) == 0
    out = capsys.readouterr().out
    assert "## one node, N = 2" in out and "| 4 KiB |" in out and "load average" in out
    assert "| best of MPI's own |" in out and "| algorithm | MPI" in out
    assert out.count("**") >= 4                                     # the best of each size bold
    if importlib.util.find_spec("matplotlib") is None:                # the MPI's own venv may lack it
        assert "# no plots: matplotlib is not installed" in out and not (tmp_path / "img").exists()
    else:
        assert (tmp_path / "img" / "mpi_study_1x2.png").stat().st_size > 10_000


def test_the_report_of_an_empty_folder_is_one_error_line_and_exit_2(tmp_path, capsys):
    assert ms.main(["--report", str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("error:") == 1


def test_winners_name_the_best_of_each_side_and_their_ratio():
    times = {(1024, "mpi:default"): 2e-5, (1024, "mpi:ring"): 1e-5, (1024, "ring"): 4e-5, (1024, "rd"): 2e-5,
             (4096, "mpi:default"): 9e-5, (4096, "ring"): 3e-5}
    lines = ms.winners(times)
    assert lines[2] == "| 1 KiB | ring | 0.01 | rd | 0.02 | 0.50 |"
    assert lines[3] == "| 4 KiB | default | 0.09 | ring | 0.03 | 3.00 |"
    table = ms.time_table(times)
    assert table[0] == "| algorithm | 1 KiB | 4 KiB |"
    assert table[2:] == ["| default | 0.02 | 0.09 |", "| ring | **0.01** | - |", "| *ring* | 0.04 | **0.03** |",
                         "| *rd* | 0.02 | - |"]


def test_rounds_run_abba_and_pool_each_algorithms_iterations(tmp_path, monkeypatch, capsys):
    """Two rounds: default, tree, ring, then ring, tree, default; each row's times are both rounds' together."""
    order = []
    per_round = {"default": (1e-5, 3e-5), "ring": (2e-5, 4e-5), "tree": (5e-5, 5e-5)}

    def fake(command, env, limit_s, workdir, name):
        order.append(name)
        algorithm, _, k = name.partition("_round")
        t = per_round[algorithm][1 if k else 0]
        out = command[command.index("--out") + 1]
        backends = command[command.index("--backends") + 1].split(",")
        cfg_rows = []
        for nbytes in (1024, 4096):
            for backend in backends:
                for place in ("outofplace", "inplace"):
                    cfg_rows.append({"collective": "allreduce", "backend": backend, "transport": "mpi",
                                     "algorithm": backend, "place": place, "buffers": "shared", "world_size": 2,
                                     "dtype": "float32", "op": "sum", "bytes": nbytes, "count": nbytes // 4,
                                     "iters": 3, "time_min_s": t, "time_p10_s": t, "time_median_s": t,
                                     "time_p90_s": t, "time_max_s": t, "algbw_GBps": nbytes / t / 1e9,
                                     "busbw_GBps": nbytes / t / 1e9, "wrong": 0})
        results.write_dump(out, "allreduce_sweep", cfg_rows, world_size=2,
                           raw={"time_s": np.full((len(cfg_rows), 3), t)},
                           attrs={"collective": "allreduce", "dtype": "float32", "op": "sum"})
        return 0, "# Wrong values       : 0 OK\n", 0.1

    monkeypatch.setattr(ma, "library_version", lambda: "MPICH Version: 5.0.2\n")
    monkeypatch.setattr(ma, "relaunch", fake)
    path = tmp_path / "r.h5"
    assert ma.main(["-n", "2", "--algorithms", "ring,tree", "--rounds", "2", "-b", "1K", "-e", "4K", "-f", "4",
                    "--out", str(path)]) == 0
    assert order == ["default", "tree", "ring", "ring_round2", "tree_round2", "default_round2"]   # the table's order
    df = results.read_table(path)
    ring = df[(df["backend"] == "mpi:ring") & (df["place"] == "inplace")]
    assert len(ring) == 2 and (ring["iters"] == 6).all()
    assert np.allclose(ring["time_median_s"], 3e-5) and np.allclose(ring["time_p10_s"], 2e-5)
    assert np.allclose(ring["algbw_GBps"], ring["bytes"] / 3e-5 / 1e9)
    assert results.read_raw(path, "time_s").shape == (len(df), 6)
    record = {r["backend"]: r for r in json.loads(results.read_meta(path)["mpi_algorithms"])}
    assert len(record["mpi:tree"]["load_average"]) == 4 and record["mpi:tree"]["status"] == "ok"
    assert "round 2" in capsys.readouterr().out


@pytest.mark.parametrize("version, family, name", [
    ("MPICH Version: 5.0.2", "MPICH", "MPICH 5.0.2"),
    ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11", "Open MPI", "Open MPI 5.0.11"),
    ("Intel(R) MPI Library 2021.18.1 for Linux* OS", "Intel MPI", "Intel MPI 2021.18.1"),
    ("", "MPICH", "MPICH")])
def test_each_table_is_headed_by_the_library_and_its_version(version, family, name):
    assert ms.short_name({"mpi_library": version}, family) == name


def test_each_settings_title_writes_its_link_rate_in_gbit_per_second():
    titles = [s.title for s in ms.SETTINGS]
    assert titles == ["one node, N = 2", "2 nodes x 1 rank, 1 Gbit/s links", "4 nodes x 1 rank, 10 Gbit/s links",
                      "2 nodes x 2 ranks, 10 Gbit/s links"]


def test_a_settings_tail_run_is_a_second_command_and_the_report_merges_its_rows(tmp_path, monkeypatch):
    """Across nodes 64 MiB is a run of its own: ``--tail-only`` runs just it; the report reads both dumps as one."""
    calls = []
    monkeypatch.setattr(ma, "library_version", lambda: "MPICH Version: 5.0.2\n")
    monkeypatch.setattr(ms.subprocess, "call", lambda cmd: calls.append(cmd) or 0)
    assert ms.main(["--out", str(tmp_path), "--settings", "1x2,2x1@1gbit"]) == 0
    outs = [Path(c[c.index("--out") + 1]).name for c in calls]
    assert outs == ["mpich_1x2.h5", "mpich_2x1_1gbit.h5", "mpich_2x1_1gbit_tail.h5"]
    tail = calls[-1]
    assert tail[tail.index("-b") + 1] == tail[tail.index("-e") + 1] == "64M" and "-f" not in tail
    calls.clear()
    assert ms.main(["--out", str(tmp_path), "--settings", "1x2,2x1@1gbit", "--tail-only"]) == 0
    assert [Path(c[c.index("--out") + 1]).name for c in calls] == ["mpich_2x1_1gbit_tail.h5"]

    def dump(path, sizes, backends, honoured):
        rows = [{"collective": "allreduce", "backend": b, "transport": "mpi", "algorithm": b, "place": "inplace",
                 "buffers": "shared", "world_size": 2, "dtype": "float32", "op": "sum", "bytes": n, "count": n // 4,
                 "iters": 3, "time_min_s": 1e-3, "time_p10_s": 1e-3, "time_median_s": 1e-3, "time_p90_s": 1e-3,
                 "time_max_s": 1e-3, "algbw_GBps": 1.0, "busbw_GBps": 1.0, "wrong": 0} for n in sizes for b in backends]
        record = [{"backend": b, "status": "ok", "honoured": honoured.get(b), "load_average": [1.0, 2.0]}
                  for b in backends]
        results.write_dump(path, "allreduce_sweep", rows, world_size=2,
                           attrs={"collective": "allreduce", "dtype": "float32", "op": "sum",
                                  "mpi_library": "MPICH Version: 5.0.2",
                                  "mpi_algorithms": json.dumps(record)})

    backends = ["mpi:default", "mpi:ring", "mpi:tree", "ring"]
    dump(tmp_path / "mpich_2x1_1gbit.h5", [1024, 8192], backends, {"mpi:ring": False, "mpi:tree": False})
    dump(tmp_path / "mpich_2x1_1gbit_tail.h5", [64 << 20], backends, {"mpi:ring": True, "mpi:tree": False})
    rows, meta = ms.load(tmp_path)["2x1@1gbit"]["MPICH"]
    assert sorted({r["bytes"] for r in rows}) == [1024, 8192, 64 << 20]
    assert ms.unmoved(meta)[0] == ["tree"]   # ring moved in its tail run


def test_a_skip_repeated_by_the_tail_run_is_named_once():
    """A backend skipped in the series and again in its tail run shows once among the runs not ok."""
    skipped = {"backend": "mpi:xhc", "status": "skipped: not in this build", "honoured": None}
    timeout = {"backend": "mpi:ring", "status": "timeout", "honoured": None}
    meta = {"mpi_algorithms": json.dumps([skipped, timeout, skipped])}
    assert ms.unmoved(meta)[1] == ["xhc (skipped: not in this build)", "ring (timeout)"]


def test_the_study_figures_header_names_every_mpi_drawn_not_only_the_first():
    pytest.importorskip("matplotlib")
    from benchmarks import _plots
    versions = {"MPICH": "MPICH Version: 5.0.2", "Open MPI": "Open MPI v5.0.11, package: Open MPI",
                "Intel MPI": "Intel(R) MPI Library 2021.18.1 for Linux* OS"}
    times = {(n, b): 1e-3 * n / 1024 for n in (1024, 4096) for b in ("mpi:default", "mpi:ring", "ring")}
    frames = {ms.short_name({"mpi_library": v}, family): (times, {"mpi_library": v, "world_size": 2})
              for family, v in versions.items()}   # keyed as the report keys them
    header = _plots.mpi_study(frames, "one node, N = 2", ma.PREFIX).get_suptitle()
    for name in ("MPICH 5.0.2", "Open MPI 5.0.11", "Intel MPI 2021.18.1"):
        assert name in header, header
