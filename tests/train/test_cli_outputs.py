"""The files a new run writes follow one rule: an earlier run's file is replaced only with ``--overwrite``
(or continued with ``--resume``), and a foreign file never; here the ``--metrics`` file."""

from tests.helpers.cli import TINY, error_line, ok, train

FLAGS = [*TINY, "--epochs", "1", "--max-steps", "2", "--progress", "none"]


def test_a_new_run_replaces_an_earlier_metrics_file_only_with_overwrite(tmp_path):
    ok(train(tmp_path, *FLAGS, "--metrics", "m.h5", n=None))
    first = (tmp_path / "m.h5").read_bytes()
    proc = train(tmp_path, *FLAGS, "--metrics", "m.h5", n=None)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = error_line(proc)
    assert "--metrics 'm.h5' already holds a metrics" in line and "--overwrite" in line, line
    assert (tmp_path / "m.h5").read_bytes() == first
    ok(train(tmp_path, *FLAGS, "--metrics", "m.h5", "--overwrite", n=None))
    assert (tmp_path / "m.h5").read_bytes() != first


def test_a_checkpoint_where_no_file_can_be_created_is_refused_before_training(tmp_path):
    """/proc's permission bits let root write; only trying to create a file there tells it cannot."""
    proc = train(tmp_path, *FLAGS, "--checkpoint", "/proc/npddp-test.h5", n=None)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = error_line(proc)       # root is told it cannot create a file, another user not writable
    assert line.startswith("error: --checkpoint '/proc/npddp-test.h5': ") and "directory '/proc'" in line, line
    assert "step" not in proc.stdout and "epoch" not in proc.stdout, proc.stdout
