"""Checkpoint files: round trip, clear errors for missing/foreign/damaged files, survival of a
SIGKILL mid-write, compatibility messages, and (under MPI) gather and restore of every rank's state.

Serial tests run with plain pytest; the MPI tests run under ``mpirun -n K python -m pytest --with-mpi``.
"""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from npddp import checkpoint
from npddp.checkpoint import Checkpoint, CheckpointError
from npddp.nn import mlp
from npddp.optim import SGD, AdamW
from npddp.runinfo import SCHEMA_VERSION

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
        residuals=[rng.standard_normal((world, 9)), rng.standard_normal((world, 3))],
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
    assert len(a.residuals) == len(b.residuals)
    assert all(np.array_equal(x, y) for x, y in zip(a.residuals, b.residuals))
    assert np.array_equal(a.totals, b.totals)


@pytest.mark.parametrize("world, per_rank", [(1, False), (2, True), (3, False), (4, True)])
def test_write_then_read_gives_back_every_bit(tmp_path, world, per_rank):
    ckpt = record(world, per_rank, seed=world)
    checkpoint.write(tmp_path / "c.h5", ckpt)
    assert_same(ckpt, checkpoint.read(tmp_path / "c.h5"))
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert f.attrs["format"] == "npddp-checkpoint" and f.attrs["schema_version"] == SCHEMA_VERSION
        assert f.attrs["host"] == "h" and f.attrs["config.batch_size"] == 8
        assert f["rng/dropout"].shape == (world, 2, 6)
    assert os.listdir(tmp_path) == ["c.h5"]   # no temporary file left behind


def test_a_record_without_dropout_or_residuals_round_trips(tmp_path):
    ckpt = record(1, False)
    ckpt.dropout_rng, ckpt.residuals = None, []
    checkpoint.write(tmp_path / "c.h5", ckpt)
    back = checkpoint.read(tmp_path / "c.h5")
    assert back.dropout_rng is None and back.residuals == []


def _damage(path, how):
    if how == "missing":
        return
    if how == "junk":
        path.write_bytes(b"not an hdf5 file at all")
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "truncated":
        checkpoint.write(path, record())
        path.write_bytes(path.read_bytes()[:1000])
    elif how == "foreign":
        with h5py.File(path, "w") as f:
            f.create_dataset("weights", data=np.zeros(3))
    elif how == "metrics":
        with h5py.File(path, "w") as f:
            f.attrs["format"] = "npddp-metrics"
    elif how == "schema":
        checkpoint.write(path, record())
        with h5py.File(path, "r+") as f:
            f.attrs["schema_version"] = SCHEMA_VERSION + 1
    elif how == "incomplete":
        checkpoint.write(path, record())
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
    ("incomplete", "is damaged or incomplete"),
])
def test_unreadable_checkpoints_give_one_clear_error_naming_the_file(tmp_path, how, text):
    path = tmp_path / "c.h5"
    _damage(path, how)
    with pytest.raises(CheckpointError) as info:
        checkpoint.read(path)
    assert text in str(info.value) and repr(str(path)) in str(info.value)


CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from npddp.checkpoint import Checkpoint, write

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
    back = checkpoint.read(target)
    assert back.step == 1 and all(np.array_equal(v, np.ones(1000)) for v in back.params.values())


# ----------------------------------------------------------------------------- compatibility

def _model_and_optimizer(hidden=5, kind="sgd"):
    model = mlp(4, [hidden], 3, seed=0)
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9) if kind == "sgd" else AdamW(model.parameters(), lr=0.1)
    return model, opt


def _saved(model, opt, world=2, **config):
    named = model.named_parameters()
    return Checkpoint(epochs_done=0, batches_done=1, step=1, world_size=world, backend="mpi",
                      config={**CONFIG, **config}, params={n: p.data.copy() for n, p in named},
                      optimizer=opt.state_dict(), optimizer_name="sgd" if isinstance(opt, SGD) else "adamw")


def _why(ckpt, model, opt, world=2, allow=False, ddp=None, **config):
    return checkpoint.incompatibility(
        ckpt, "c.h5", config={**CONFIG, **config}, fixed=FIXED, flags=FLAGS, world_size=world,
        allow_world_size_change=allow, named_params=model.named_parameters(), optimizer=opt,
        ddp=ddp or SimpleNamespace(compression="none", buckets=[]),
        optimizer_name="sgd" if isinstance(opt, SGD) else "adamw")


def test_a_matching_checkpoint_is_compatible():
    model, opt = _model_and_optimizer()
    assert _why(_saved(model, opt), model, opt) is None


def test_incompatibilities_name_both_values():
    model, opt = _model_and_optimizer()
    ckpt = _saved(model, opt)
    why = _why(ckpt, model, opt, world=3)
    assert "written by 2 ranks, this run has 3" in why and "--allow-world-size-change" in why
    assert _why(ckpt, model, opt, world=3, allow=True) is None
    why = _why(ckpt, model, opt, hidden=[7], batch_size=16)
    assert "written with --hidden 5 --batch-size 8, this run has --hidden 7 --batch-size 16" in why
    other, other_opt = _model_and_optimizer(hidden=6)
    assert "parameter '0.weight' is (5, 4) float32 there, (6, 4) float32 here" in _why(ckpt, other, other_opt)
    adam_model, adam = _model_and_optimizer(kind="adamw")
    assert "holds sgd state, this run uses adamw" in _why(ckpt, adam_model, adam)
    plain = SGD(model.parameters(), lr=0.1)      # no momentum: no momentum buffers
    assert "optimizer state" in _why(ckpt, model, plain) and "momentum_buffer.0" in _why(ckpt, model, plain)
    ckpt.residuals = [np.zeros((2, 9))]
    ddp = SimpleNamespace(compression="topk", buckets=[SimpleNamespace(buffer=np.zeros(4)),
                                                       SimpleNamespace(buffer=np.zeros(5))])
    assert "buckets of [9] elements, this run's buckets have [4, 5]" in _why(ckpt, model, opt, ddp=ddp)


# ----------------------------------------------------------------------------- collect and restore under MPI

def _state(model, opt, dropouts, ddp):
    """Copies of everything restore must bring back, as one float64 vector plus the optimizer step."""
    parts = [p.data.ravel() for p in model.parameters()]
    parts += [v.ravel() for k, v in sorted(opt.state_dict().items()) if isinstance(v, np.ndarray) and v.ndim]
    parts += [d.get_rng_state().view(np.int64).astype(np.float64) for d in dropouts]
    parts += [b.residual for b in ddp.buckets if b.residual is not None]
    return np.concatenate(parts).astype(np.float64), int(opt.step_count), int(ddp.steps)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("local_sgd, compression", [(2, "none"), (0, "topk")])
def test_collect_then_restore_brings_back_every_ranks_state(comm_world, assert_all_ranks, local_sgd, compression):
    from npddp.comm import create
    from npddp.ddp import DistributedDataParallel
    from npddp.nn import CrossEntropyLoss, Dropout, Sequential

    comm = create("mpi", comm_world)
    model = mlp(6, [8], 3, seed=1)
    dropouts = [Dropout(0.3, seed=100 + comm.rank)]
    model = Sequential(*model.layers[:2], dropouts[0], *model.layers[2:])
    ddp = DistributedDataParallel(model, comm, sync="bucketed", bucket_cap_mb=1e-4,
                                  compression=compression, topk_ratio=0.2, local_sgd=local_sgd)
    opt = SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    rng, loss = np.random.default_rng(comm.rank), CrossEntropyLoss()
    for _ in range(3):                            # local SGD: replicas differ after 3 steps
        ddp.zero_grad()
        loss.forward(ddp(rng.standard_normal((4, 6)).astype(np.float32)), rng.integers(0, 3, 4))
        ddp.backward(loss.backward())
        ddp.step(opt)
    before = _state(model, opt, dropouts, ddp)
    ckpt = checkpoint.collect(comm, named_params=model.named_parameters(), optimizer=opt, ddp=ddp,
                              dropouts=dropouts, position=(1, 2, 3), totals=np.arange(4.0),
                              totals_columns=("a", "b", "c", "d"), config=dict(CONFIG), backend="mpi",
                              optimizer_name="sgd", attrs={})
    ok = (ckpt is not None) == (comm.rank == 0)
    if comm.rank == 0:
        with tempfile.TemporaryDirectory() as tmp:    # only rank 0 ever touches the file
            checkpoint.write(os.path.join(tmp, "c.h5"), ckpt)
            ckpt = checkpoint.read(os.path.join(tmp, "c.h5"))
        ok = ok and ckpt.per_rank == bool(local_sgd) and ckpt.dropout_rng.shape == (comm.size, 1, 6)
    for p in model.parameters():                 # scramble everything, then restore
        p.data[...] = 7
    opt.step_count, ddp.steps = 99, 99
    dropouts[0].set_rng_state(np.arange(6, dtype=np.uint64))
    for b in ddp.buckets:
        if b.residual is not None:
            b.residual[...] = 5
    state = checkpoint.restore(comm, ckpt, named_params=model.named_parameters(), optimizer=opt,
                               ddp=ddp, dropouts=dropouts)
    after = _state(model, opt, dropouts, ddp)
    ok = ok and np.array_equal(before[0], after[0]) and after[1:] == (3, 3)
    ok = ok and (state["epochs_done"], state["batches_done"], state["step"]) == (1, 2, 3)
    ok = ok and np.array_equal(state["totals"], np.arange(4.0)) and state["fresh"] == []
    assert_all_ranks(ok, f"rank {comm.rank}: state differs after restore")


@pytest.mark.mpi(min_size=2)
def test_restore_from_another_world_size_takes_rank_0s_row(comm_world, assert_all_ranks):
    from npddp.comm import create
    from npddp.ddp import DistributedDataParallel

    comm = create("mpi", comm_world)
    model = mlp(4, [5], 3, seed=0)
    ddp = DistributedDataParallel(model, comm, sync="flat", local_sgd=2)
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
    state = checkpoint.restore(comm, saved, named_params=model.named_parameters(), optimizer=opt, ddp=ddp,
                               dropouts=[])
    ok = all(np.array_equal(p.data, e) for p, e in zip(model.parameters(), expected))
    ok = ok and state["world_size"] == rows and state["step"] == 1
    assert_all_ranks(ok, f"rank {comm.rank}: not rank 0's row")
