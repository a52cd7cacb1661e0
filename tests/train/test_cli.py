"""``python -m npddp.train`` end to end: launched under ``mpirun -n 2`` (and once on one rank)
as subprocesses on tiny data, so these are serial tests that need a working mpirun.

Covered: every backend and sync strategy trains, prints and writes the metrics file; one rank
and two ranks reach the same parameters; a run stopped mid-epoch and resumed with nothing but
``--checkpoint --resume`` ends bit-identical to one that never stopped; the world size may change
on resume; bad input ends every rank with exit code 2, one message and no file overwritten; an
exception on one rank ends the job quickly. Failures during training: tests/test_train_failures.py.
The README's default training (its header lines and first epoch) is tests/test_doc_commands.py's.
"""

import os
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from npddp.checkpoint import fileformat
from npddp.train.console.metrics import EPOCH_COLUMNS, STEP_COLUMNS, read_metrics
from tests.helpers.cli import STEPS_PER_EPOCH, TINY, clean_env, epoch_lines, mpirun_path, ok, train

# ----------------------------------------------------------------------------- backends and syncs

RUNS = [("mpi", "overlap"), ("ring", "bucketed"), ("naive", "per_param"), ("mpi", "flat")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each (backend, sync) of RUNS on 2 ranks, plus the mpi/overlap run on one rank without mpirun."""
    out = {}
    for backend, sync in RUNS + [("serial", "overlap")]:
        cwd = tmp_path_factory.mktemp(f"{backend}-{sync}")
        flags = ["--sync", sync, "--bucket-mb", "0.004", "--checkpoint", "c.h5", "--metrics", "m.h5", *TINY]
        proc = train(cwd, *flags, n=None) if backend == "serial" else train(cwd, "--backend", backend, *flags)
        out[backend, sync] = (proc, cwd)
    cwd = tmp_path_factory.mktemp("ring-tcp")               # the ring again, over TCP under npddp.run
    out["ring-tcp", "bucketed"] = (train(cwd, "--backend", "ring", "--transport", "tcp", "--sync", "bucketed",
                                         "--bucket-mb", "0.004", "--checkpoint", "c.h5", *TINY,
                                         launcher="npddp.run"), cwd)
    return out


@pytest.mark.slow
def test_the_ring_over_tcp_under_npddp_run_ends_bit_identical_to_the_ring_over_mpi(runs):
    """Same algorithm, same order of additions: the transport must not change a single bit."""
    proc, cwd = runs["ring-tcp", "bucketed"]
    assert ok(proc).stdout.startswith("npddp.train: 2 ranks, backend ring over tcp, TCP sockets, no MPI")
    over_mpi = fileformat.read(runs["ring", "bucketed"][1] / "c.h5").params
    over_tcp = fileformat.read(cwd / "c.h5").params
    assert over_mpi.keys() == over_tcp.keys()
    for name, value in over_mpi.items():
        assert np.array_equal(over_tcp[name], value), name


@pytest.mark.parametrize("backend, sync", RUNS)
def test_each_backend_and_sync_prints_a_header_one_line_per_epoch_and_a_summary(runs, backend, sync):
    proc, _ = runs[backend, sync]
    ok(proc)
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"npddp.train: 2 ranks, backend {backend} over mpi, MPI ")
    assert lines[1] == "threads: 1 BLAS thread per rank (auto: OPENBLAS_NUM_THREADS=1)"     # as the tests set it
    assert any(line.startswith("model: mlp 64-16-10; 1,210 parameters (float64") for line in lines)
    assert any(line.startswith(f"sync: {sync}, ") for line in lines)
    assert any("batch 32 = 2 x 16, 12 steps per epoch" in line for line in lines)
    epochs = epoch_lines(proc.stdout)
    assert [e.split()[1] for e in epochs] == ["1/2", "2/2"]
    for e in epochs:
        for field in ("train_loss", "val_loss", "val_acc", "samples/s", "compute", "comm"):
            assert field in e
    assert lines[-1].startswith("done: epoch 2/2, step 24,") and "checkpoint c.h5; metrics m.h5" in lines[-1]
    assert proc.stderr == ""            # stderr is no terminal: no progress bar, and nothing went wrong


def test_one_rank_without_mpirun_and_every_backend_and_sync_reach_the_same_parameters(runs):
    """The global batch is the same rows on 1 and 2 ranks, so the parameters agree to rounding."""
    reference = fileformat.read(runs["mpi", "overlap"][1] / "c.h5").params
    assert ok(runs["serial", "overlap"][0]).stdout.startswith("npddp.train: 1 rank, backend mpi")
    for key in RUNS[1:] + [("serial", "overlap")]:
        params = fileformat.read(ok(runs[key][0]) and runs[key][1] / "c.h5").params
        for name, value in reference.items():
            np.testing.assert_allclose(params[name], value, rtol=1e-9, atol=1e-12, err_msg=f"{key} {name}")


@pytest.mark.parametrize("backend, sync", RUNS)
def test_the_metrics_file_has_step_and_epoch_columns_and_the_run_as_attributes(runs, backend, sync):
    proc, cwd = runs[backend, sync]
    ok(proc)
    m = read_metrics(cwd / "m.h5")
    attrs, steps, epochs = m["attrs"], m["steps"], m["epochs"]
    assert attrs["format"] == "npddp-metrics" and attrs["schema_version"] >= 1
    assert attrs["world_size"] == 2 and attrs["backend"] == backend and attrs["config.sync"] == sync
    assert attrs["status"] == "complete" and attrs["mpi_library"] and attrs["parameters"] == 1210
    assert set(steps) == set(STEP_COLUMNS) and set(epochs) == set(EPOCH_COLUMNS)
    assert all(v.ndim == 1 and len(v) == 2 * STEPS_PER_EPOCH for v in steps.values())
    assert all(v.ndim == 1 and len(v) == 2 for v in epochs.values())
    assert np.array_equal(steps["step"], np.arange(1, 25))
    assert np.array_equal(steps["epoch"], np.repeat([1, 2], 12)) and np.array_equal(steps["batch"], np.tile(np.arange(1, 13), 2))
    assert np.all(steps["samples"] == 32) and np.all(steps["lr"] == 0.05) and np.all(steps["step_s"] > 0)
    assert np.all(steps["comm_bytes"] > 0)
    calls = {"per_param": 4, "flat": 1}.get(sync, 2)   # 4 tensors; 4 KiB buckets: [0.weight], the rest
    assert np.all(steps["comm_calls"] == calls)
    for e in (1, 2):                                           # epoch loss = row-weighted step losses
        rows = steps["epoch"] == e
        mean = np.sum(steps["loss"][rows] * steps["samples"][rows]) / np.sum(steps["samples"][rows])
        assert np.isclose(epochs["train_loss"][e - 1], mean, rtol=1e-12)
    assert np.array_equal(epochs["samples"], [384, 384]) and np.array_equal(epochs["val_samples"], [96, 96])
    assert np.all((0 <= epochs["val_acc"]) & (epochs["val_acc"] <= 1)) and np.array_equal(epochs["step"], [12, 24])
    printed = [float(e.split("val_loss")[1].split()[0]) for e in epoch_lines(proc.stdout)]
    np.testing.assert_allclose(printed, epochs["val_loss"], atol=6e-5)
    pd = pytest.importorskip("pandas")
    with h5py.File(cwd / "m.h5", "r") as f:
        table = pd.DataFrame({k: f["steps"][k][:] for k in f["steps"]})
    assert table.shape == (24, len(STEP_COLUMNS))


def test_local_sgd_counts_the_time_it_spends_averaging_as_communication(tmp_path):
    ok(train(tmp_path, *TINY, "--local-sgd", "3", "--metrics", "m.h5"))
    steps = read_metrics(tmp_path / "m.h5")["steps"]
    averaged = steps["comm_calls"] > 0
    assert averaged.sum() == 8, steps["comm_calls"]                      # every third of 24 steps
    assert np.all(steps["comm_exposed_s"][averaged] > 0) and np.all(steps["comm_exposed_s"][~averaged] == 0)


@pytest.mark.slow
def test_array_files_train_the_mlp_and_image_files_the_cnn(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 12))
    np.savez(tmp_path / "rows.npz", X=X, y=(X[:, 0] > 0).astype(np.int32) + (X[:, 1] > 0))
    with h5py.File(tmp_path / "images.h5", "w") as f:
        f["X"] = rng.standard_normal((200, 1, 8, 8)).astype(np.float32)
        f["y"] = rng.integers(0, 4, 200)
    rows = ok(train(tmp_path, "--dataset", "rows.npz", "--batch-size", "20", "--epochs", "2", "--threads", "1"))
    assert "data: rows.npz, 180 train / 20 val rows of shape (12,), 3 classes" in rows.stdout
    assert len(epoch_lines(rows.stdout)) == 2 and rows.stderr == ""
    images = ok(train(tmp_path, "--dataset", "images.h5", "--model", "cnn", "--channels", "2", "--hidden", "8",
                      "--batch-size", "20", "--epochs", "1", "--threads", "2"))
    assert "model: cnn (1, 8, 8), conv 2, dense 8-4;" in images.stdout
    assert "data: images.h5, 180 train / 20 val rows of shape (1, 8, 8), 4 classes" in images.stdout
    assert len(epoch_lines(images.stdout)) == 1 and images.stderr == ""
    assert "threads: 2 BLAS threads per rank (--threads)" in images.stdout


def test_help_is_printed_once_under_mpirun(tmp_path):
    proc = ok(train(tmp_path, "--help"))
    assert proc.stdout.count("usage: python -m npddp.train") == 1 and "--checkpoint-every" in proc.stdout


# ----------------------------------------------------------------------------- exact resume

RESUME_CASES = {
    # stop at step 17 = epoch 2, batch 5: SGD momentum, dropout, top-k error feedback, ring backend
    "sgd-dropout-topk-ring": (["--backend", "ring", "--momentum", "0.9", "--weight-decay", "1e-4",
                               "--dropout", "0.2", "--comm-hook", "topk", "--topk-ratio", "0.3",
                               "--sync", "bucketed", "--bucket-mb", "0.004"], 17, []),
    # stop at step 17: PowerSGD rank 2 (from step 4) keeps its error feedback, Ps, Qs and seed stream
    "sgd-powersgd": (["--momentum", "0.9", "--dropout", "0.1", "--comm-hook", "powersgd", "--powersgd-rank", "2",
                      "--powersgd-start-iter", "4", "--sync", "overlap", "--bucket-mb", "0.004"], 17, []),
    # stop at step 7 = epoch 1, batch 7 (after checkpoints at 5): AdamW, local SGD, dropout
    "adamw-localsgd-dropout": (["--optimizer", "adamw", "--lr", "0.01", "--weight-decay", "0.01",
                                "--local-sgd", "3", "--dropout", "0.1"], 7, ["--checkpoint-every", "5"]),
}


@pytest.mark.parametrize("case", sorted(RESUME_CASES))
@pytest.mark.slow
def test_a_run_stopped_mid_epoch_and_resumed_ends_bit_identical_to_an_uninterrupted_one(tmp_path, case):
    flags, stop, extra = RESUME_CASES[case]
    flags = [*TINY, "--epochs", "3", *flags]
    whole = ok(train(tmp_path, *flags, "--checkpoint", "a.h5", "--metrics", "ma.h5"))
    first = ok(train(tmp_path, *flags, "--checkpoint", "b.h5", "--metrics", "mb.h5", "--max-steps", stop, *extra))
    assert first.stdout.splitlines()[-1].startswith(f"stopped (--max-steps): epoch {stop // 12}/3, step {stop},")
    mid = fileformat.read(tmp_path / "b.h5")
    assert (mid.step, mid.epochs_done, mid.batches_done) == (stop, stop // 12, stop % 12)
    second = ok(train(tmp_path, "--checkpoint", "b.h5", "--resume"))         # every setting from b.h5
    assert f"resuming b.h5 at epoch {stop // 12 + 1}, batch {stop % 12} done (step {stop})" in second.stdout
    assert "resume: same settings as the checkpoint; bit-identical to an uninterrupted run" in second.stdout
    assert len(epoch_lines(second.stdout)) == 3 - stop // 12

    a, b = fileformat.read(tmp_path / "a.h5"), fileformat.read(tmp_path / "b.h5")
    assert (a.step, a.epochs_done, a.batches_done) == (b.step, b.epochs_done, b.batches_done) == (36, 3, 0)
    for name in a.params:
        assert np.array_equal(a.params[name], b.params[name]), name
    for key in a.optimizer:
        assert np.array_equal(a.optimizer[key], b.optimizer[key]), key
    assert a.dropout_rng.shape == (2, 1, 6) and np.array_equal(a.dropout_rng, b.dropout_rng)
    assert sorted(a.hook_state) == sorted(b.hook_state)
    assert all(np.array_equal(a.hook_state[k], b.hook_state[k]) for k in a.hook_state)
    assert a.per_rank == ("--local-sgd" in flags)
    ma, mb = read_metrics(tmp_path / "ma.h5"), read_metrics(tmp_path / "mb.h5")
    for group in ("steps", "epochs"):
        for column, values in ma[group].items():
            if not column.endswith(("_s", "_share")):          # timings differ between runs
                assert np.array_equal(values, mb[group][column]), (group, column)
    # the printed epoch lines agree too, up to the timings
    key = lambda line: line.split("samples/s")[0].rsplit(None, 1)[0]   # noqa: E731
    assert [key(x) for x in epoch_lines(second.stdout)] == \
        [key(x) for x in epoch_lines(whole.stdout)][stop // 12:]

    before = (tmp_path / "b.h5").read_bytes()
    again = ok(train(tmp_path, *flags, "--checkpoint", "b.h5", "--resume"))
    assert "nothing to do" in again.stdout and (tmp_path / "b.h5").read_bytes() == before


@pytest.mark.slow
def test_resume_on_another_world_size_continues_and_says_bit_identity_is_given_up(tmp_path):
    ok(train(tmp_path, *TINY, "--dropout", "0.1", "--checkpoint", "c.h5", "--max-steps", "5"))
    moved = ok(train(tmp_path, "--checkpoint", "c.h5", "--resume", n=None))
    assert "resume: changed since the checkpoint: world size 2 -> 1; per-rank state" in moved.stdout
    assert "no longer bit-identical" in moved.stdout and moved.stderr == ""
    assert moved.stdout.splitlines()[-1].startswith("done: epoch 2/2, step 24,")
    assert fileformat.read(tmp_path / "c.h5").world_size == 1


# ----------------------------------------------------------------------------- bad input

@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory):
    """A directory with a real 2-rank checkpoint and files that are not usable inputs."""
    d = tmp_path_factory.mktemp("bad")
    ok(train(d, *TINY, "--epochs", "1", "--checkpoint", "keep.h5"))
    (d / "junk.h5").write_bytes(b"this is not HDF5")
    with h5py.File(d / "foreign.h5", "w") as f:
        f.create_dataset("weights", data=np.zeros(3))
    np.savez(d / "floaty.npz", X=np.zeros((20, 3)), y=np.zeros(20))
    os.mkfifo(d / "fifo.h5")
    np.savez(d / "good.npz", X=np.zeros((20, 3)), y=np.zeros(20, int))
    (d / "cut.npz").write_bytes((d / "good.npz").read_bytes()[:200])
    (d / "plug").mkdir()                         # its own directory: importing it may leave a __pycache__ there
    (d / "plug" / "boom.py").write_text("raise RuntimeError('boom while registering')\n")
    np.save(d / "renamed.npy", np.zeros((20, 3)))
    (d / "renamed.npy").rename(d / "renamed.npz")
    with h5py.File(d / "nested.h5", "w") as f:
        f["train/images"] = np.zeros((20, 3))
        f["train/labels"] = np.zeros(20, int)
    data = bytearray((d / "keep.h5").read_bytes())
    with h5py.File(d / "keep.h5", "r") as f:
        offset = f["params/0.weight"].id.get_offset()           # one byte inside a parameter's values
    data[offset + 3] ^= 0xFF
    (d / "flipped.h5").write_bytes(bytes(data))
    far = fileformat.read(d / "keep.h5")
    far.batches_done, far.step = 10**6, 10**6 + 12
    far.optimizer["step"] = np.int64(far.step)
    fileformat.write(d / "far.h5", far)                # sealed: only the position check can refuse it
    return d


BAD = [
    pytest.param(2, ["--epochs", "0"], "--epochs must be a positive integer, got 0", id="epochs-0"),
    pytest.param(2, ["--batch-size", "1"], "--batch-size 1 is smaller than the world size 2", id="batch-1"),
    pytest.param(2, ["--dataset", "missing.npz", "--checkpoint", "keep.h5"], "--dataset missing.npz: array file",
                 id="missing-data"),
    pytest.param(2, ["--dataset", "floaty.npz"], "--dataset floaty.npz holds float targets", id="float-labels"),
    pytest.param(2, ["--checkpoint", "missing.h5", "--resume"], "--resume: checkpoint 'missing.h5' does not exist",
                 id="resume-missing"),
    pytest.param(2, ["--checkpoint", "junk.h5", "--resume"],
                 "--resume: cannot read checkpoint 'junk.h5': not an HDF5 file", id="resume-junk"),
    pytest.param(2, ["--checkpoint", "foreign.h5", "--resume"], "--resume: 'foreign.h5' is not an npddp checkpoint",
                 id="resume-foreign"),
    pytest.param(2, [*TINY, "--hidden", "8", "--checkpoint", "keep.h5", "--resume"],
                 "was written with --hidden 16, this run has --hidden 8", id="resume-other-model"),
    pytest.param(2, ["--checkpoint", "fifo.h5"], "--checkpoint 'fifo.h5' is a FIFO, not a regular file", id="fifo-out"),
    pytest.param(2, ["--checkpoint", "fifo.h5", "--resume"], "'fifo.h5' is a FIFO, not a regular file",
                 id="fifo-resume"),
    pytest.param(2, ["--dataset", "cut.npz"], "damaged or truncated .npz file", id="truncated-npz"),
    pytest.param(2, ["--dataset", "renamed.npz"], "its name says .npz but it is a .npy file", id="npy-as-npz"),
    pytest.param(2, ["--dataset", "nested.h5", "--x-key", "train/images"], "has no array named 'y'; available: "
                 "'train/images', 'train/labels' (choose them with --x-key/--y-key", id="missing-key"),
    pytest.param(2, ["--checkpoint", "flipped.h5", "--resume"], "'flipped.h5' is damaged: checksum mismatch in "
                 "/params/0.weight", id="resume-damaged"),
    pytest.param(2, ["--checkpoint", "far.h5", "--resume"], "says 1000000 batches of the epoch are done, but an "
                 "epoch of this data has 12 steps on 2 ranks; valid: 0..11", id="resume-position"),
    pytest.param(2, ["--checkpoint", "foreign.h5"], "--checkpoint 'foreign.h5' exists and is not an npddp "
                 "checkpoint file", id="replace-foreign"),
    pytest.param(2, ["--metrics", "keep.h5"], "--metrics 'keep.h5' exists and is not an npddp metrics file; refusing",
                 id="metrics-over-checkpoint"),
    pytest.param(2, ["--metrics", "nodir/m.h5"], "--metrics 'nodir/m.h5': directory", id="metrics-no-dir"),
    pytest.param(2, ["--plugin", "plug/boom.py"], "--plugin 'plug/boom.py' raised RuntimeError while imported: boom "
                 "while registering", id="plugin-raises"),
    pytest.param(2, ["--backend", "custom_ring"], "an algorithm of your own needs --plugin MODULE", id="no-plugin"),
    pytest.param(2, ["--model-size", "small"], "--model-size small applies to --model gpt", id="gpt-flag-on-mlp"),
]


@pytest.mark.parametrize("n, args, text", BAD)
@pytest.mark.slow
def test_bad_input_exits_2_on_every_rank_with_one_message_and_overwrites_nothing(bad_inputs, n, args, text):
    def contents():
        return {p.name: p.read_bytes() if p.is_file() else p.stat().st_mode for p in bad_inputs.iterdir()}
    files = contents()
    proc = train(bad_inputs, *args, n=n, timeout=60)            # a FIFO opened for reading would block here
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], proc.stderr
    assert proc.stdout == ""
    assert contents() == files


def test_an_exception_on_one_rank_ends_the_whole_job_within_seconds(tmp_path):
    snippet = ("from npddp.process.job import abort_on_exception\n"
               "abort_on_exception()\n"
               "from mpi4py import MPI\n"
               "if MPI.COMM_WORLD.Get_rank() == 1:\n"
               "    raise RuntimeError('boom on rank 1')\n"
               "MPI.COMM_WORLD.Barrier()\n")
    start = time.monotonic()
    proc = subprocess.run([mpirun_path(), "-n", "2", sys.executable, "-c", snippet], cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and time.monotonic() - start < 20
    assert "boom on rank 1" in proc.stderr
