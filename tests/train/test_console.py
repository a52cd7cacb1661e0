"""What rank 0 prints while training: the mode chosen (bar on a terminal, timed lines otherwise,
nothing when quiet or on other ranks), the tqdm bar's fields, the log lines' fields and timing."""

import io

import pytest

from npddp.train.console.printer import Printer, Progress, format_duration


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty


@pytest.mark.parametrize("rank, tty, quiet, progress, mode", [
    (0, True, False, "auto", "bar"), (0, False, False, "auto", "log"), (1, True, False, "auto", "none"),
    (0, True, True, "auto", "none"), (0, False, False, "bar", "bar"), (0, True, False, "log", "log"),
    (1, False, False, "log", "none"), (0, False, True, "log", "none"), (0, True, False, "none", "none")])
def test_the_mode_follows_rank_terminal_quiet_and_the_setting(rank, tty, quiet, progress, mode):
    assert Printer(rank, quiet=quiet, out=io.StringIO(), err=_Stream(tty), progress=progress).mode() == mode


def test_unknown_modes_and_intervals_name_the_valid_values():
    with pytest.raises(ValueError, match="auto, bar, log, none"):
        Printer(0, progress="always")
    with pytest.raises(ValueError, match="log_every must be a number of seconds > 0"):
        Printer(0, log_every=0)


def test_the_bar_shows_samples_rate_eta_and_the_loss_then_erases_itself():
    err = _Stream(True)
    printer = Printer(0, out=io.StringIO(), err=err)
    progress = printer.progress(epochs=3, steps_per_epoch=20, total_steps=60, step=0, batch=32)
    progress.start_epoch(0, 0)
    for _ in range(20):
        progress.update(0.5)
    progress._bar.refresh()
    last = err.getvalue().rsplit("\r", 1)[-1]
    assert last.startswith("epoch 1/3: 100%|") and "640/640 [00:00<00:00," in last    # done, elapsed<ETA
    assert last.endswith("sample/s, loss 0.5000]")
    shown = len(err.getvalue())
    progress.end_epoch()
    erased = err.getvalue()[shown:]
    assert erased.startswith("\r") and erased.endswith("\r") and not erased.strip()


def test_log_lines_come_every_interval_with_step_epoch_share_loss_rate_and_eta():
    now = [100.0]
    out = io.StringIO()
    progress = Progress("log", out, io.StringIO(), epochs=2, steps_per_epoch=10, total_steps=20, step=5,
                        batch=8, log_every=10.0, clock=lambda: now[0])
    progress.start_epoch(0, 5)                                    # resumed at batch 5 of epoch 1
    for loss in (1.0, 3.0):                                       # 2 steps in 4 s: below the interval
        now[0] += 2.0
        progress.update(loss)
    assert out.getvalue() == ""
    for _ in range(3):                                            # 3 more steps: 10 s since the start
        now[0] += 2.0
        progress.update(2.0)
    lines = out.getvalue().splitlines()
    assert lines == ["step 10/20  epoch 1/2 (100%)  loss 2.0000  4 samples/s  elapsed 0:10  ETA 0:20"]
    progress.end_epoch()
    progress.start_epoch(1, 0)
    now[0] += 10.0
    progress.update(0.25)
    assert out.getvalue().splitlines()[-1] == ("step 11/20  epoch 2/2 (10%)  loss 0.2500  1 samples/s  "
                                               "elapsed 0:20  ETA 0:30")


def test_a_rank_that_never_sees_the_loss_leaves_it_out_of_its_lines():
    """--pp: rank 0 is the first pipeline stage; its lines said ``loss nan``."""
    now = [0.0]
    out = io.StringIO()
    progress = Progress("log", out, io.StringIO(), epochs=1, steps_per_epoch=10, total_steps=10, step=0,
                        batch=4, log_every=1.0, clock=lambda: now[0])
    progress.start_epoch(0, 0)
    now[0] += 2.0
    progress.update(None)
    assert out.getvalue().splitlines() == ["step  1/10  epoch 1/1 (10%)  2 samples/s  elapsed 0:02  ETA 0:18"]


def test_no_output_at_all_in_mode_none():
    out, err = io.StringIO(), io.StringIO()
    progress = Progress("none", out, err, epochs=1, steps_per_epoch=3, total_steps=3, step=0, batch=1,
                        log_every=1e-9)
    progress.start_epoch(0, 0)
    for _ in range(3):
        progress.update(1.0)
    progress.end_epoch()
    assert out.getvalue() == err.getvalue() == ""


@pytest.mark.parametrize("seconds, text", [(0, "0:00"), (59.6, "1:00"), (75.2, "1:15"), (3725, "1:02:05")])
def test_durations(seconds, text):
    assert format_duration(seconds) == text


@pytest.mark.parametrize("rank, quiet", [(0, False), (0, True), (1, False)])
def test_only_rank_0_prints_and_quiet_keeps_only_the_summary_and_problems(rank, quiet):
    out, err = io.StringIO(), io.StringIO()
    p = Printer(rank, quiet=quiet, out=out, err=err)
    p.info("header")
    p.summary("done")
    p.warn("careful")
    p.error("bad")
    expected_out = "" if rank else ("done\n" if quiet else "header\ndone\n")
    assert out.getvalue() == expected_out
    assert err.getvalue() == ("" if rank else "warning: careful\nerror: bad\n")


@pytest.mark.parametrize("nodes, line", [
    ([0, 0, 1, 1], "nodes: 2 x 2 ranks (node0: 0,1; node1: 2,3)"),
    ([0] * 8 + [1] * 8, "nodes: 2 x 8 ranks (node0: 0-7; node1: 8-15)"),
    ([0, 0, 0, 1], "nodes: 2 with 4 ranks (node0: 0-2; node1: 3)"),
    ([0, 1, 0, 1], "nodes: 2 x 2 ranks (node0: 0,2; node1: 1,3)"),
])
def test_the_header_line_of_a_run_across_nodes_lists_each_nodes_ranks(nodes, line):
    from npddp.train.console.banner import nodes_line
    assert nodes_line(nodes) == line


def test_the_header_names_open_mpi_in_a_line_of_ordinary_length():
    """Open MPI's version string carries its packager, ident, repo and date: the first header line was ~160 chars."""
    from types import SimpleNamespace

    from npddp.train.config import Config
    from npddp.train.console.banner import header
    from npddp.util.runinfo import library_name

    version = ("Open MPI v5.0.11, package: Open MPI user@localhost Distribution, ident: 5.0.11, repo rev: v5.0.11rc1, "
               "Sep 16, 2026\x00")
    comm = SimpleNamespace(size=2, rank=0, transport=SimpleNamespace(name="mpi"))
    ds = SimpleNamespace(name="synthetic", n_train=96, n_val=32, input_shape=(64,), num_classes=10)
    model = SimpleNamespace(num_parameters=lambda: 10, num_bytes=lambda: 40)
    ddp = SimpleNamespace(buckets=[SimpleNamespace()])
    trainer = SimpleNamespace(loader=[0] * 3)
    lines = header(Config(), comm, ds, "mlp", model, ddp, trainer, {"mpi_library": library_name(version)}, "threads")
    assert lines[0] == "npddp.train: 2 ranks, backend mpi over mpi, MPI Open MPI v5.0.11"
