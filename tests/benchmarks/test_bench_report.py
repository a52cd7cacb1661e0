"""Serial tests of benchmarks/report.py: every dump kind to tables and PNGs, fits, errors.

Dumps are synthetic (written here in the documented layouts), except one made by running
benchmarks/allreduce.py under ``mpirun -n 2``.
"""

import h5py
import numpy as np
import pytest

from benchmarks import _common as bc
from benchmarks import allreduce as ar
from benchmarks import report
from npddp import runinfo

PNG = b"\x89PNG\r\n\x1a\n"
MODEL = {"mpi": (3e-6, 6e9), "ring": (9e-6, 4e9)}  # backend -> (alpha s, beta B/s) of the synthetic sweep


def synthetic_sweep(path, n=4, iters=5):
    """A sweep dump whose median times follow MODEL exactly, written by the benchmark's own writer."""
    cfg = ar.parse_config(["--backends", "mpi,ring", "-b", "8", "-e", "16M", "-f", "4", "--iters", str(iters)],
                          verbose=False)
    counts = ar.sizes(cfg, n)
    nbytes = counts * 4
    results = []
    for backend, (alpha, beta) in MODEL.items():
        for place in ar.PLACES["allreduce"]:
            t = bc.model_time(nbytes, "allreduce", n, alpha, beta)
            time_s = t[:, None] * np.linspace(0.9, 1.1, iters)[None, :]  # median = t
            time_s[0, :] = t[0] * np.array([0.9, 1.0, 1.1] + [np.nan] * (iters - 3))  # fewer iterations here
            results.append(ar.GroupResult(backend, place, bc.busbw_factor("allreduce", n), nbytes, counts,
                                          np.isfinite(time_s).sum(axis=1), time_s, np.zeros(counts.size, np.int64)))
    ar.write_dump(str(path), cfg, results, n, ["--backends", "mpi,ring"])
    return path


def write_rows(path, kind, columns, **attrs):
    """A DDP dump in the contract's layout: attributes at the root, one 1-D dataset per column in /rows."""
    with h5py.File(path, "w") as f:
        runinfo.write_attrs(f, {**runinfo.environment(world_size=4), "kind": kind, **attrs})
        rows = f.create_group("rows")
        for name, values in columns.items():
            values = np.asarray(values)
            rows[name] = values.astype("S") if values.dtype.kind == "U" else values
    return path


BREAKDOWN = {"model_size": ["small", "small", "large", "large"], "params": [10**6, 10**6, 10**7, 10**7],
             "sync": ["per_param", "overlap", "per_param", "overlap"], "backend": ["mpi", "ring", "mpi", "ring"],
             "bucket_mb": [0.0, 25.0, 0.0, 25.0], "total_time_ms": [9.0, 6.0, 80.0, 55.0],
             "compute_time_ms": [5.0, 5.0, 30.0, 50.0], "comm_time_ms": [4.0, 1.0, 50.0, 5.0],
             "comm_fraction": [4 / 9, 1 / 6, 50 / 80, 5 / 55], "num_comm_ops": [12, 2, 12, 2],
             "samples_per_s": [7000.0, 10500.0, 800.0, 1160.0]}
SPLIT = {"forward_time_ms": [1.0, 1.0, 10.0, 16.0], "backward_time_ms": [3.0, 3.0, 15.0, 30.0],
         "optimizer_time_ms": [1.0, 1.0, 5.0, 4.0]}
SCALING = {"world_size": [1, 2, 4, 1, 2, 4], "samples_per_s": [100.0, 190.0, 360.0, 100.0, 180.0, 300.0],
           "efficiency": [1.0, 0.95, 0.9, 1.0, 0.9, 0.75], "backend": ["mpi"] * 3 + ["ring"] * 3}


def _pngs(directory):
    """Names of the PNG files in ``directory``, after checking each one is a PNG."""
    found = sorted(p.name for p in directory.glob("*.png"))
    for name in found:
        assert (directory / name).read_bytes()[:8] == PNG, name
    return found


def test_sweep_report_fits_the_model_and_writes_its_plots(tmp_path, capsys):
    path = synthetic_sweep(tmp_path / "ar.h5")
    dump = report.load(path)
    assert dump.kind == "allreduce_sweep"
    assert set(dump.groups) == {(b, p) for b in MODEL for p in ar.PLACES["allreduce"]}
    fits = report.sweep_fits(dump)
    for (backend, place), fit in fits.items():
        assert fit.alpha == pytest.approx(MODEL[backend][0], rel=1e-6)
        assert fit.beta == pytest.approx(MODEL[backend][1], rel=1e-6)
    assert len(fits) == 4
    out_dir = tmp_path / "plots"
    assert report.main([str(path), "--outdir", str(out_dir)]) == 0
    assert _pngs(out_dir) == ["ar_busbw.png", "ar_ratio.png", "projection.png"]
    out = capsys.readouterr().out
    assert "allreduce sweep, 4 ranks" in out and "#wrong total: 0" in out
    assert "       mpi     inplace       3.00       6.000" in out  # alpha us, beta GB/s
    assert "      ring  outofplace       9.00       4.000" in out
    assert "local ring inplace" in out and "assumed: typical published figure" in out
    for net in bc.NETWORKS:
        assert f"{net.name:>34} {net.alpha * 1e6:>10.1f} {net.beta / bc.GB:>11.2f}" in out


def test_projection_uses_the_compute_time_of_a_ddp_dump(tmp_path, capsys):
    ddp = write_rows(tmp_path / "ddp.h5", "ddp_breakdown", BREAKDOWN)
    dumps = [report.load(ddp)]
    rate, source = report.compute_rate(dumps, 100.0, 25 * 10**6)
    assert rate == pytest.approx(np.median([30.0, 50.0]) / 1e3 / 10**7)  # the largest model's rows
    assert "ddp.h5" in source
    rate, source = report.compute_rate([], 100.0, 25 * 10**6)
    assert rate == pytest.approx(4e-9) and "--compute-ms 100" in source
    assert report.main([str(ddp), "--no-plots", "--model-params", "10M", "--world-sizes", "8"]) == 0
    out = capsys.readouterr().out
    assert "4.000 ms per step per 1M parameters" in out  # 40 ms at 10M parameters
    comm_ms = float(bc.model_time(4e7, "allreduce", 8, 50e-6, 1.25e9, calls=2)) * 1e3
    assert f"{'10 GbE':>16} {'10M':>7} {8:>5} {2:>7} {comm_ms:>10.2f} {40.0:>11.2f}" in out
    assert list(tmp_path.glob("*.png")) == []


@pytest.mark.parametrize("split", [False, True])
def test_ddp_dumps_print_their_rows_and_plot(tmp_path, capsys, split):
    ddp = write_rows(tmp_path / "ddp.h5", "ddp_breakdown", {**BREAKDOWN, **(SPLIT if split else {})})
    scaling = write_rows(tmp_path / "scale.h5", "weak_scaling", SCALING if split else
                         {k: v for k, v in SCALING.items() if k != "backend"})
    dump = report.load(ddp)
    assert dump.rows["sync"].tolist() == BREAKDOWN["sync"] and dump.rows["params"].tolist() == BREAKDOWN["params"]
    assert report.main([str(ddp), str(scaling), "--outdir", str(tmp_path)]) == 0
    assert _pngs(tmp_path) == ["ddp_breakdown.png", "projection.png", "scale_efficiency.png"]
    out = capsys.readouterr().out
    assert "ddp_breakdown, 4 rows" in out and "weak_scaling, 6 rows" in out
    lines = out.splitlines()
    head = lines.index(next(x for x in lines if x.endswith("ddp_breakdown, 4 rows")))
    assert lines[head + 1].split()[:len(report.BREAKDOWN_COLUMNS)] == list(report.BREAKDOWN_COLUMNS)
    assert lines[head + 1].split()[len(report.BREAKDOWN_COLUMNS):] == (list(SPLIT) if split else [])
    assert lines[head + 5].split()[:4] == ["large", "10000000", "overlap", "ring"]  # strings decoded
    assert "0.09091" in lines[head + 5] and " 10500" in lines[head + 3]  # 4 significant digits, whole from 1e4


def test_report_reads_a_sweep_made_by_the_script_under_mpirun(tmp_path, capsys, run_script):
    path = tmp_path / "ar.h5"
    done = run_script(2, "allreduce.py", "-b", "8", "-e", "4K", "-f", "8", "--iters", "3", "--warmup", "1",
                      "--budget", "0.001", "--out", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("# npddp allreduce sweep: 2 ranks") == 1 and "(OK)" in done.stdout
    assert report.main([str(path), "--outdir", str(tmp_path / "plots")]) == 0
    assert _pngs(tmp_path / "plots") == ["ar_busbw.png", "ar_ratio.png", "projection.png"]
    out = capsys.readouterr().out
    assert "allreduce sweep, 2 ranks" in out and "#wrong total: 0" in out
    fit_lines = out.split("alpha-beta fit")[1].split("\n\n")[0].splitlines()[2:]
    from npddp.comm import BACKENDS
    assert sorted(line.split()[0] for line in fit_lines) == sorted(list(BACKENDS) * 2)


def _corrupt(path):
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes())


def _foreign(path):
    with h5py.File(path, "w") as f:
        f["data"] = np.arange(3)


def _unknown_kind(path):
    with h5py.File(path, "w") as f:
        f.attrs["kind"] = "something_else"
        f.attrs["schema_version"] = 1


def _newer_schema(path):
    write_rows(path, "weak_scaling", SCALING)
    with h5py.File(path, "a") as f:
        f.attrs["schema_version"] = runinfo.SCHEMA_VERSION + 1


def _missing_column(path):
    write_rows(path, "ddp_breakdown", {k: v for k, v in BREAKDOWN.items() if k != "comm_time_ms"})


def _ragged_rows(path):
    write_rows(path, "weak_scaling", {**SCALING, "efficiency": [1.0, 0.5]})


def _truncated_sweep(path):
    synthetic_sweep(path)
    with h5py.File(path, "a") as f:
        del f["ring/inplace/time_median_s"]


def _cut_file(path):
    synthetic_sweep(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


@pytest.mark.parametrize("make, message", [
    (None, "no such file"),
    (_corrupt, "not a readable HDF5 file"),
    (_foreign, "no 'kind' attribute; not an npddp benchmark dump"),
    (_unknown_kind, "unknown kind 'something_else'"),
    (_newer_schema, "schema_version 2 is not one this report reads"),
    (_missing_column, "lacks column(s) comm_time_ms"),
    (_ragged_rows, "must be 1-D and of one length"),
    (_truncated_sweep, "malformed allreduce_sweep"),
    (_cut_file, "dump.h5: "),
])
def test_unreadable_dumps_give_one_line_and_exit_2(tmp_path, capsys, make, message):
    good = synthetic_sweep(tmp_path / "good.h5")
    path = tmp_path / "dump.h5"
    if make is not None:
        make(path)
    assert report.main([str(good), str(path), "--outdir", str(tmp_path / "plots")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and not (tmp_path / "plots").exists()  # nothing printed or drawn before the error
    assert err.count("\n") == 1 and err.startswith(f"report.py: error: {path}") and message in err, err
    assert "Traceback" not in err


def test_a_directory_is_not_a_dump(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "not a regular file" in capsys.readouterr().err
