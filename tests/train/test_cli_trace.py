"""``python -m npddp.train --trace``: the job's timeline under ``mpirun -n 2`` (serial tests that need mpirun).

The file must load as JSON, hold both ranks, nest on every track, and have every layer's
backward and every bucket's all-reduce in each traced step; with ``--sync overlap`` an
all-reduce starts before backward ends. A failure inside the traced steps still leaves a
valid file. The path follows the checkpoint's rules: no FIFO, device or foreign file is
replaced, an earlier trace only with ``--overwrite``, and a trace that cannot be written is one
line and exit 4 once training is done.
"""

import json
import os
import re
import stat
import subprocess
import sys

import pytest

from npddp.nn import mlp
from npddp.checkpoint import fileformat
from tests.helpers.cli import TINY, clean_env, error_line, mpirun_path, ok, train
from tests.helpers.trace import nesting_problems, x_events

FLAGS = [*TINY, "--epochs", "1", "--bucket-mb", "0.004"]
LAYERS = [name for name, _ in mlp(4, [16], 3).named_modules() if name]   # the CLI's MLP for --hidden 16


def buckets_of(stdout: str) -> int:
    """The bucket count the header line names."""
    return int(re.search(r"(\d+) buckets?", stdout).group(1))


def root(events, name: str, pid: int, step: int) -> dict:
    """The whole-model ``forward``/``backward`` event of one rank and step."""
    found = [e for e in events if e["name"] == name and e["pid"] == pid and e["args"]["step"] == step]
    assert len(found) == 1, (name, pid, step, found)
    return found[0]


@pytest.mark.parametrize("sync", ["overlap", "bucketed"])
def test_two_ranks_write_one_nesting_trace_with_every_layer_and_bucket(tmp_path, sync):
    proc = ok(train(tmp_path, "--sync", sync, "--trace", "t.json", *FLAGS))
    doc = json.loads((tmp_path / "t.json").read_text())
    events = x_events(doc)
    assert {e["pid"] for e in doc["traceEvents"]} == {0, 1}
    assert nesting_problems(doc) == []
    assert doc["otherData"]["complete"] is True and doc["otherData"]["ranks"] == [0, 1]
    assert set(doc["otherData"]["clock_offset_us"]) == {"0", "1"}
    buckets = buckets_of(proc.stdout)
    assert buckets >= 2
    for pid in (0, 1):
        for step in (3, 4, 5):                                          # the default --trace-steps 3:5
            mine = [e for e in events if e["pid"] == pid and e["args"]["step"] == step]
            backward = sorted(e["name"] for e in mine if e["name"].startswith("backward "))
            assert backward == sorted(f"backward {n}" for n in LAYERS)
            reduces = sorted(e["args"]["bucket"] for e in mine if e["cat"] == "comm")
            assert reduces == list(range(buckets)), (pid, step, reduces)
            assert all(e["args"]["bytes"] > 0 and e["args"]["backend"] == "mpi" for e in mine if e["cat"] == "comm")
        assert {e["args"]["step"] for e in events if e["pid"] == pid} == {3, 4, 5}
    early = [e for e in events if e["cat"] == "comm"
             and e["ts"] < (lambda b: b["ts"] + b["dur"])(root(events, "backward", e["pid"], e["args"]["step"]))]
    if sync == "overlap":
        assert early, "no all-reduce started before backward ended"
    else:
        assert not early, "bucketed sync must start all-reduces only after backward"


def test_the_environment_variable_traces_chosen_steps(tmp_path):
    env = {**clean_env(), "NPDDP_TRACE": "env.json", "NPDDP_TRACE_STEPS": "2:2"}
    ok(subprocess.run([mpirun_path(), "-n", "2", sys.executable, "-m", "npddp.train", *FLAGS], cwd=tmp_path, env=env,
                      capture_output=True, text=True, timeout=120))
    doc = json.loads((tmp_path / "env.json").read_text())
    assert {e["args"]["step"] for e in x_events(doc)} == {2}
    assert {e["pid"] for e in x_events(doc)} == {0, 1}


def test_a_run_shorter_than_the_window_writes_what_it_traced_at_the_end(tmp_path):
    ok(train(tmp_path, "--trace", "t.json", "--trace-steps", "10:40", *FLAGS))   # 12 steps
    doc = json.loads((tmp_path / "t.json").read_text())
    assert {e["args"]["step"] for e in x_events(doc) if e["name"] == "backward"} == {10, 11, 12}
    assert {e["args"]["step"] for e in x_events(doc)} <= {10, 11, 12, 13}   # 13: validation after the last step
    assert doc["otherData"]["complete"] is True


@pytest.mark.parametrize("kind, code, ranks", [("nan", 3, {0, 1}), ("raise", 1, None)])
def test_a_failure_inside_the_window_still_leaves_a_valid_trace(tmp_path, kind, code, ranks):
    proc = train(tmp_path, "--trace", "t.json", "--trace-steps", "2:8", "--inject-fault", f"1:4:{kind}", *FLAGS)
    assert proc.returncode == code, proc.stderr
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["otherData"]["complete"] is False and 1 in doc["otherData"]["failed_ranks"]
    assert nesting_problems(doc) == []
    seen = {e["pid"] for e in x_events(doc)}
    assert 1 in seen and (ranks is None or seen == ranks)                # an agreed failure: every rank
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []   # no temporary file left


@pytest.mark.slow
def test_bad_trace_flags_are_one_line_exit_2(tmp_path):
    proc = train(tmp_path, "--trace", "t.json", "--trace-steps", "5:2", *FLAGS)
    assert proc.returncode == 2 and "5:2" in proc.stderr + proc.stdout
    proc = train(tmp_path, "--trace", "missing/t.json", *FLAGS)
    assert proc.returncode == 2 and "does not exist" in proc.stderr + proc.stdout


def test_an_existing_file_is_refused_unless_it_is_a_trace_and_overwrite_is_given(tmp_path):
    source = tmp_path / "t.json"
    source.write_text("print('a user file')\n")
    for extra in ([], ["--overwrite"]):
        proc = train(tmp_path, "--trace", "t.json", *FLAGS, *extra)
        assert proc.returncode == 2 and "is not an npddp trace" in error_line(proc)
        assert source.read_text() == "print('a user file')\n"
    source.unlink()
    ok(train(tmp_path, "--trace", "t.json", *FLAGS))
    first = source.read_bytes()
    proc = train(tmp_path, "--trace", "t.json", *FLAGS)
    assert proc.returncode == 2 and "already holds a trace" in error_line(proc) and "--overwrite" in proc.stderr
    assert source.read_bytes() == first
    ok(train(tmp_path, "--trace", "t.json", *FLAGS, "--overwrite"))
    assert source.read_bytes() != first and json.loads(source.read_text())["otherData"]["complete"] is True


def _special(tmp_path, kind: str):
    """A FIFO, or a character device like /dev/null (1, 3) made here (skipped where mknod is not allowed)."""
    path = tmp_path / kind
    try:
        if kind == "fifo":
            os.mkfifo(path)
        else:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip(f"this user may not create a {kind}")
    return path


@pytest.mark.parametrize("kind, what", [("fifo", "a FIFO"), ("device", "a device")])
def test_a_fifo_or_device_is_refused_before_training_and_left_alone(tmp_path, kind, what):
    path = _special(tmp_path, kind)
    mode = path.stat().st_mode
    proc = train(tmp_path, "--trace", path.name, *FLAGS, "--overwrite")
    assert proc.returncode == 2 and what in error_line(proc) and "not a regular file" in proc.stderr
    assert "epoch" not in proc.stdout and path.stat().st_mode == mode
    env = {**clean_env(), "NPDDP_TRACE": path.name}                         # the variable's tracer refuses it too
    proc = subprocess.run([mpirun_path(), "-n", "2", sys.executable, "-m", "npddp.train", *FLAGS], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4 and what in proc.stderr and path.stat().st_mode == mode, proc.stderr


#: The training CLI on a disk that is full for the trace: every other file is written.
TRACE_DISK_FULL = """
import errno, sys
from npddp.train.cli import main as cli
from npddp.util.tracing import recorder
real = recorder.write_bytes_atomic

def full(target, data):
    if str(target).endswith(".json"):
        raise OSError(errno.ENOSPC, "No space left on device")
    return real(target, data)

recorder.write_bytes_atomic = full
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_trace_that_cannot_be_written_is_one_line_exit_4_after_training_with_the_checkpoint_written(tmp_path):
    (tmp_path / "full.py").write_text(TRACE_DISK_FULL)
    command = [mpirun_path(), "-n", "2", sys.executable, "full.py", *FLAGS, "--trace", "t.json", "--checkpoint", "c.h5"]
    proc = subprocess.run(command, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    line = error_line(proc)
    assert "cannot write the trace t.json: No space left on device" in line and "training finished" in line, line
    assert "done: epoch 1/1" in proc.stdout and fileformat.read(tmp_path / "c.h5").step == 12
    assert not (tmp_path / "t.json").exists()
