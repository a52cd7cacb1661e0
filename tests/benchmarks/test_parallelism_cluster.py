"""benchmarks/parallelism.py across emulated nodes: its options, the bytes it expects, repeats, and a tiny sweep."""

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from benchmarks import parallelism as bp
from benchmarks import results

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name,nbytes,size,expected", [
    ("allreduce", 1000, 4, 1500.0), ("iallreduce", 1000, 2, 1000.0), ("ireduce_scatter", 1000, 4, 750.0),
    ("iallgather", 250, 4, 750.0), ("send", 64, 2, 64.0), ("recv", 64, 2, 0.0), ("allreduce", 1000, 1, 0.0),
])
def test_the_bytes_a_bandwidth_optimal_algorithm_sends(name, nbytes, size, expected):
    assert bp.sent_bytes(name, nbytes, size) == expected


def test_a_middle_stage_idles_after_its_last_backward_too():
    blocked, own, slowest = np.array([0.5, 0.25]), np.array([3.0, 4.0]), np.array([4.0, 4.0])
    assert list(bp.pipeline_idle(blocked, own, slowest)) == [1.5, 0.25]


def test_repeated_jobs_make_one_row_of_medians():
    rows = [{"layout": "ddp", "step_ms": t, "step_ms_p10": t - 1, "comm_bytes": b, "nodes": 2, "repeats": 1}
            for t, b in ((30.0, 10), (10.0, 30), (20.0, 20))]
    assert bp.median_row(rows) == {"layout": "ddp", "step_ms": 20.0, "step_ms_p10": 19.0, "comm_bytes": 20,
                                   "nodes": 2, "repeats": 3}


@pytest.mark.parametrize("args,words", [
    (["--nodes", "0"], "--nodes must be an integer >= 1, got 0"),
    (["--nodes", "2", "--rate", "0"], "--rate: rate '0' is not valid"),
    (["--nodes", "2", "--rate", "fast"], "--rate: rate 'fast' is not valid"),
    (["--nodes", "2", "--ranks-per-node", "2", "--ranks", "2,4"], "only 4"),
    (["--ranks", "two"], "--ranks must be integers"),
    (["--repeats", "0"], "--repeats must be an integer >= 1, got 0"),
])
def test_a_bad_option_is_one_error_line_and_exit_2(args, words, capsys):
    with pytest.raises(SystemExit) as stop:
        bp.main(args)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and words in err[-1] and err[-1].startswith(Path(sys.argv[0]).name + ": error:")


def test_the_lock_is_exclusive_against_another_process(tmp_path):
    lock = tmp_path / "cluster.lock"
    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY)\n"
             "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')\n"
             "except BlockingIOError:\n    print('held')")
    with bp.held(str(lock)):
        inside = subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True, text=True).stdout
    after = subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True, text=True).stdout
    assert (inside.strip(), after.strip()) == ("held", "free")


def test_the_peak_memory_starts_afresh_after_the_build():
    big = np.ones(200 << 17)                          # 200 MiB, touched, then handed back to the system
    del big
    lifelong = bp.peak_memory_mib(since_reset=False)
    assert bp.reset_peak_memory()
    assert bp.peak_memory_mib(since_reset=True) < lifelong - 150


def test_the_peak_memory_leaves_out_freed_heap_pages():
    blocks = [np.ones(100 << 7) for _ in range(2048)]     # 200 MiB in 100 KiB blocks: malloc's heap, not mmap
    pin = np.ones(100 << 7)                               # allocated last: the heap cannot shrink from its top
    del blocks
    resident = next(int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith("VmRSS:")) / 1024.0
    assert bp.reset_peak_memory()
    assert bp.peak_memory_mib(since_reset=True) < resident - 150
    del pin


def _can_make_nodes() -> str | None:
    from tests.helpers.cluster import WHY_NOT
    return WHY_NOT


@pytest.mark.slow
def test_a_tiny_sweep_across_two_emulated_nodes_counts_the_link(tmp_path):
    why = _can_make_nodes()
    if why:
        pytest.skip(f"emulated nodes unavailable: {why}")
    out = tmp_path / "par_2x1.h5"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "parallelism.py"), "--sizes", "tiny", "--nodes",
                           "2", "--ranks-per-node", "1", "--rate", "1gbit", "--lock", str(tmp_path / "lock"),
                           "--layouts", "ddp,pp-1f1b", "--steps", "1", "--warmup", "0", "--batch", "2", "--context",
                           "8", "--micro-batches", "2", "--out", str(out)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert results.check(out) == []
    table = results.read_table(out)
    assert list(table["layout"]) == ["ddp", "pp-1f1b"]
    assert (table["nodes"] == 2).all() and (table["ranks_per_node"] == 1).all() and (table["rate"] == "1gbit").all()
    ddp = table.iloc[0]
    # two ranks on two nodes: every byte a rank sends crosses its node's link, headers on top
    assert 0.9 * ddp["sent_bytes"] <= ddp["link_bytes"] <= 1.5 * ddp["sent_bytes"], (ddp["sent_bytes"],
                                                                                    ddp["link_bytes"])
    assert table["link_bytes"].map(math.isfinite).all() and (table["peak_rss_min_mib"] > 0).all()
    report = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "report.py"), str(out), "--no-plots"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    assert "2 nodes x 1, 1gbit" in report.stdout
