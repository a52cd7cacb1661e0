"""Tests of benchmarks/report.py and its plots: tables, fits, figures, and the refusal of malformed dumps.

Dumps come from the ``dumps`` fixture (each producer on one rank), from rows that follow a
known cost model exactly, or from the sweep script under ``mpirun -n 2``. Malformed dumps are
made by mutating a sound one in every way the checker knows, for every kind of dump.
"""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pandas as pd
import pytest

from benchmarks import _costmodel as cm
from benchmarks import _plots as plots
from benchmarks import collectives as ar
from benchmarks import report
from benchmarks import results
from benchmarks.columns import FLOAT, INT, KINDS, STR
from npddp.comm import BACKENDS

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"
MODEL = {"raw": (2e-6, 6e9), "mpi": (3e-6, 6e9), "ring": (9e-6, 4e9)}  # backend -> (alpha s, bandwidth B/s) of the synthetic sweep


def synthetic_sweep(path, n=4):
    """A sweep dump whose median times follow MODEL exactly, rows built by the benchmark's own row()."""
    cfg = ar.parse_config(["--backends", "mpi,ring", "-b", "8", "-e", "16M", "-f", "4"], verbose=False)
    rows = []
    for count in ar.sizes(cfg, n):
        for g in ar.groups(cfg):
            alpha, beta = MODEL[g.backend]
            t = float(cm.model_time(count * 4, "allreduce", n, alpha, beta))
            rows.append(ar.row(cfg, g, g.backend, n, int(count), t * np.array([0.9, 1.0, 1.1]), 0))
    results.write_dump(path, "allreduce_sweep", rows, world_size=n,
                       attrs={"collective": "allreduce", "dtype": "float32", "op": "sum"})
    return path


def test_a_backend_that_picks_per_call_says_what_it_ran(tmp_path, capsys):
    cfg = ar.parse_config(["--backends", "mpi,auto", "-b", "8", "-e", "64K", "-f", "8"], verbose=False)
    rows = []
    for count in ar.sizes(cfg, 2):
        for g in ar.groups(cfg):
            algorithm = g.backend if g.backend in ("mpi", "raw") else ("rd" if count * 4 < 4096 else "ring")
            rows.append(ar.row(cfg, g, algorithm, 2, int(count), np.array([1e-5, 2e-5, 3e-5]) * count ** 0.5, 0))
    path = tmp_path / "auto.h5"
    results.write_dump(path, "allreduce_sweep", rows, world_size=2,
                       attrs={"collective": "allreduce", "dtype": "float32", "op": "sum"})
    df, meta = results.read_table(path), results.read_meta(path)
    assert _legend(plots.sweep_busbw(df, meta)) == ["raw out-of-place", "raw in-place", "mpi out-of-place",
                                                    "mpi in-place", "auto out-of-place (ran rd, ring)",
                                                    "auto in-place (ran rd, ring)"]
    assert report.main([str(path), "--no-plots"]) == 0
    out = capsys.readouterr().out
    table = out.split("algorithm each backend that picks per call ran:\n")[1].split("#wrong")[0].splitlines()
    assert table[0].split()[1:] == ["auto", "outofplace", "auto", "inplace"]
    assert [line.split()[1:] for line in table[2:]] == [["rd", "rd"]] * 3 + [["ring", "ring"]] * 2  # 8..512 B, 4K, 32K
    assert re.search(r"^ +rd serial +ring serial +rd overlap +ring overlap$", out, re.MULTILINE)  # what auto ran


def _written(directory):
    """Names of the files in ``directory``, after checking each PNG and SVG is one."""
    found = sorted(p.name for p in directory.iterdir())
    for name in found:
        data = (directory / name).read_bytes()
        assert data[:8] == PNG if name.endswith(".png") else b"<svg" in data[:400], name
    return found


def test_sweep_fits_recover_the_model_and_the_tables_show_ratios(tmp_path, capsys):
    path = synthetic_sweep(tmp_path / "ar.h5")
    df, meta = results.read_table(path), results.read_meta(path)
    fits = report.sweep_fits(df, meta)
    assert sorted(fits) == ["mpi inplace", "mpi outofplace", "raw inplace", "raw outofplace", "ring inplace",
                            "ring outofplace"]
    for series, fit in fits.items():
        alpha, beta = MODEL[series.split()[0]]
        assert fit.alpha == pytest.approx(alpha, rel=1e-6) and fit.bandwidth == pytest.approx(beta, rel=1e-6)
    assert report.main([str(path), "--no-plots"]) == 0
    assert "median time / raw's" in capsys.readouterr().out   # the default baseline: MPI as a program sees it
    assert report.main([str(path), "--no-plots", "--baseline", "mpi"]) == 0
    out = capsys.readouterr().out
    assert "allreduce sweep, 4 ranks" in out and "#wrong total: 0" in out
    ratios = out.split("median time / mpi's")[1].split("#wrong")[0].splitlines()
    last = ratios[-1].split()  # 8M, the largest size: raw/mpi (out of place, in place), ring/mpi of the model times
    del last[1:3]
    want = (cm.model_time(8 << 20, "allreduce", 4, *MODEL["ring"])
            / cm.model_time(8 << 20, "allreduce", 4, *MODEL["mpi"]))
    assert last[0] == "8M" and float(last[1]) == pytest.approx(want, abs=0.005)
    assert re.search(r"mpi inplace\s+3\.000\s+6\.000\s+0\.000", out)  # alpha us, bandwidth GB/s, rel.rms
    assert "local ring inplace" in out and "assumed: typical published figure" in out
    assert "not projected (no cost model in benchmarks/_costmodel.py): raw, mpi" in out
    assert re.search(r"ring serial\s+ring overlap", out)  # projected: the sweep's modelled algorithm


def test_projection_uses_the_compute_time_of_a_ddp_dump(dumps, capsys):
    df = results.read_table(dumps["ddp_breakdown"])
    rate, source = report.compute_rate([(dumps["ddp_breakdown"], df)], 100.0, 25 * 10**6)
    assert rate == pytest.approx(np.median(df["compute_ms"] / df["params"]) / 1e3)
    assert "ddp_breakdown.h5" in source and "1.07M-parameter" in source
    rate, source = report.compute_rate([], 100.0, 25 * 10**6)
    assert rate == pytest.approx(4e-9) and source == "assumed 100 ms per step at 25M parameters"
    assert report.main([str(dumps["weak_scaling"]), "--no-plots", "--model-params", "10M", "--world-sizes", "8",
                        "--plot-params", "10M"]) == 0
    out = capsys.readouterr().out
    assert "4.000 ms per step per 1M parameters" in out  # 40 ms at 10M parameters
    eff = {a: 0.04 / (0.04 + float(cm.model_time(4e7, "allreduce", 8, 50e-6, 1.25e9, calls=2, algorithm=a)))
           for a in cm.ALLREDUCE_MODELS}
    row = re.search(r"^10 GbE\s+10M\s+8\s+(.*)$", out, re.MULTILINE).group(1).split()
    assert [float(v) for v in row[:len(eff)]] == pytest.approx([eff[a] for a in cm.ALLREDUCE_MODELS], abs=6e-4)


@pytest.mark.slow
def test_every_kind_prints_its_table_and_writes_its_plots(dumps, tmp_path, capsys):
    out_dir = tmp_path / "plots"
    assert report.main([str(p) for p in dumps.values()] + ["--outdir", str(out_dir), "--dpi", "40"]) == 0
    names = ["allreduce_sweep_busbw", "allreduce_sweep_ratio", "ddp_breakdown_breakdown", "parallelism", "projection",
             "weak_scaling_efficiency"]
    assert _written(out_dir) == sorted(f"{n}.png" for n in names)
    out = capsys.readouterr().out
    for heading in ("allreduce sweep, 1 ranks", "DDP step breakdown, 1 ranks", "weak scaling", "torch_compare",
                    "DDP projection", "parallelism across networks"):
        assert heading in out, heading
    summary = out.split("weak scaling\n")[1].splitlines()
    assert summary[0].split()[:6] == ["model", "sync", "backend", "bucket_mb", "world_size", "efficiency_median"]
    assert "ratio_to_torch" in out and "ddp_efficiency" in out
    assert report.main([str(dumps["torch_compare"]), "--outdir", str(tmp_path / "svg"), "--format", "svg,png"]) == 0
    assert _written(tmp_path / "svg") == ["projection.png", "projection.svg"]


# ----------------------------------------------------------------------------- plots

def _legend(owner):
    """Texts of an axes' legend, or of a figure's (first) legend."""
    legend = owner.legends[0] if hasattr(owner, "legends") else owner.get_legend()
    return [t.get_text() for t in legend.get_texts()]


def _says_where_and_when(fig, meta, what):
    """The figure's title names what was measured, the host, N, the MPI library and the date."""
    title = fig.get_suptitle()
    assert what in title, title
    for part in (meta["host"], f"N={meta['world_size']}", meta["time_utc"][:10], "numpy", "mpi4py",
                 meta["mpi_library"].split()[0]):
        assert part in title, (part, title)


def test_sweep_plots_label_their_axes_series_and_bands(tmp_path):
    path = synthetic_sweep(tmp_path / "ar.h5")
    df, meta = results.read_table(path), results.read_meta(path)
    fig = plots.sweep_busbw(df, meta)
    ax = fig.axes[0]
    _says_where_and_when(fig, meta, "allreduce bus bandwidth vs size")
    assert ax.get_xlabel() == "message size (bytes)" and ax.get_ylabel().startswith("bus bandwidth (GB/s")
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert _legend(fig) == ["raw out-of-place", "raw in-place", "mpi out-of-place", "mpi in-place",
                            "ring out-of-place", "ring in-place"]
    assert len(ax.collections) == 6  # one p10-p90 band per series
    fig = plots.sweep_ratio(df, meta, "mpi")
    ax = fig.axes[0]
    _says_where_and_when(fig, meta, "allreduce time relative to mpi")
    assert ax.get_ylabel() == "median time / mpi median time (> 1: slower)"
    assert _legend(fig) == ["raw out-of-place", "raw in-place", "ring out-of-place", "ring in-place", "mpi (1.0)"]
    assert plots.sweep_ratio(df, meta, "naive") is None  # no baseline in the data: no ratio plot


def test_breakdown_plot_normalises_each_step_and_prints_milliseconds(dumps):
    df, meta = results.read_table(dumps["ddp_breakdown"]), results.read_meta(dumps["ddp_breakdown"])
    fig = plots.breakdown(df, meta)
    _says_where_and_when(fig, meta, "DDP step breakdown")
    legend_row, ax = fig.axes[:2]           # the legend has a row of its own above the models
    assert ax.get_xlabel() == "share of the step time (%)" and ax.get_title(loc="left").startswith("tiny (1.07M")
    assert [t.get_text() for t in legend_row.get_legend().get_texts()] == [s[0] for s in plots.SEGMENTS]
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"{s} {b}" + (" 1 MiB" if s == "overlap" else "")
                                                          for s, b in zip(df["sync"], df["backend"])]
    ends = {}
    for patch in ax.patches:  # every bar ends at 100% (of the step, or of the parts when they add up to more)
        y = round(patch.get_y(), 3)
        ends[y] = max(ends.get(y, 0), patch.get_x() + patch.get_width())
    assert len(ends) == len(df) and all(abs(e - 100) < 1e-9 for e in ends.values())
    notes = [t.get_text() for t in ax.texts if t.get_text().endswith(("ms", ")")) or ", eff " in t.get_text()]
    assert [n.split(" ms")[0] for n in notes] == [f"{v:.1f}" for v in df["step_ms"]]
    assert all(", eff " in n for n in notes)  # --no-comm rows present: every bar says its DDP efficiency


def _scaling_frame(spread):
    """A weak-scaling table of two repeats whose efficiencies differ by ``spread`` at N = 2."""
    rows = []
    for repeat in (0, 1):
        for backend, eff in (("mpi", 0.9), ("none", 1.0)):
            for n in (1, 2):
                e = 1.0 if n == 1 else eff * (1 + spread * repeat)
                rows.append({"model": "tiny", "sync": "overlap", "backend": backend, "bucket_mb": 25.0,
                             "world_size": n, "repeat": repeat, "efficiency": e,
                             "ddp_efficiency": e / (1.0 if backend == "none" else 1.05)})
    return pd.DataFrame(rows)


def test_scaling_plot_has_error_bars_the_ceiling_and_warns_on_spread(dumps):
    meta = results.read_meta(dumps["weak_scaling"])
    fig = plots.scaling(_scaling_frame(0.05), meta)
    _says_where_and_when(fig, {**meta, "world_size": "1..2"}, "DDP weak scaling, 2 repeat(s)")
    left, right = fig.axes
    assert left.get_xlabel() == "world size N (ranks)" and left.get_ylabel().startswith("weak-scaling efficiency")
    assert right.get_ylabel() == "DDP efficiency (step with no comm / step)"
    assert _legend(left) == ["mpi", "no-comm ceiling"] and _legend(right) == ["mpi"]
    assert [t.get_text() for t in left.get_xticklabels()] == ["1", "2"]
    assert fig.get_supxlabel() == ""  # spread 5%: no warning
    fig = plots.scaling(_scaling_frame(0.3), meta)
    warning = fig.findobj(lambda a: getattr(a, "get_gid", lambda: None)() == "spread-warning")[0]
    assert "spread over repeats > 20%" in warning.get_text() and "mpi N=2" in warning.get_text()
    real = plots.scaling(results.read_table(dumps["weak_scaling"]), meta)
    assert "no-comm ceiling" in _legend(real.axes[0])


def test_projection_plot_draws_one_line_per_algorithm_in_the_data():
    proj = report.projection_frame(cm.project_ddp([25 * 10**6], [2, 64, 1024], 4e-9, algorithms=("tree", "rd")))
    fig = plots.projection(proj, {"host": "h", "world_size": 2}, 25 * 10**6, "compute assumed")
    assert len(fig.axes) == len(cm.NETWORKS)
    assert [ax.get_title() for ax in fig.axes] == [n.name for n in cm.NETWORKS]
    assert _legend(fig.axes[0]) == ["tree", "rd"] and fig.axes[0].get_legend().get_title().get_text() == "algorithm"
    assert fig.axes[0].get_ylabel() == "projected efficiency, no overlap"
    assert "25M-parameter model" in fig.get_suptitle()


# ----------------------------------------------------------------------------- running it

@pytest.mark.slow
def test_runs_by_path_from_anywhere_and_as_a_module(dumps, tmp_path):
    by_path = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report.py"), str(dumps["torch_compare"]),
                              "--no-plots"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert by_path.returncode == 0, by_path.stderr
    as_module = subprocess.run([sys.executable, "-m", "benchmarks.report", str(dumps["torch_compare"]), "--no-plots"],
                               capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert as_module.returncode == 0, as_module.stderr
    assert by_path.stdout == as_module.stdout and "torch_compare" in by_path.stdout


@pytest.mark.slow
def test_report_reads_a_sweep_made_by_the_script_under_mpirun(tmp_path, capsys, run_script):
    path = tmp_path / "ar.h5"
    done = run_script(2, "allreduce.py", "-b", "8", "-e", "4K", "-f", "8", "--iters", "3", "--warmup", "1",
                      "--budget", "0.001", "--out", str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("# npddp allreduce: 2 ranks") == 1 and "# Wrong values       : 0 OK" in done.stdout
    assert report.main([str(path), "--outdir", str(tmp_path / "plots")]) == 0
    assert _written(tmp_path / "plots") == ["ar_busbw.png", "ar_ratio.png", "projection.png"]
    out = capsys.readouterr().out
    assert "allreduce sweep, 2 ranks" in out and "#wrong total: 0" in out
    fits = out.split("alpha-beta fit")[1].split("\n\n")[0].splitlines()[2:]
    assert sorted(line.split()[0] for line in fits) == sorted(["raw", *BACKENDS] * 2)  # every backend, both places
    header = re.search(r"^ +(\S+ serial .*)$", out, re.MULTILINE).group(1).split()
    assert header[::2] == [a for a in BACKENDS if cm.modelled(a)] * 2  # the sweep's algorithms with a model
    assert header[1::2] == ["serial"] * (len(header) // 4) + ["overlap"] * (len(header) // 4)


# ----------------------------------------------------------------------------- malformed dumps

def _first(spec, test):
    """The first column of ``spec`` for which ``test(column)`` holds (None if none)."""
    return next((c for c in spec.columns if test(c)), None)


def _replace(f, name, data, unit=None, doc="replaced"):
    """Replace column ``name`` of /table by ``data`` (keeping its unit unless given)."""
    old = f["table"][name]
    unit = old.attrs["unit"] if unit is None else unit
    del f["table"][name]
    f["table"][name] = data
    f["table"][name].attrs.update({"unit": unit, "doc": doc})


def _column_data(f, name):
    """A column's values (text decoded)."""
    ds = f["table"][name]
    return ds.asstr()[()] if h5py.check_string_dtype(ds.dtype) else ds[()]


def mutations(spec):
    """(label, expected field, mutate(f)) for every way to break a dump of ``spec``'s kind."""
    num = _first(spec, lambda c: c.type == INT and c.name != "world_size")
    text = _first(spec, lambda c: c.type == STR)
    timed = [c.name for c in spec.columns if c.type == FLOAT and c.positive and not c.nan_ok]
    bounded = _first(spec, lambda c: c.type == INT and c.low is not None and c.name != "world_size")
    floats = _first(spec, lambda c: c.type == FLOAT)
    chosen = _first(spec, lambda c: c.choices)
    rows = lambda f: f["table"][spec.names[0]].shape[0]  # noqa: E731

    def attr(name, value=None):
        def mutate(f):
            if value is None:
                del f.attrs[name]
            else:
                f.attrs[name] = value
        return mutate

    out = [("no kind", "attribute 'kind'", attr("kind")),
           ("foreign kind", "attribute 'kind'", attr("kind", "something_else")),
           ("kind an array", "attribute 'kind'", attr("kind", np.array([1, 2]))),
           ("no schema version", "attribute 'schema_version'", attr("schema_version")),
           ("version 1", "attribute 'schema_version'", attr("schema_version", 1)),
           ("future version", "attribute 'schema_version'", attr("schema_version", results.SCHEMA_VERSION + 1)),
           ("no world_size", "attribute 'world_size'", attr("world_size")),
           ("world_size 'two'", "attribute 'world_size'", attr("world_size", "two")),
           ("world_size 0", "attribute 'world_size'", attr("world_size", 0)),
           ("world_size an array", "attribute 'world_size'", attr("world_size", np.array([2, 2]))),
           ("world_size column disagrees", "column 'world_size'",
            lambda f: f["table"]["world_size"].__setitem__(0, 99)),
           ("no table", "group '/table'", lambda f: f.__delitem__("table")),
           ("no numeric column", f"column '{num.name}'", lambda f: f["table"].__delitem__(num.name)),
           ("no text column", f"column '{text.name}'", lambda f: f["table"].__delitem__(text.name)),
           ("text in an int column", f"column '{num.name}'",
            lambda f: _replace(f, num.name, np.array(["1"] * rows(f), dtype=h5py.string_dtype()))),
           ("numbers in a text column", f"column '{text.name}'",
            lambda f: _replace(f, text.name, np.arange(rows(f)))),
           ("NaN in an int column", f"column '{num.name}'",
            lambda f: _replace(f, num.name, np.full(rows(f), np.nan))),
           ("NaN time", f"column '{timed[0]}'", lambda f: f["table"][timed[0]].__setitem__(0, np.nan)),
           ("inf time", f"column '{timed[-1]}'", lambda f: f["table"][timed[-1]].__setitem__(-1, np.inf)),
           ("all-zero times", f"column '{timed[0]}'",
            lambda f: [f["table"][name].__setitem__(slice(None), 0.0) for name in timed]),
           ("negative time", f"column '{timed[0]}'", lambda f: f["table"][timed[0]].__setitem__(0, -1.0)),
           ("below the lower bound", f"column '{bounded.name}'",
            lambda f: f["table"][bounded.name].__setitem__(0, int(bounded.low) - 1)),
           ("ragged column", f"column '{floats.name}'",
            lambda f: _replace(f, floats.name, np.ones(rows(f) + 1))),
           ("2-D column", f"column '{floats.name}'", lambda f: _replace(f, floats.name, np.ones((rows(f), 2)))),
           ("no unit", f"column '{floats.name}' attribute 'unit'",
            lambda f: f["table"][floats.name].attrs.__delitem__("unit")),
           ("wrong unit", f"column '{floats.name}' attribute 'unit'",
            lambda f: f["table"][floats.name].attrs.__setitem__("unit", "furlongs")),
           ("no doc", f"column '{text.name}' attribute 'doc'",
            lambda f: f["table"][text.name].attrs.__delitem__("doc")),
           ("empty table", "group '/table'",
            lambda f: [_replace(f, c.name, np.zeros(0, dtype=h5py.string_dtype() if c.type == STR else
                                                    np.int64 if c.type == INT else np.float64), c.unit)
                       for c in spec.columns]),
           ("empty text", f"column '{text.name}'",
            lambda f: _replace(f, text.name, np.array([""] * rows(f), dtype=h5py.string_dtype()))),
           ("bytes that are not UTF-8", f"column '{text.name}'",
            lambda f: _replace(f, text.name, np.array([b"\xff\xfe"] * rows(f)))),
           ("min above max", f"columns '{spec.ordered[0][0]}'",
            lambda f: f["table"][spec.ordered[0][0]].__setitem__(0, 1e9))]
    if chosen is not None:
        out.append(("a value not among the choices", f"column '{chosen.name}'",
                    lambda f: _replace(f, chosen.name, np.array(["sideways"] * rows(f),
                                                                dtype=h5py.string_dtype()))))
    for c in spec.attrs[3:]:
        out += [(f"no {c.name}", f"attribute '{c.name}'", attr(c.name)),
                (f"{c.name} a number", f"attribute '{c.name}'", attr(c.name, 7))]
    for r in spec.raw:
        out.append((f"raw {r.name} with the wrong rows", f"dataset '/raw/{r.name}'",
                    lambda f, r=r: _replace_raw(f, r.name)))
    return out


def _replace_raw(f, name):
    """A raw array of the wrong shape."""
    del f["raw"][name]
    f["raw"][name] = np.ones((1, 1))


CASES = [(kind, *m) for kind, spec in KINDS.items() for m in mutations(spec)]
LINE = re.compile(r"^report\.py: error: (\S+): (attribute|column|columns|group|dataset) '[^']+'.*"
                  r": expected .+, got .+$")


def test_there_are_at_least_80_ways_to_break_a_dump():
    assert len(CASES) >= 80 and len({(k, label) for k, label, _, _ in CASES}) == len(CASES)


@pytest.mark.parametrize("kind, label, field, mutate", CASES, ids=[f"{c[0]}: {c[1]}" for c in CASES])
def test_a_malformed_dump_is_one_line_per_violation_and_exit_2(dumps, tmp_path, capsys, kind, label, field, mutate):
    bad = tmp_path / f"{kind}.h5"
    shutil.copy(dumps[kind], bad)
    with h5py.File(bad, "a") as f:
        mutate(f)
    out_dir = tmp_path / "plots"
    good = [str(dumps["allreduce_sweep"])] if kind == "torch_compare" else []  # a sound dump first changes nothing
    assert report.main(good + [str(bad), "--outdir", str(out_dir)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and not out_dir.exists()  # nothing printed or drawn: every dump is checked first
    lines = err.splitlines()
    assert lines and all(LINE.match(line) and LINE.match(line).group(1) == str(bad) for line in lines), err
    assert any(f"{bad}: {field}" in line for line in lines), (field, err)
    assert "Traceback" not in err


def test_breakdown_table_shows_the_bare_ceiling_only_when_measured(dumps, tmp_path):
    from mpi4py import MPI

    from benchmarks import ddp as bd
    without = report.breakdown_table(results.read_table(dumps["ddp_breakdown"]))
    assert "ddp_efficiency" in without and "bare_efficiency" not in without
    path = tmp_path / "bare.h5"
    assert bd.main(["--batch", "4", "--steps", "2", "--warmup", "0", "--models", "tiny", "--syncs", "overlap",
                    "--bucket-mb", "1", "--backends", "mpi", "--no-comm", "--bare", "--out", str(path)],
                   mpi_comm=MPI.COMM_SELF) == 0
    df = results.read_table(path)
    table = report.breakdown_table(df).splitlines()
    assert table[0].split()[-1] == "bare_efficiency"
    bare_row = next(line for line in table[1:] if line.split()[2] == "bare")
    assert float(bare_row.split()[-1]) == 1.0


def _trace(path):
    """A two-rank trace of step 1 (backward, one bucket's all-reduce, optimizer) written to ``path``."""
    import json
    from npddp.util.tracing import chrome
    events = np.array([[0, chrome.COMPUTE, 100_000, 500_000, 1], [1, chrome.COMM, 300_000, 700_000, 1],
                       [2, chrome.OPTIMIZER, 800_000, 900_000, 1]], dtype=np.int64)
    names = ["backward", 'all-reduce bucket 0\x1f{"bucket": 0}', "optimizer step"]
    doc = chrome.document([chrome.RankPart(r, events, names) for r in (0, 1)], {"job": 1, "trace_steps": [1, 1]})
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("plots", [[], ["--no-plots"]], ids=["plots", "no-plots"])
def test_a_trace_step_not_in_the_trace_is_one_line_before_any_table(dumps, tmp_path, capsys, plots):
    trace = _trace(tmp_path / "t.json")
    out_dir = tmp_path / "plots"
    assert report.main([str(dumps["ddp_breakdown"]), str(trace), "--trace-step", "99", "--outdir", str(out_dir),
                        *plots]) == 2
    out, err = capsys.readouterr()
    assert out == "" and not out_dir.exists(), out
    assert err.splitlines() == [f"report.py: error: {trace}: --trace-step: step 99 is not in the trace; "
                                "traced steps: [1]"], err
    assert report.main([str(trace), "--trace-step", "1", "--no-plots"]) == 0    # the step it has: its summary
    assert "all-reduce bucket 0" in capsys.readouterr().out


def test_a_trace_without_matplotlib_prints_its_summary_and_one_line_instead_of_plots(tmp_path, capsys, monkeypatch):
    trace = _trace(tmp_path / "t.json")
    monkeypatch.setitem(sys.modules, "matplotlib", None)          # import matplotlib raises ImportError
    assert report.main([str(trace), "--outdir", str(tmp_path / "plots")]) == 0
    out, err = capsys.readouterr()
    assert "all-reduce bucket 0" in out and not (tmp_path / "plots").exists()
    assert err.splitlines() == ["report.py: matplotlib is not installed (pip install matplotlib); no plots"], err


@pytest.mark.parametrize("name", ["deep.json", "deep.h5"])
def test_a_file_of_brackets_is_one_line_and_exit_2(tmp_path, capsys, name):
    path = tmp_path / name
    path.write_text("[" * 100_000)
    assert report.main([str(path), "--no-plots"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith(f"report.py: error: {path}"), err


def test_sweeps_of_several_collectives_get_one_table_of_mpi_beside_npddps_fastest(tmp_path, capsys):
    times = {"raw": 1e-5, "mpi": 2e-5, "ring": 4e-5, "naive": 3e-5}   # seconds per call at every size
    paths = []
    for collective in ("allgather", "broadcast", "alltoall"):
        backends = "raw" if collective == "alltoall" else "raw,mpi,ring,naive"
        cfg = ar.parse_config(["--collective", collective, "--backends", backends, "-b", "1K", "-e", "64K", "-f", "64"],
                              verbose=False)
        rows = [ar.row(cfg, g, g.backend, 2, int(count), times[g.backend] * np.array([0.9, 1.0, 1.1]), 0)
                for count in ar.sizes(cfg, 2) for g in ar.groups(cfg)]
        paths.append(tmp_path / f"{collective}.h5")
        results.write_dump(paths[-1], "allreduce_sweep", rows, world_size=2,
                           attrs={"collective": collective, "dtype": "float32", "op": "none"})
    assert report.main([str(p) for p in paths] + ["--outdir", str(tmp_path / "plots"), "--dpi", "40"]) == 0
    out = capsys.readouterr().out
    table = out.split("== every collective")[1].split("\n\n")[0].splitlines()[2:]
    cells = [line.split() for line in table]
    assert [c[:3] for c in cells] == [[c, p, s] for c, p in (("allgather", "outofplace"), ("broadcast", "inplace"),
                                                             ("alltoall", "outofplace")) for s in ("1K", "64K")]
    for c in cells[:4]:   # npddp's fastest (naive, 30 us) against the bare MPI loop (10 us)
        assert c[3:] == ["10.00", "naive", "30.00", "3.00"]
    assert all(c[4] == "-" and c[5] == c[6] == "NaN" for c in cells[4:])   # all-to-all: MPI's alone, until npddp has one
    for collective in ("allgather", "broadcast", "alltoall"):   # each collective its own figures
        assert (tmp_path / "plots" / f"{collective}_busbw.png").exists()
    report.main([str(paths[0]), "--no-plots"])
    assert "== every collective" not in capsys.readouterr().out   # one collective: its own tables say it all
