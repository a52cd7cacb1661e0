"""Soak: thousands of small all-reduces and repeated large ones leave resident memory flat.

The MPI test is a cheap run of ``benchmarks/soak.py``'s loop in process (2,000 x 4 KiB and
3 x 16 MiB per backend), every rank's RSS agreed through an all-gather. The serial tests run the
script itself under ``mpirun -n 2``: flat memory passes, an injected leak fails, bad input exits 2.
"""

from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from benchmarks import soak
from npddp.comm import BACKENDS


SCRIPT = Path(soak.__file__)
MAX_GROWTH = 4 << 20


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: f"{b}-backend")
@pytest.mark.slow
def test_resident_memory_stays_flat_over_many_all_reduces(backend, comm_world, assert_all_ranks):
    args = Namespace(small=2000, small_size=4096, large=3, large_size=16 << 20, inject_leak=0)
    dup = comm_world.Dup()
    readings, _, wrong = soak.soak(soak.npcomm.create(backend, dup), args, [])
    dup.Free()
    mine = np.array([*readings, wrong], dtype=np.int64)                  # (baseline, small, large, wrong)
    table = np.empty((comm_world.Get_size(), mine.size), dtype=np.int64)  # (ranks, 4)
    comm_world.Allgather(mine, table)
    growth = table[:, 1:3] - table[:, :1]                                  # (ranks, phases)
    assert_all_ranks(growth.max() <= MAX_GROWTH and not table[:, 3].any(),
                     f"RSS growth per rank and phase (KiB): {(growth // 1024).tolist()}; wrong: {table[:, 3].tolist()}",
                     comm_world)


def test_the_soak_script_passes_on_flat_memory_and_fails_on_a_leak(run_job):
    small = ["--small", "500", "--large", "2", "--large-size", "4M", "--max-growth", "8M"]
    flat = run_job([SCRIPT, *small])
    assert flat.returncode == 0, flat.stdout + flat.stderr
    lines = flat.stdout.splitlines()
    assert lines[0].startswith("# soak: 2 ranks, backends mpi,ring; small phase 500 x 4K, large phase 2 x 4M")
    for backend in ("mpi", "ring"):
        assert sum(line.split()[:2] in ([backend, "small"], [backend, "large"]) for line in lines) == 2
        assert any(line.startswith(f"# {backend}: largest growth") and line.endswith("0 wrong: ok") for line in lines)
    leaky = run_job([SCRIPT, *small, "--backends", "ring", "--inject-leak", "16M"])
    assert leaky.returncode == 1, leaky.stdout + leaky.stderr
    assert leaky.stdout.splitlines()[-1].endswith("0 wrong: FAIL")


@pytest.mark.parametrize("argv, text", [(["--backends", "nccl"], "unknown backend 'nccl'"),
                                        (["--small-size", "2"], "must be at least 4 bytes"),
                                        (["--large", "-1"], "must be >= 0, got -1")])
def test_the_soak_script_rejects_bad_input_with_one_message(run_job, argv, text):
    proc = run_job([SCRIPT, *argv])
    assert proc.returncode == 2 and text in proc.stderr and proc.stderr.count("error:") == 1, proc.stderr
