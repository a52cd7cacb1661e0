"""Sharded checkpoints replaced by another run: a failed or killed ``--overwrite`` save keeps the previous set
loadable, a copy of the index reads only its own directory, another world size leaves no stale shards, and an
index of the earlier layout (``<index>.step-N/`` named in its file list) still resumes."""

import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest

from npddp.checkpoint import fileformat, shardwrite

from tests.helpers.cli import clean_env, mpirun_path, ok, train
from tests.helpers.cli_zero import MLP, one_error, step_dirs, steps_saved, whole_state

#: The training CLI with rank 1's files limited to 4 kB once MPI is up: its shard write fails with EFBIG.
RANK1_LIMITED = """
import resource, runpy, signal, sys
from mpi4py import MPI
if MPI.COMM_WORLD.Get_rank() == 1:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4000, 4000))
sys.argv[0] = "npddp.train"
runpy.run_module("npddp.train", run_name="__main__", alter_sys=True)
"""

#: The training CLI with rank 0 killed at its first index write: every new shard is on disk, no index names them.
KILLED_BEFORE_INDEX = """
import os, sys
from npddp.checkpoint import shardwrite
from npddp.train.cli import main as cli

def crash(*args, **kwargs):
    os._exit(9)

shardwrite._write_index = crash
sys.exit(cli.main(sys.argv[1:]))
"""


def same_state(a: dict, b: dict) -> bool:
    return sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)


def evaluate(cwd, name="z.h5") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "npddp.evaluate", name], cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def saved_at_5(tmp_path):
    """A ZeRO-2 checkpoint of 2 ranks at step 5, and its whole state."""
    ok(train(tmp_path, *MLP, "--zero", "2", "--checkpoint", "z.h5", "--max-steps", "5"))
    return tmp_path, whole_state(tmp_path / "z.h5")


def test_a_rank_that_cannot_write_its_shard_during_an_overwrite_keeps_the_previous_checkpoint(saved_at_5):
    cwd, before = saved_at_5
    command = [mpirun_path(), "-n", "2", sys.executable, "-c", RANK1_LIMITED, *MLP, "--zero", "2", "--checkpoint",
               "z.h5", "--max-steps", "5", "--seed", "7", "--overwrite"]
    proc = subprocess.run(command, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "File too large" in lines[0] and "previous checkpoint is kept" in lines[0], lines
    assert steps_saved(cwd) == [5]                                   # the failed generation is gone
    ok(evaluate(cwd))
    assert same_state(before, whole_state(cwd / "z.h5"))
    ok(train(cwd, "--checkpoint", "z.h5", "--resume", "--progress", "none"))


def test_rank_0_killed_between_the_shards_and_the_index_of_an_overwrite_keeps_the_previous_checkpoint(saved_at_5):
    cwd, before = saved_at_5
    (cwd / "crash.py").write_text(KILLED_BEFORE_INDEX)
    command = [mpirun_path(), "-n", "2", sys.executable, "crash.py", *MLP, "--zero", "2", "--checkpoint", "z.h5",
               "--max-steps", "5", "--seed", "7", "--overwrite"]
    proc = subprocess.run(command, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, proc.stdout
    assert same_state(before, whole_state(cwd / "z.h5"))
    ok(evaluate(cwd))
    assert steps_saved(cwd) == [5, 5]                                # the new set beside the old one
    ok(train(cwd, "--checkpoint", "z.h5", "--resume", "--progress", "none"))
    assert len(step_dirs(cwd)) == 1                                  # the orphaned set went with the next save


def test_a_copy_of_the_index_reads_its_own_directory_and_is_refused_without_one(saved_at_5):
    cwd, before = saved_at_5
    shutil.copyfile(cwd / "z.h5", cwd / "backup.h5")
    with pytest.raises(fileformat.CheckpointError, match=r"shard directory '.*backup\.h5\.step-00000005-.*' "
                                                         "does not exist"):
        fileformat.read(str(cwd / "backup.h5"))
    line = one_error(evaluate(cwd, "backup.h5"))
    assert "backup.h5.step-00000005-" in line and "does not exist" in line, line
    (folder,) = step_dirs(cwd)
    shutil.copytree(cwd / folder, cwd / folder.replace("z.h5", "backup.h5"))
    shutil.rmtree(cwd / folder)                                      # the original's shards are gone
    assert same_state(before, whole_state(cwd / "backup.h5"))
    ok(train(cwd, "--checkpoint", "backup.h5", "--resume", "--progress", "none"))


def test_an_overwrite_on_another_world_size_leaves_no_stale_shards(tmp_path):
    ok(train(tmp_path, *MLP, "--zero", "2", "--checkpoint", "z.h5", "--max-steps", "4", n=3))
    ok(train(tmp_path, *MLP, "--zero", "2", "--checkpoint", "z.h5", "--max-steps", "4", "--overwrite", n=2))
    (folder,) = step_dirs(tmp_path)
    assert sorted(os.listdir(tmp_path / folder)) == [shardwrite.shard_name(r, 2) for r in range(2)]
    assert fileformat.read(str(tmp_path / "z.h5")).world_size == 2


def _as_earlier_layout(cwd) -> str:
    """Rewrite the index at ``cwd/z.h5`` and rename its directory as the earlier layout had them."""
    (folder,) = step_dirs(cwd)
    legacy = folder.rsplit("-", 1)[0]                                 # z.h5.step-00000005
    os.rename(cwd / folder, cwd / legacy)
    index = cwd / "z.h5"
    with h5py.File(index, "r+") as f:
        g = f["shards"]
        del g.attrs["directory"]
        g.attrs["files"] = json.dumps([f"{legacy}/{name}" for name in json.loads(g.attrs["files"])])
        fileformat._seal(f)
    index.write_bytes(fileformat._with_header(index.read_bytes()[fileformat._BLOCK:]))
    return legacy


def test_an_index_of_the_earlier_layout_still_evaluates_and_resumes(saved_at_5):
    cwd, before = saved_at_5
    legacy = _as_earlier_layout(cwd)
    assert same_state(before, whole_state(cwd / "z.h5"))
    ok(evaluate(cwd))
    ok(train(cwd, "--checkpoint", "z.h5", "--resume", "--progress", "none"))
    assert legacy not in step_dirs(cwd) and len(step_dirs(cwd)) == 1
