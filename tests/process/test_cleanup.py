"""Shared memory left by failed MPI jobs: ./mpi_run.sh removes its own job's segments when the job
fails, and only those; ``python -m npddp.process.cleanup clean`` finds orphans (old, unmapped, this user's)."""

import mmap
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from npddp.process import cleanup as shm
from tests.helpers.cli import clean_env

#: watches the whole machine or times a job's end: never beside another test (run_all.sh: serial-alone)
pytestmark = pytest.mark.alone

ROOT = Path(__file__).resolve().parents[2]

FAILING = """
import sys
from npddp.process.job import abort_on_exception
abort_on_exception()
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.Barrier()
if comm.Get_rank() == 0:
    import os
    mine = sorted(p for p in {line.split(None, 5)[5].strip() for line in open("/proc/self/maps")
                              if "/dev/shm/" in line and "/dev/shm/npddp-" not in line} if os.path.exists(p))
    print("SEGMENTS", *mine, flush=True)
comm.Barrier()
import os, signal
os.kill(os.getpid(), signal.SIGKILL)   # every rank dies without a word: only the launcher's watch can clean up
"""

LIVE = """
import sys, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
comm.Barrier()
if comm.Get_rank() == 0:
    import os
    mine = sorted(p for p in {line.split(None, 5)[5].strip() for line in open("/proc/self/maps")
                              if "/dev/shm/" in line and "/dev/shm/npddp-" not in line} if os.path.exists(p))
    print("SEGMENTS", *mine, flush=True)
time.sleep(float(sys.argv[1]))
comm.Barrier()
"""


def _segments(output: str) -> list[str]:
    line = next(line for line in output.splitlines() if line.startswith("SEGMENTS"))
    return line.split()[1:]


@pytest.mark.slow
def test_a_failed_job_under_mpi_run_sh_leaves_no_segment_and_others_keep_theirs(tmp_path):
    (tmp_path / "failing.py").write_text(FAILING)
    (tmp_path / "live.py").write_text(LIVE)
    decoy = Path(f"/dev/shm/mpich_shm_npddptest{secrets.token_hex(4)}_0")   # ours, unmapped, not the job's
    decoy.write_bytes(b"\0" * 4096)
    other = subprocess.Popen([str(ROOT / "mpi_run.sh"), "-n", "2", sys.executable, str(tmp_path / "live.py"), "20"],
                             cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        theirs = _segments(other.stdout.readline() + other.stdout.readline())
        failed = subprocess.run([str(ROOT / "mpi_run.sh"), "-n", "2", sys.executable, str(tmp_path / "failing.py")],
                                cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=60)
        ours = _segments(failed.stdout)
        assert failed.returncode != 0 and not set(ours) & set(theirs)
        # removed by the watch (MPICH), or by the launcher itself (Open MPI's prterun outlives its ranks); Intel
        # MPI unlinks its segments once every rank maps them, so none is left by then
        assert not any(os.path.exists(p) for p in ours), (ours, failed.stderr)
        assert decoy.exists() and all(os.path.exists(p) for p in theirs)      # another job's are never touched
    finally:
        other.kill()
        other.wait()
        decoy.unlink(missing_ok=True)


def test_orphans_are_old_unmapped_files_of_this_user_named_like_mpi_segments(tmp_path):
    old, young, mapped, foreign_name = (tmp_path / n for n in ("mpich_shm_a_0", "mpich_shm_b_0", "mpich_shm_c_0",
                                                               "my_cache_file"))
    for p in (old, young, mapped, foreign_name):
        p.write_bytes(b"\0" * 4096)
    past = time.time() - 3600
    for p in (old, mapped, foreign_name):
        os.utime(p, (past, past))
    with open(mapped, "r+b") as f, mmap.mmap(f.fileno(), 4096) as view:     # this process maps it
        assert view[0] == 0
        assert shm.orphans(min_age_s=60, directory=tmp_path) == [old]
        assert shm.remove_unused([str(old), str(mapped)], directory=tmp_path) == [(str(old), 4096)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mpich_shm_b_0", "mpich_shm_c_0", "my_cache_file"]


HOLDING = """
import os, sys, time
held = [open(os.path.join(sys.argv[1], "hydra_hwloc_xmlfile_ours"), "w")]      # as hydra's proxy holds its file
os.makedirs(os.path.join(sys.argv[1], "ompi.12", "1"))
held.append(open(os.path.join(sys.argv[1], "ompi.12", "1", "pmix-gds"), "w"))  # as Open MPI's ranks hold theirs
open(os.path.join(sys.argv[1], "started"), "w").close()
time.sleep(1.0)
sys.exit(3)
"""


def test_a_failed_job_removes_the_launcher_files_it_held_never_those_of_a_job_starting_beside_it(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    (tmp_path / "holding.py").write_text(HOLDING)
    watch = shm.Watch([sys.executable, str(tmp_path / "holding.py"), str(tmp_path)])
    theirs = tmp_path / "hydra_hwloc_xmlfile_theirs"     # another job's, made while ours runs, not yet open
    proc = subprocess.Popen([sys.executable, "-c", f"""
import os, time
while not os.path.exists({str(tmp_path / "started")!r}): time.sleep(0.01)
open({str(theirs)!r}, "w").write("topology")
"""])
    try:
        code = watch.run()
    finally:
        proc.wait(30)
    removed = watch.clean(code)
    assert code == 3 and theirs.exists()
    assert sorted(os.path.basename(p) for p, _ in removed) == ["hydra_hwloc_xmlfile_ours", "ompi.12"]
    assert not (tmp_path / "hydra_hwloc_xmlfile_ours").exists() and not (tmp_path / "ompi.12").exists()


def test_a_launcher_file_another_process_still_holds_is_kept(tmp_path):
    kept = tmp_path / "hydra_hwloc_xmlfile_held"
    with open(kept, "w"):
        assert shm.held_temp_entries(os.getpid(), str(tmp_path)) == {str(kept)}
        paths = [str(kept), str(tmp_path / "ompi.7" / "x"), str(tmp_path / "other"), str(tmp_path / "ompi.notes")]
        assert shm.temp_entries(paths, str(tmp_path)) == {str(kept), str(tmp_path / "ompi.7")}
