"""What a newcomer runs into with the training CLI: resuming over TCP, --resume alone, overwriting a
checkpoint, a batch larger than the data. Each ends with one clear line (or just works)."""

import os

import pytest

from npddp.process.cleanup import Watch
from npddp.checkpoint import fileformat
from tests.helpers.cli import TINY, clean_env, mpirun_path, ok, train


@pytest.mark.slow
def test_a_tcp_run_resumes_without_the_backend_given_again(tmp_path):
    ok(train(tmp_path, *TINY, "--epochs", "1", "--backend", "ring", "--checkpoint", "c.h5", launcher="npddp.run"))
    resumed = ok(train(tmp_path, "--checkpoint", "c.h5", "--resume", "--epochs", "2", launcher="npddp.run"))
    assert "backend ring over tcp" in resumed.stdout, resumed.stdout
    assert fileformat.read(tmp_path / "c.h5").epochs_done == 2


def test_resume_without_a_checkpoint_is_one_line_and_leaves_no_mpi_segment(tmp_path):
    import sys
    with open(tmp_path / "out.txt", "w+") as sink:
        watch = Watch([mpirun_path(), "-n", "2", sys.executable, "-m", "npddp.train", "--resume"], cwd=tmp_path,
                      env=clean_env(), stdout=sink, stderr=sink, text=True)
        code = watch.run()
        sink.seek(0)
        out = sink.read()
    assert code == 2, out
    assert out.strip().splitlines() == ["error: --resume needs --checkpoint PATH.h5: the checkpoint to continue"]
    assert not watch.seen, f"MPI was started and made {watch.seen}"


@pytest.mark.slow
def test_a_new_run_refuses_to_overwrite_a_checkpoint_unless_told(tmp_path):
    ok(train(tmp_path, *TINY, "--epochs", "1", "--checkpoint", "c.h5", n=None))
    before = (tmp_path / "c.h5").read_bytes()
    refused = train(tmp_path, *TINY, "--epochs", "1", "--hidden", "8", "--checkpoint", "c.h5", n=None)
    assert refused.returncode == 2, refused.stderr
    assert "--checkpoint 'c.h5' already holds a checkpoint" in refused.stderr and "--overwrite" in refused.stderr
    assert "Traceback" not in refused.stderr and (tmp_path / "c.h5").read_bytes() == before
    ok(train(tmp_path, *TINY, "--epochs", "2", "--checkpoint", "c.h5", "--resume", n=None))      # resume: allowed
    ok(train(tmp_path, *TINY, "--epochs", "1", "--hidden", "8", "--checkpoint", "c.h5", "--overwrite", n=None))
    assert fileformat.read(tmp_path / "c.h5").epochs_done == 1


def test_a_batch_larger_than_the_data_is_an_error_naming_both(tmp_path):
    for samples, batch in ((50, 96), (100, 128)):
        done = train(tmp_path, "--train-samples", str(samples), "--batch-size", str(batch), "--hidden", "8",
                     "--epochs", "1", n=None)
        assert done.returncode == 2, done.stdout + done.stderr
        line = next(line for line in done.stderr.splitlines() if line.startswith("error:"))
        assert f"--batch-size {batch} is larger than the {samples} training rows" in line
        assert "Traceback" not in done.stderr
    assert not os.listdir(tmp_path)


def test_under_npddp_run_the_default_backend_is_auto_over_tcp_and_the_security_page_command_works(tmp_path):
    """The elastic command of docs/design/security.md, as written there (plus tiny data), then ``--backend mpi``."""
    proc = ok(train(tmp_path, *TINY, "--epochs", "1", "--checkpoint", "c.h5", "--resume", "auto",
                    "--checkpoint-every", "50", launcher="npddp.run"))
    assert proc.stdout.startswith("npddp.train: 2 ranks, backend auto over tcp (default: not started by MPI), TCP")
    assert fileformat.read(tmp_path / "c.h5").backend == "auto"
    refused = train(tmp_path, *TINY, "--backend", "mpi", launcher="npddp.run")
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode == 2 and len(errors) == 1 and "--backend mpi runs MPI's own" in errors[0]


def test_under_mpirun_the_default_backend_stays_mpi_and_the_header_says_nothing_more(tmp_path):
    proc = ok(train(tmp_path, *TINY, "--epochs", "1"))
    assert proc.stdout.startswith("npddp.train: 2 ranks, backend mpi over mpi, MPI ")


def test_a_run_across_pretended_nodes_says_where_the_ranks_are_and_one_node_says_nothing(tmp_path):
    import subprocess
    import sys
    command = [mpirun_path(), "-n", "4", sys.executable, "-m", "npddp.train", *TINY, "--epochs", "1", "--backend", "ring"]
    across = ok(subprocess.run(command, cwd=tmp_path, env={**clean_env(), "NPDDP_RANKS_PER_NODE": "2"},
                               capture_output=True, text=True, timeout=120))
    assert across.stdout.splitlines()[1] == "nodes: 2 x 2 ranks (node0: 0,1; node1: 2,3)", across.stdout
    alone = ok(subprocess.run(command, cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120))
    assert "nodes:" not in alone.stdout and alone.stdout.splitlines()[1].startswith("threads: ")


def test_adamw_trains_with_its_own_default_learning_rate_and_the_header_says_so(tmp_path):
    proc = ok(train(tmp_path, *TINY, "--epochs", "1", "--max-steps", "1", "--optimizer", "adamw", n=None))
    assert "optimizer: adamw, lr 0.001 (adamw's default), weight decay" in proc.stdout, proc.stdout


def test_a_checkpoint_of_the_mpi_backend_resumes_over_tcp_with_the_default_backend_and_says_why(tmp_path):
    ok(train(tmp_path, *TINY, "--epochs", "1", "--max-steps", "2", "--checkpoint", "c.h5", n=None))   # backend mpi
    assert fileformat.read(tmp_path / "c.h5").backend == "mpi"
    resumed = ok(train(tmp_path, "--checkpoint", "c.h5", "--resume", "--max-steps", "4", n=1, launcher="npddp.run"))
    assert ("backend auto over tcp (default: the checkpoint's --backend mpi needs an MPI launcher; not started by "
            "MPI)") in resumed.stdout, resumed.stdout
    assert "resume: changed since the checkpoint: --backend mpi -> auto" in resumed.stdout, resumed.stdout
