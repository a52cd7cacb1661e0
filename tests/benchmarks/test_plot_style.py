"""The report's figures read alike: one colour per backend in every figure, a breakdown whose bars end at
100% with its legend on top and a bounded height, and titles in words rather than command-line flags."""

import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_hex

from benchmarks import _costmodel as cm
from benchmarks import _plots as plots
from benchmarks import report
from benchmarks.columns import NO_COMM
from npddp.comm import BACKENDS

META = {"host": "h", "cpu_model": "cpu", "world_size": 2, "time_utc": "2026-11-25T00:00:00",
        "mpi_library": "MPICH Version: 5.0.2", "collective": "allreduce", "dtype": "float32"}


def sweep(backends, transports=("mpi",)):
    """A sweep table: every backend, transport and place at four sizes, times growing with size."""
    rows = []
    for i, backend in enumerate(backends):
        for transport in transports:
            for place in ("outofplace", "inplace"):
                for nbytes in (1024, 4096, 16384, 65536):
                    t = (1e-5 + nbytes / 1e9) * (1 + 0.1 * i)
                    bw = nbytes / t / 1e9
                    rows.append({"backend": backend, "transport": transport, "place": place, "buffers": "shared",
                                 "algorithm": backend,
                                 "bytes": nbytes, "time_median_s": t, "time_p10_s": 0.9 * t, "time_p90_s": 1.1 * t,
                                 "algbw_GBps": bw, "busbw_GBps": bw})
    return pd.DataFrame(rows)


def line_colours(ax) -> dict:
    """Backend (the first word of the label) -> the colours of its lines."""
    out = {}
    for line in ax.get_lines():
        label = line.get_label()
        if not label.startswith("_") and "(1.0)" not in label:
            out.setdefault(label.split()[0].split("/")[0], set()).add(to_hex(line.get_color()))
    return out


def test_every_backend_has_its_own_fixed_colour():
    colours = [plots.backend_colour(b) for b in (*BACKENDS, "gloo", NO_COMM)]
    assert len(set(colours)) == len(colours)
    assert plots.backend_colour("ring/tcp") == plots.backend_colour("ring")
    assert plots.backend_colour("my_algo") == plots.backend_colour("my_algo") in plots._SPARE


@pytest.mark.parametrize("order", [("mpi", "ring", "auto", "shm"), ("shm", "auto", "ring", "mpi"),
                                   ("ring", "shm")])
def test_a_backend_has_the_same_colour_in_the_bandwidth_and_the_ratio_plots(order):
    df = sweep(order)
    figures = [plots.sweep_busbw(df, META)]
    if "mpi" in order:
        figures.append(plots.sweep_ratio(df, META, "mpi"))     # mpi itself is left out of the series here
    for fig in figures:
        seen = line_colours(fig.axes[0])
        assert set(seen) == set(order) - ({"mpi"} if fig is not figures[0] else set())
        for backend, colours in seen.items():
            assert colours == {to_hex(plots.backend_colour(backend))}, (backend, colours)


def test_transports_of_one_backend_share_its_colour_and_differ_in_marker():
    fig = plots.sweep_busbw(sweep(("ring", "auto"), transports=("mpi", "tcp")), META)
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    assert to_hex(lines["ring tcp in-place"].get_color()) == to_hex(lines["ring mpi in-place"].get_color())
    assert lines["ring tcp in-place"].get_marker() != lines["ring mpi in-place"].get_marker()


def scaling_frame(backends, syncs=("overlap",)):
    rows = []
    for repeat in (0, 1):
        for backend in backends:
            for sync in syncs:
                for n in (1, 2):
                    e = 1.0 if n == 1 else 0.9
                    rows.append({"model": "tiny", "sync": sync, "backend": backend, "bucket_mb": 25.0,
                                 "world_size": n, "repeat": repeat, "efficiency": e, "ddp_efficiency": e})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("syncs", [("overlap",), ("overlap", "bucketed")])
def test_scaling_and_projection_use_the_backend_colours(syncs):
    fig = plots.scaling(scaling_frame(("auto", "mpi", NO_COMM), syncs), META)
    checked, markers = 0, {}
    for ax in fig.axes:
        for series in ax.containers:                         # one errorbar container per series
            words = series.get_label().split()
            backend = NO_COMM if words[0] == "no-comm" else [w for w in words if w in ("auto", "mpi")][0]
            line = series.lines[0]
            assert to_hex(line.get_color()) == to_hex(plots.backend_colour(backend)), series.get_label()
            markers.setdefault(backend, set()).add(line.get_marker())
            checked += 1
    assert checked == 3 * len(syncs) + 2 * len(syncs)         # left: 2 backends + ceiling; right: 2 backends
    if len(syncs) > 1:      # two series of one backend: same colour, a marker each
        assert all(len(m) == 2 for b, m in markers.items() if b != NO_COMM), markers
    proj = report.projection_frame(cm.project_ddp([25 * 10**6], [2, 64], 4e-9, algorithms=("tree", "ring", "rd")))
    fig = plots.projection(proj, META, 25 * 10**6, "compute assumed")
    for ax in fig.axes:
        for line in ax.get_lines():
            assert to_hex(line.get_color()) == to_hex(plots.backend_colour(line.get_label()))


def breakdown_frame(models=("tiny", "small", "medium"), backends=("mpi", "ring", "auto", NO_COMM),
                    syncs=("per_param", "bucketed", "overlap", "flat"), excess=1.0):
    """Breakdown rows; ``excess`` > 1 makes the measured parts add up to more than the step."""
    rows = []
    for m, model in enumerate(models):
        for sync in syncs:
            for backend in backends:
                step = 10.0 * (m + 1)
                part = step / 5 * excess * 0.95
                rows.append({"model": model, "params": 10**6 * (m + 1), "sync": sync, "backend": backend,
                             "transport": "mpi", "bucket_mb": 25.0, "batch": 64, "step_ms": step,
                             "forward_ms": part, "backward_ms": part, "comm_issued_ms": part,
                             "comm_exposed_ms": part, "optimizer_ms": part,
                             "ddp_efficiency": 1.0 if backend == NO_COMM else 0.9})
    return pd.DataFrame(rows)


def bar_ends(ax) -> dict:
    ends = {}
    for patch in ax.patches:
        y = round(patch.get_y(), 3)
        ends[y] = max(ends.get(y, 0.0), patch.get_x() + patch.get_width())
    return ends


@pytest.mark.parametrize("excess", [0.5, 1.0, 1.6, 3.0])
def test_breakdown_bars_end_at_100_percent_even_when_the_parts_exceed_the_step(excess):
    df = breakdown_frame(models=("tiny",), excess=excess)
    fig = plots.breakdown(df, META)
    ends = bar_ends(fig.axes[1])
    assert len(ends) == len(df)
    assert all(e == pytest.approx(100, abs=1e-9) for e in ends.values()), ends
    notes = [t.get_text() for t in fig.axes[1].texts if " ms" in t.get_text() and ", eff" in t.get_text()]
    assert [n.split(" ms")[0] for n in notes] == [f"{v:.1f}" for v in df["step_ms"]]   # the real step time


@pytest.mark.parametrize("models, syncs", [(("tiny",), ("overlap",)), (("tiny", "small", "medium"),
                                            ("per_param", "bucketed", "overlap", "flat"))])
@pytest.mark.slow
def test_breakdown_has_its_legend_on_top_and_a_bounded_height(models, syncs):
    df = breakdown_frame(models=models, syncs=syncs)
    fig = plots.breakdown(df, META)
    assert fig.get_figheight() <= plots.BREAKDOWN_MAX_IN
    assert fig.get_figheight() * 100 <= 1000          # at the report's default 100 dpi: at most 1000 px tall
    FigureCanvasAgg(fig).draw()
    legend_row, *models_axes = fig.axes
    legend = legend_row.get_legend().get_window_extent()
    top_of_bars = max(ax.get_tightbbox().y1 for ax in models_axes)   # with the model titles
    title = fig._suptitle.get_window_extent()
    assert top_of_bars <= legend.y0 and legend.y1 <= title.y0, (legend, top_of_bars, title)
    assert [t.get_text() for t in legend_row.get_legend().get_texts()] == [s[0] for s in plots.SEGMENTS]
    for ax in models_axes:                            # backend names take the backend's colour
        for tick in ax.get_yticklabels():
            backend = tick.get_text().split()[1]
            assert to_hex(tick.get_color()) == to_hex(plots.backend_colour(backend))


def test_the_projection_title_says_where_compute_comes_from_in_words():
    rate, source = report.compute_rate([], 166.0, 25 * 10**6)
    proj = report.projection_frame(cm.project_ddp([25 * 10**6], [2, 64], rate, algorithms=("ring",)))
    fig = plots.projection(proj, META, 25 * 10**6, f"compute {source}")
    title = fig.get_suptitle()
    assert "--" not in title and "assumed 166 ms per step at 25M parameters" in title, title
    text = report.projection_tables(proj, rate, source, {}, 1 << 20, [])
    assert "--compute-ms and --compute-params" in text      # the printed table still says how to change it
