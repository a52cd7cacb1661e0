"""Sharded checkpoints of ``--zero 1..3`` end to end (subprocesses under mpirun): the files written, a resume at
the same world size bit-identical to an uninterrupted run, a resume at another world size and stage, evaluation and
``load_model`` from one process, a missing or damaged shard, and a crash between the shards and the index."""

import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from npddp.checkpoint import fileformat, shardwrite
from npddp.train.checkpoint.saving import load_model

from tests.helpers.cli import LIMITED, clean_env, mpirun_path, ok, train
from tests.helpers.cli_zero import GPT, MLP, one_error, params_of, relative, step_dirs, steps_saved, whole_state


@pytest.mark.parametrize("flags, stage, n, launcher", [(MLP, 1, 2, "mpirun"), (GPT, 2, 3, "mpirun"),
                                                      (GPT, 3, 2, "mpirun"), (MLP, 2, 2, "npddp.run")])
@pytest.mark.slow
def test_each_rank_writes_its_shard_and_a_resume_at_the_same_world_size_is_bit_identical(tmp_path, flags, stage, n,
                                                                                         launcher):
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    whole.mkdir(), parts.mkdir()
    ok(train(whole, *flags, "--zero", stage, "--checkpoint", "z.h5", n=n, launcher=launcher))
    ok(train(parts, *flags, "--zero", stage, "--checkpoint", "z.h5", "--max-steps", "3", n=n, launcher=launcher))
    assert steps_saved(parts) == [3]
    folder = parts / step_dirs(parts)[0]
    shards = sorted(os.listdir(folder))
    assert shards == [shardwrite.shard_name(r, n) for r in range(n)]
    for r, name in enumerate(shards):
        with h5py.File(folder / name, "r") as f:
            assert (f.attrs["format"], f.attrs["rank"], f.attrs["world_size"], f.attrs["stage"], f.attrs["step"]) \
                   == (shardwrite.SHARD_FORMAT, r, n, stage, 3)
            assert "params" in f and "optimizer" in f and f["layout"].shape[1] == 5
    with h5py.File(parts / "z.h5", "r") as f:                  # the index holds no parameter
        assert f.attrs["sharded"] and len(f["params"]) == 0 and list(f["shards"]["sizes"][()]) == \
            [os.path.getsize(folder / s) for s in shards]
    proc = ok(train(parts, "--checkpoint", "z.h5", "--resume", "--progress", "none", n=n, launcher=launcher))
    assert "bit-identical to an uninterrupted run" in proc.stdout, proc.stdout
    assert steps_saved(parts) == steps_saved(whole) and len(step_dirs(parts)) == 1   # the step-3 set is gone
    a, b = whole_state(whole / "z.h5"), whole_state(parts / "z.h5")
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def ddp_gpt(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("zero0")
    ok(train(cwd, *GPT, "--zero", "0", "--checkpoint", "ref.h5"))
    return params_of(cwd / "ref.h5")


@pytest.mark.slow
def test_written_on_three_ranks_resumed_on_two_with_another_stage_reaches_ddps_parameters(tmp_path, ddp_gpt):
    ok(train(tmp_path, *GPT, "--zero", "1", "--checkpoint", "z.h5", "--max-steps", "5", n=3))
    assert steps_saved(tmp_path) == [5] and len(os.listdir(tmp_path / step_dirs(tmp_path)[0])) == 3
    ok(train(tmp_path, "--checkpoint", "z.h5", "--resume", "--zero", "3", "--progress", "none", n=2))
    assert len(os.listdir(tmp_path / step_dirs(tmp_path)[0])) == 2
    assert relative(params_of(tmp_path / "z.h5"), ddp_gpt) < 1e-12
    ok(train(tmp_path, "--checkpoint", "z.h5", "--resume", "--zero", "0", "--epochs", "3", "--progress", "none"))
    assert step_dirs(tmp_path) == [] and fileformat.read(str(tmp_path / "z.h5")).step == 12   # whole format again


@pytest.fixture
def sharded_run(tmp_path):
    ok(train(tmp_path, *MLP, "--zero", "2", "--checkpoint", "z.h5", "--metrics", "m.h5", n=2))
    return tmp_path


def test_evaluate_and_load_model_read_a_sharded_checkpoint_in_one_process(sharded_run):
    proc = subprocess.run([sys.executable, "-m", "npddp.evaluate", "z.h5"], cwd=sharded_run, env=clean_env(),
                          capture_output=True, text=True, timeout=60)
    ok(proc)
    assert proc.stdout.startswith("evaluate: z.h5") and "1 rank" in proc.stdout, proc.stdout
    model = load_model(str(sharded_run / "z.h5"))
    saved = fileformat.read(str(sharded_run / "z.h5")).params
    for name, p in model.named_parameters():
        assert np.array_equal(p.data, saved[name]), name
    assert np.all(np.isfinite(np.concatenate([v.ravel() for v in saved.values()])))


@pytest.mark.parametrize("damage", ["delete", "truncate", "flip"])
def test_a_missing_or_damaged_shard_is_one_line_naming_it_exit_2(sharded_run, damage):
    shard = sharded_run / step_dirs(sharded_run)[0] / shardwrite.shard_name(1, 2)
    if damage == "delete":
        shard.unlink()
    elif damage == "truncate":
        os.truncate(shard, shard.stat().st_size // 2)
    else:
        data = bytearray(shard.read_bytes())
        data[-100] ^= 0xFF
        shard.write_bytes(bytes(data))
    want = {"delete": "is missing", "truncate": "truncated", "flip": "damaged"}[damage]
    line = one_error(train(sharded_run, "--checkpoint", "z.h5", "--resume", "--epochs", "3", "--progress", "none"))
    assert shardwrite.shard_name(1, 2) in line and want in line, line
    proc = subprocess.run([sys.executable, "-m", "npddp.evaluate", "z.h5"], cwd=sharded_run, env=clean_env(),
                          capture_output=True, text=True, timeout=60)
    line = one_error(proc)
    assert shardwrite.shard_name(1, 2) in line and want in line, line
    with pytest.raises(fileformat.CheckpointError, match=want):
        load_model(str(sharded_run / "z.h5"))


CRASH = """
import os, sys
from npddp.checkpoint import shardwrite
from npddp.train.cli import main as cli
real, calls = shardwrite._write_index, []

def crash(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:          # the second checkpoint: every shard is on disk, the index is not
        os._exit(9)
    return real(*args, **kwargs)

shardwrite._write_index = crash
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_crash_between_the_shards_and_the_index_leaves_the_previous_set_loadable(tmp_path):
    (tmp_path / "crash.py").write_text(CRASH)
    flags = [*MLP, "--zero", "3", "--checkpoint", "z.h5", "--checkpoint-every", "3"]
    proc = subprocess.run([mpirun_path(), "-n", "2", sys.executable, "crash.py", *flags], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0, proc.stdout
    assert steps_saved(tmp_path) == [3, 6]                     # the new shards, no index
    assert len(os.listdir(tmp_path / step_dirs(tmp_path)[1])) == 2
    assert fileformat.read(str(tmp_path / "z.h5")).step == 3
    ok(train(tmp_path, "--checkpoint", "z.h5", "--resume", "--progress", "none"))
    whole = tmp_path / "whole"
    whole.mkdir()
    ok(train(whole, *MLP, "--zero", "3", "--checkpoint", "z.h5", "--checkpoint-every", "3"))
    a, b = whole_state(whole / "z.h5"), whole_state(tmp_path / "z.h5")
    assert all(np.array_equal(a[k], b[k]) for k in a) and sorted(a) == sorted(b)
    assert steps_saved(tmp_path) == steps_saved(whole)


@pytest.mark.slow
def test_a_shard_write_that_fails_is_one_line_exit_4_and_the_previous_set_survives(tmp_path):
    ok(train(tmp_path, *MLP, "--zero", "2", "--checkpoint", "z.h5", "--max-steps", "5"))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    state = whole_state(tmp_path / "z.h5")
    command = [mpirun_path(), "-n", "2", sys.executable, "-c", LIMITED, "--checkpoint", "z.h5", "--resume"]
    proc = subprocess.run(command, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "cannot write z.h5.step-" in lines[0] and "File too large" in lines[0], lines
    assert sorted(p.name for p in tmp_path.rglob("*")) == before            # no new step directory, no temp file
    after = whole_state(tmp_path / "z.h5")
    assert fileformat.read(str(tmp_path / "z.h5")).step == 5 and all(np.array_equal(state[k], after[k]) for k in state)


def test_only_other_step_directories_of_the_same_index_are_removed(tmp_path):
    for name in ["z.h5.step-00000003", "z.h5.step-00000006-0123abcd", "z.h5.step-00000006-89abcdef",
                 "y.h5.step-00000003-0123abcd", "z.h5.step-x", "z.h5.step-00000006-mine", "z.h5.old.step-00000003"]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "rank-00000-of-00001.h5").write_bytes(b"x")
    (tmp_path / "z.h5.step-00000009").write_bytes(b"a file, not a directory")
    shardwrite.remove_old_steps(str(tmp_path / "z.h5"), keep=shardwrite.step_dir(tmp_path / "z.h5", 6, "89abcdef"))
    foreign = ["y.h5.step-00000003-0123abcd", "z.h5.old.step-00000003"]
    assert sorted(os.listdir(tmp_path)) == sorted([*foreign, "z.h5.step-00000006-89abcdef", "z.h5.step-00000009",
                                                   "z.h5.step-x", "z.h5.step-00000006-mine"])
    shardwrite.remove_old_steps(str(tmp_path / "z.h5"), keep="")
    assert sorted(os.listdir(tmp_path)) == sorted([*foreign, "z.h5.step-00000009", "z.h5.step-x",
                                                   "z.h5.step-00000006-mine"])
