"""Checkpoint files: round trip, checksums and validation that refuse damaged files, survival of a
SIGKILL mid-write (and removal of the temporary file it leaves), a full disk, load_model, and
(under MPI) gather and restore of every rank's state (npddp.checkpoint.state).

Serial tests run with plain pytest; the MPI tests run under ``mpirun -n K python -m pytest --with-mpi``.
"""

import contextlib
import errno
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import h5py
import numpy as np
import pytest

from npddp.util import atomicfile
from npddp.checkpoint import fileformat
from npddp.checkpoint import state
from npddp.parallel.hooks import HookState
from npddp.checkpoint.fileformat import Checkpoint, CheckpointError
from npddp.checkpoint.stateful import ModelState, RunInfo, TrainState
from npddp.nn import mlp
from npddp.optim import SGD, AdamW
from npddp.util.runinfo import SCHEMA_VERSION

FIXED = ("model", "hidden", "batch_size", "seed")
FLAGS = {"model": "--model", "hidden": "--hidden", "batch_size": "--batch-size", "seed": "--seed"}
CONFIG = {"model": "mlp", "hidden": [5], "batch_size": 8, "seed": 0, "optimizer": "sgd"}


def record(world=2, per_rank=True, seed=0) -> Checkpoint:
    """A Checkpoint of every kind of content, with values drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    lead = (world,) if per_rank else ()
    return Checkpoint(
        epochs_done=3, batches_done=7, step=52, world_size=world, backend="ring", config=dict(CONFIG),
        params={"0.weight": rng.standard_normal(lead + (4, 5)).astype(np.float32),
                "0.bias": rng.standard_normal(lead + (5,)).astype(np.float32)},
        optimizer={"step": np.int64(52), "lr": 0.05, "momentum": 0.9, "nesterov": False,
                   "weight_decay": 0.0,
                   "momentum_buffer.0": rng.standard_normal(lead + (4, 5)).astype(np.float32),
                   "momentum_buffer.1": rng.standard_normal(lead + (5,)).astype(np.float32)},
        optimizer_name="sgd", per_rank=per_rank,
        dropout_rng=rng.integers(0, 2**63, size=(world, 2, 6), dtype=np.uint64) | np.uint64(2**63),
        hook_state={"error.0": rng.standard_normal((world, 9)), "error.1": rng.standard_normal((world, 3)),
                    "iter": rng.integers(0, 9, (world, 1))},
        totals=rng.standard_normal(10), totals_columns=tuple(f"c{i}" for i in range(10)),
        attrs={"host": "h", "mpi_library": "X"})


def assert_same(a: Checkpoint, b: Checkpoint):
    for name in ("epochs_done", "batches_done", "step", "world_size", "backend", "config",
                 "optimizer_name", "per_rank", "totals_columns"):
        assert getattr(a, name) == getattr(b, name), name
    assert list(a.params) == list(b.params)
    for k in a.params:
        assert a.params[k].dtype == b.params[k].dtype and np.array_equal(a.params[k], b.params[k])
    assert set(a.optimizer) == set(b.optimizer)
    for k in a.optimizer:
        assert np.array_equal(a.optimizer[k], b.optimizer[k]), k
        assert type(a.optimizer[k]) is type(b.optimizer[k]) or isinstance(a.optimizer[k], np.ndarray), k
    assert b.dropout_rng.dtype == np.uint64 and np.array_equal(a.dropout_rng, b.dropout_rng)
    assert sorted(a.hook_state) == sorted(b.hook_state)
    assert all(np.array_equal(a.hook_state[k], b.hook_state[k]) for k in a.hook_state)
    assert np.array_equal(a.totals, b.totals)


@pytest.mark.parametrize("world, per_rank", [(1, False), (2, True), (3, False), (4, True)])
def test_write_then_read_gives_back_every_bit(tmp_path, world, per_rank):
    ckpt = record(world, per_rank, seed=world)
    fileformat.write(tmp_path / "c.h5", ckpt)
    assert_same(ckpt, fileformat.read(tmp_path / "c.h5"))
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert f.attrs["format"] == "npddp-checkpoint" and f.attrs["schema_version"] == SCHEMA_VERSION
        assert f.attrs["host"] == "h" and f.attrs["config.batch_size"] == 8
        assert f["rng/dropout"].shape == (world, 2, 6)
    assert os.listdir(tmp_path) == ["c.h5"]   # no temporary file left behind


def test_a_record_without_dropout_or_residuals_round_trips(tmp_path):
    ckpt = record(1, False)
    ckpt.dropout_rng, ckpt.hook_state = None, {}
    fileformat.write(tmp_path / "c.h5", ckpt)
    back = fileformat.read(tmp_path / "c.h5")
    assert back.dropout_rng is None and back.hook_state == {}


def _damage(path, how):
    if how == "missing":
        return
    if how == "junk":
        path.write_bytes(b"not an hdf5 file at all")
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "truncated":
        fileformat.write(path, record())
        path.write_bytes(path.read_bytes()[:1000])
    elif how == "foreign":
        with h5py.File(path, "w") as f:
            f.create_dataset("weights", data=np.zeros(3))
    elif how == "metrics":
        with h5py.File(path, "w") as f:
            f.attrs["format"] = "npddp-metrics"
    elif how == "schema":
        fileformat.write(path, record())
        with h5py.File(path, "r+") as f:
            f.attrs["schema_version"] = SCHEMA_VERSION + 1
    elif how == "incomplete":
        fileformat.write(path, record())
        with h5py.File(path, "r+") as f:
            del f["params/0.bias"]


@pytest.mark.parametrize("how, text", [
    ("missing", "does not exist"),
    ("junk", "not an HDF5 file, or damaged"),
    ("empty", "not an HDF5 file, or damaged"),
    ("truncated", "damaged"),
    ("foreign", "is not an npddp checkpoint (no 'format' attribute"),
    ("metrics", "is not an npddp checkpoint (format 'npddp-metrics'"),
    ("schema", f"has schema version {SCHEMA_VERSION + 1}; this npddp reads version {SCHEMA_VERSION}"),
    ("incomplete", "is damaged"),
])
def test_unreadable_checkpoints_give_one_clear_error_naming_the_file(tmp_path, how, text):
    path = tmp_path / "c.h5"
    _damage(path, how)
    with pytest.raises(CheckpointError) as info:
        fileformat.read(path)
    assert text in str(info.value) and repr(str(path)) in str(info.value)


CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from npddp.checkpoint.fileformat import Checkpoint, write

    def make(tag, n):
        params = {f"p{i}": np.full(n, float(tag)) for i in range(4)}
        return Checkpoint(epochs_done=tag, batches_done=0, step=tag, world_size=1, backend="mpi",
                          config={"seed": 0}, params=params, optimizer={"step": np.int64(tag)},
                          optimizer_name="sgd")

    write(sys.argv[1], make(1, 1000))
    big = make(2, 4_000_000)                       # 4 x 32 MB: a write that takes a while
    print("first written", flush=True)
    write(sys.argv[1], big)
    print("second written", flush=True)
""")


@pytest.mark.slow
def test_sigkill_during_a_checkpoint_write_leaves_the_previous_checkpoint_whole(tmp_path):
    target = tmp_path / "run.h5"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(target)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "first written"
        first = target.read_bytes()
        deadline, temp = time.monotonic() + 60, None
        while time.monotonic() < deadline:      # wait until the second write is under way
            temps = [p for p in tmp_path.iterdir() if p.name != "run.h5"]
            try:
                if temps and temps[0].stat().st_size > 1 << 20:
                    temp = temps[0]
                    break
            except FileNotFoundError:           # renamed onto the target meanwhile: caught below
                pass
            assert child.poll() is None, "the child finished before the second write was seen"
        assert temp is not None and temp.name.startswith(".run.h5.") and temp.name.endswith(".tmp")
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert target.read_bytes() == first
    back = fileformat.read(target)
    assert back.step == 1 and all(np.array_equal(v, np.ones(1000)) for v in back.params.values())
    # the killed writer's temporary file is recognised as stale and removed by the next write
    assert temp.exists() and atomicfile.stale_temps(target) == [temp]
    fileformat.write(target, back)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.h5"]


# ----------------------------------------------------------------------------- integrity and validation

def _flip(path, offset, count=1):
    """Invert ``count`` bytes of the file at ``offset``."""
    data = bytearray(path.read_bytes())
    for i in range(offset, offset + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_every_dataset_and_the_attributes_carry_a_checksum(tmp_path):
    fileformat.write(tmp_path / "c.h5", record())
    with h5py.File(tmp_path / "c.h5", "r") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        assert names and all("crc32" in f[n].attrs for n in names)
        assert "attrs_crc32" in f.attrs


def test_a_flipped_byte_inside_a_parameter_is_found_and_named(tmp_path):
    path = tmp_path / "c.h5"
    fileformat.write(path, record())
    with h5py.File(path, "r") as f:
        offset = f["params/0.weight"].id.get_offset()
    _flip(path, offset + 5)
    with pytest.raises(CheckpointError, match=r"damaged: checksum mismatch in /params/0\.weight"):
        fileformat.read(path)


@pytest.mark.parametrize("where", [0.3, 0.5, 0.7])
def test_64_flipped_bytes_anywhere_in_the_middle_are_refused(tmp_path, where):
    path = tmp_path / "c.h5"
    fileformat.write(path, record())
    _flip(path, int(path.stat().st_size * where), 64)
    with pytest.raises(CheckpointError, match="damaged|not an HDF5|not an npddp"):
        fileformat.read(path)


@pytest.mark.parametrize("name, value", [("step", -5), ("batches_done", 10**6), ("epochs_done", -1),
                                         ("world_size", 3), ("config", "{}")])
def test_an_attribute_changed_after_writing_fails_the_checksum(tmp_path, name, value):
    path = tmp_path / "c.h5"
    fileformat.write(path, record())
    with h5py.File(path, "r+") as f:
        f.attrs[name] = value
    with pytest.raises(CheckpointError, match="attributes .* do not match their checksum"):
        fileformat.read(path)


def test_a_file_without_checksums_is_refused(tmp_path):
    path = tmp_path / "c.h5"
    fileformat.write(path, record())
    with h5py.File(path, "r+") as f:
        del f.attrs["attrs_crc32"]
    with pytest.raises(CheckpointError, match="carries no checksums"):
        fileformat.read(path)


BAD_POSITIONS = [
    (dict(step=-5), "step is -5; valid: an integer >= 0"),
    (dict(epochs_done=-1), "epochs_done is -1; valid: an integer >= 0"),
    (dict(batches_done=-3), "batches_done is -3; valid: an integer >= 0"),
    (dict(step=2.5), "step is 2.5; valid: an integer"),
    (dict(world_size=0), "world_size is 0; valid: an integer >= 1"),
    (dict(step=3), "step 3 is smaller than epochs_done + batches_done = 10"),
    (dict(optimizer_step=2.5), "optimizer step is 2.5; valid: the integer 52"),
    (dict(optimizer_step=51), "optimizer step is 51; valid: the integer 52"),
]


@pytest.mark.parametrize("change, text", BAD_POSITIONS)
def test_positions_and_counters_out_of_range_are_refused_even_with_a_valid_checksum(tmp_path, change, text):
    ckpt = record()
    for name, value in change.items():
        if name == "optimizer_step":
            ckpt.optimizer["step"] = np.float64(value) if isinstance(value, float) else np.int64(value)
        else:
            setattr(ckpt, name, value)
    path = tmp_path / "c.h5"
    fileformat.write(path, ckpt)                  # written (and sealed) as given
    with pytest.raises(CheckpointError, match=re.escape(text)):
        fileformat.read(path)
    assert fileformat.validate(record()) is None


def _read_in_child(path, timeout=30):
    code = (f"from npddp.checkpoint import fileformat\ntry:\n    fileformat.read({str(path)!r})\n"
            "except fileformat.CheckpointError as e:\n    print(e)")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


def test_a_fifo_is_refused_at_once_instead_of_blocking(tmp_path):
    fifo = tmp_path / "c.h5"
    os.mkfifo(fifo)
    proc = _read_in_child(fifo)                   # a blocked open would hit the timeout
    assert "is a FIFO, not a regular file" in proc.stdout


# ----------------------------------------------------------------------------- temporary files and full disks

def test_temporary_files_name_their_target_host_and_writer(tmp_path):
    target = tmp_path / "run.h5"
    tmp = atomicfile.temp_path(target)
    assert tmp.parent == tmp_path and tmp.name.startswith(".run.h5.") and tmp.name.endswith(".npddp.tmp")
    host, pid = atomicfile.temp_owner(tmp, target)
    assert pid == os.getpid() and host
    assert atomicfile.temp_owner(tmp_path / ".other.h5.h.1.ab.npddp.tmp", target) is None


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_temporary_files_of_dead_writers_on_this_host_are_stale(tmp_path):
    import socket

    target, host = tmp_path / "run.h5", socket.gethostname()
    dead = tmp_path / f".run.h5.{host}.{_dead_pid()}.aaaa.npddp.tmp"
    alive = tmp_path / f".run.h5.{host}.{os.getppid()}.bbbb.npddp.tmp"        # our parent still runs
    elsewhere = tmp_path / f".run.h5.some-other-host.{_dead_pid()}.cccc.npddp.tmp"
    other_target = tmp_path / f".old.h5.{host}.{_dead_pid()}.dddd.npddp.tmp"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        reused = tmp_path / f".run.h5.{host}.{sleeper.pid}.eeee.npddp.tmp"     # pid now held by a newer process
        for p in (dead, alive, elsewhere, other_target, reused):
            p.write_bytes(b"x" * 10)
        os.utime(reused, (time.time() - 3600, time.time() - 3600))
        assert atomicfile.stale_temps(target) == sorted([dead, reused])
        assert atomicfile.remove_stale_temps(target) == (2, 20)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (alive, elsewhere, other_target))


@pytest.mark.parametrize("errno_code", [errno.ENOSPC, errno.EIO])
def test_a_full_disk_leaves_the_previous_checkpoint_and_no_temporary_file(tmp_path, monkeypatch, errno_code):
    path = tmp_path / "c.h5"
    fileformat.write(path, record(seed=1))
    before = path.read_bytes()
    calls = []

    def failing_write(fd, data):
        calls.append(len(data))
        if len(calls) > 1:                        # part of the file is written, then the disk is full
            raise OSError(errno_code, os.strerror(errno_code))
        return os.write.__wrapped__(fd, data[:4096]) if hasattr(os.write, "__wrapped__") else real(fd, data[:4096])
    real = os.write
    monkeypatch.setattr(atomicfile.os, "write", failing_write)
    with pytest.raises(OSError) as info:
        fileformat.write(path, record(seed=2))
    monkeypatch.undo()
    assert info.value.errno == errno_code and len(calls) > 1
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["c.h5"]
    assert_same(record(seed=1), fileformat.read(path))


FULL_DISK = textwrap.dedent("""
    import resource, signal, sys
    import numpy as np
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)            # writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))
    from npddp.train.console.metrics import STEP_COLUMNS, MetricsLog
    log = MetricsLog()
    log.add_steps({k: np.arange(5000) for k in STEP_COLUMNS})
    try:
        log.write(sys.argv[1], {"a": 1})
    except OSError as exc:
        print("OSError", exc.errno)
""")


def test_a_metrics_write_past_a_file_size_limit_is_one_oserror_and_a_clean_exit(tmp_path):
    """A real failing write (RLIMIT_FSIZE): an OSError, no temporary file, no error from HDF5 at exit."""
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, str(tmp_path / "m.h5")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"OSError {errno.EFBIG}", proc.stdout + proc.stderr
    assert proc.stderr == "" and os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- using the model

def test_load_model_rebuilds_the_trained_model(tmp_path):
    from npddp.train.checkpoint.saving import load_model
    from npddp.train.models import build_model

    settings = {"model": "mlp", "hidden": [6], "channels": [2], "dtype": "float64", "seed": 3, "dropout": 0.2}
    model, _, _ = build_model(settings, (4,), 3)
    for p in model.parameters():
        p.data[...] = np.random.default_rng(1).standard_normal(p.data.shape)
    opt = SGD(model.parameters(), lr=0.1)
    ckpt = Checkpoint(epochs_done=1, batches_done=0, step=1, world_size=1, backend="mpi", config=settings,
                      params=model.state_dict(), optimizer={**opt.state_dict(), "step": np.int64(1)},
                      optimizer_name="sgd", input_shape=(4,), num_classes=3)
    fileformat.write(tmp_path / "c.h5", ckpt)
    back = load_model(tmp_path / "c.h5")
    x = np.random.default_rng(2).standard_normal((5, 4))
    assert not back.training and np.array_equal(back.forward(x), model.eval().forward(x))
    ckpt.input_shape, ckpt.num_classes = (), 0
    fileformat.write(tmp_path / "old.h5", ckpt)
    with pytest.raises(CheckpointError, match="does not record the model's input shape"):
        load_model(tmp_path / "old.h5")


def _model_and_optimizer(hidden=5, kind="sgd"):
    model = mlp(4, [hidden], 3, seed=0)
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9) if kind == "sgd" else AdamW(model.parameters(), lr=0.1)
    return model, opt


def _saved(model, opt, world=2, **config):
    named = model.named_parameters()
    return Checkpoint(epochs_done=0, batches_done=1, step=1, world_size=world, backend="mpi",
                      config={**CONFIG, **config}, params={n: p.data.copy() for n, p in named},
                      optimizer=opt.state_dict(), optimizer_name="sgd" if isinstance(opt, SGD) else "adamw")

# ----------------------------------------------------------------------------- collect and restore under MPI

def _state(model, opt, dropouts, ddp):
    """Copies of everything restore must bring back, as one float64 vector plus the optimizer step."""
    parts = [p.data.ravel() for p in model.parameters()]
    parts += [v.ravel() for k, v in sorted(opt.state_dict().items()) if isinstance(v, np.ndarray) and v.ndim]
    parts += [d.get_rng_state().view(np.int64).astype(np.float64) for d in dropouts]
    hook = ddp.comm_hook_state
    parts += [v.ravel().astype(np.float64) for k, v in sorted(hook.state_dict().items())] if isinstance(hook, HookState) else []
    return np.concatenate(parts).astype(np.float64), int(opt.step_count), int(ddp.steps)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("local_sgd, hook", [(2, "allreduce"), (0, "topk"), (0, "powersgd")])
def test_collect_then_restore_brings_back_every_ranks_state(comm_world, assert_all_ranks, local_sgd, hook):
    from npddp.parallel.averaging import PeriodicModelAverager
    from npddp.parallel.hook_registry import build
    from npddp.comm import create
    from npddp.parallel.ddp import DistributedDataParallel
    from npddp.nn import CrossEntropyLoss, Dropout, Sequential

    comm = create("mpi", comm_world)
    model = mlp(6, [8], 3, seed=1)
    dropouts = [Dropout(0.3, seed=100 + comm.rank)]
    model = Sequential(*model.layers[:2], dropouts[0], *model.layers[2:])
    ddp = DistributedDataParallel(model, comm, sync="bucketed", bucket_cap_mb=1e-4)
    ddp.register_comm_hook(*build(hook, comm, topk_ratio=0.2, powersgd_start_iter=2, powersgd_rank=2))
    averager = PeriodicModelAverager(comm, local_sgd) if local_sgd else None
    opt = SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    rng, loss = np.random.default_rng(comm.rank), CrossEntropyLoss()
    for _ in range(3):                            # local SGD: replicas differ after 3 steps
        ddp.zero_grad()
        loss.forward(ddp(rng.standard_normal((4, 6)).astype(np.float32)), rng.integers(0, 3, 4))
        with ddp.no_sync() if averager is not None else contextlib.nullcontext():
            ddp.backward(loss.backward())
        ddp.step(opt)
        if averager is not None:
            averager.average_parameters(ddp.parameters())
    before = _state(model, opt, dropouts, ddp)
    ckpt = state.collect(comm, ModelState(model.named_parameters(), dropouts, ddp, per_rank=bool(local_sgd)), opt,
                         TrainState(1, 2, 3, np.arange(4.0), ("a", "b", "c", "d")),
                         RunInfo(dict(CONFIG), "mpi", "sgd"))
    ok = (ckpt is not None) == (comm.rank == 0)
    if comm.rank == 0:
        with tempfile.TemporaryDirectory() as tmp:    # only rank 0 ever touches the file
            fileformat.write(os.path.join(tmp, "c.h5"), ckpt)
            ckpt = fileformat.read(os.path.join(tmp, "c.h5"))
        ok = ok and ckpt.per_rank == bool(local_sgd) and ckpt.dropout_rng.shape == (comm.size, 1, 6)
    for p in model.parameters():                 # scramble everything, then restore
        p.data[...] = 7
    opt.step_count, ddp.steps = 99, 99
    dropouts[0].set_rng_state(np.arange(6, dtype=np.uint64))
    if hook != "allreduce":                      # a fresh hook state: restore must fill it
        ddp.register_comm_hook(*build(hook, comm, topk_ratio=0.2, powersgd_start_iter=2, powersgd_rank=2))
    where = TrainState()
    got = state.restore(comm, ckpt, ModelState(model.named_parameters(), dropouts, ddp), opt, where)
    after = _state(model, opt, dropouts, ddp)
    ok = ok and np.array_equal(before[0], after[0]) and after[1:] == (3, 3)
    ok = ok and (where.epochs_done, where.batches_done, where.step) == (1, 2, 3)
    ok = ok and np.array_equal(where.totals, np.arange(4.0)) and got["fresh"] == []
    assert_all_ranks(ok, f"rank {comm.rank}: state differs after restore")


@pytest.mark.mpi(min_size=2)
def test_restore_from_another_world_size_takes_rank_0s_row(comm_world, assert_all_ranks):
    from npddp.comm import create
    from npddp.parallel.ddp import DistributedDataParallel

    comm = create("mpi", comm_world)
    model = mlp(4, [5], 3, seed=0)
    ddp = DistributedDataParallel(model, comm, sync="flat")
    opt = SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    rows = comm.size + 1                        # saved by one rank more than there are now

    def stacked(a):                             # row r holds a + r
        return np.stack([a + a.dtype.type(r) for r in range(rows)])

    saved = None
    if comm.rank == 0:
        saved = _saved(model, opt, world=rows)
        saved.per_rank = True
        saved.params = {k: stacked(v) for k, v in saved.params.items()}
        saved.optimizer = {k: stacked(v) if isinstance(v, np.ndarray) and v.ndim else v
                           for k, v in saved.optimizer.items()}
    expected = [p.data.copy() for p in model.parameters()]
    for p in model.parameters():
        p.data[...] = -1
    where = TrainState()
    got = state.restore(comm, saved, ModelState(model.named_parameters(), [], ddp), opt, where)
    ok = all(np.array_equal(p.data, e) for p, e in zip(model.parameters(), expected))
    ok = ok and got["world_size"] == rows and where.step == 1
    assert_all_ranks(ok, f"rank {comm.rank}: not rank 0's row")
