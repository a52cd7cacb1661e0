"""``save_checkpoint`` / ``load_checkpoint`` from a user's own script: the CLI's own file, which
``npddp.evaluate``, ``npddp.generate`` and ``npddp.train --resume`` take; round trips; bad input.

Serial tests run on one rank (``COMM_SELF``); the ``mpi`` ones under ``mpirun -n 2`` and up.
"""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

from npddp import load_checkpoint, save_checkpoint
from npddp.comm import create
from npddp.nn import CrossEntropyLoss, gpt_preset, mlp
from npddp.optim import SGD, AdamW
from npddp.parallel.ddp import DistributedDataParallel
from npddp.parallel.zero import ShardedOptimizer, ZeroDataParallel
from npddp.checkpoint import fileformat

from tests.helpers.ranks import check_all_ranks, check_ranks_agree, world_raw

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
MLP_CONFIG = {"model": "mlp", "hidden": [16], "seed": 0, "batch_size": 32}


def run_cli(*args):
    """Run one of npddp's entry points on one process; (exit status, stdout + stderr)."""
    done = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=ENV, timeout=300)
    return done.returncode, done.stdout + done.stderr


def train_mlp(comm, steps=3, kind="ddp", optimizer="sgd", seed=0):
    """(wrapper, optimizer) of an MLP 64-16-10 after ``steps`` steps on a fixed batch."""
    model = mlp(64, [16], 10, seed=seed)
    if kind == "ddp":
        ddp = DistributedDataParallel(model, comm)
        opt = SGD(ddp.parameters(), lr=0.05, momentum=0.9) if optimizer == "sgd" else AdamW(ddp.parameters())
    else:
        ddp = ZeroDataParallel(model, comm, stage=kind)
        opt = ShardedOptimizer(ddp, SGD if optimizer == "sgd" else AdamW, lr=0.05)
    rng = np.random.default_rng(comm.rank)
    x, y = rng.standard_normal((8, 64)).astype(np.float32), rng.integers(0, 10, 8)
    loss_fn = CrossEntropyLoss()
    for _ in range(steps):
        ddp.zero_grad()
        loss_fn.forward(ddp(x), y)
        ddp.backward(loss_fn.backward())
        ddp.step(opt)
    return ddp, opt


def values(ddp):
    return np.concatenate([v.ravel() for v in ddp.state_dict().values()])


def test_a_scripts_checkpoint_evaluates_and_resumes_with_the_cli(tmp_path):
    comm = create("mpi", MPI.COMM_SELF)
    ddp, opt = train_mlp(comm)
    path = tmp_path / "script.h5"
    save_checkpoint(path, ddp, opt, config=MLP_CONFIG, input_shape=(64,), num_classes=10, epoch=1)
    code, out = run_cli("npddp.evaluate", str(path))
    assert code == 0 and "(step 3, mlp 64-16-10) on synthetic val" in out, out
    code, out = run_cli("npddp.train", "--checkpoint", str(path), "--resume", "--epochs", "2", "--quiet")
    assert code == 0, out
    assert fileformat.read(path).epochs_done == 2 and fileformat.read(path).step > 3


def test_a_scripts_gpt_checkpoint_generates(tmp_path):
    comm = create("mpi", MPI.COMM_SELF)
    vocab, context = 32, 8
    ddp = DistributedDataParallel(gpt_preset("tiny", vocab, context, seed=3), comm)
    opt = AdamW(ddp.parameters(), lr=1e-3)
    tokens = np.random.default_rng(0).integers(0, vocab, (4, context + 1))
    loss_fn = CrossEntropyLoss()
    loss_fn.forward(ddp(tokens[:, :-1]), tokens[:, 1:])
    ddp.backward(loss_fn.backward())
    ddp.step(opt)
    path = tmp_path / "gpt.h5"
    save_checkpoint(path, ddp, opt, config={"model": "gpt", "model_size": "tiny", "seed": 3,
                                            "context_length": context, "vocab_size": vocab},
                    input_shape=(context,), num_classes=vocab)
    code, out = run_cli("npddp.generate", str(path), "--prompt", "1 2 3", "--tokens", "5", "--top-k", "1")
    assert code == 0, out
    ids = [int(t) for t in out.split()]
    assert ids[:3] == [1, 2, 3] and len(ids) == 8 and all(0 <= t < vocab for t in ids), out
    logits = ddp.module.eval()(np.array([[1, 2, 3]]))[0, -1]
    assert ids[3] == int(np.argmax(logits))                       # the script's own weights were loaded


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("kind", ["ddp", 2, 3])
def test_load_restores_the_model_and_optimizer(tmp_path, kind, optimizer):
    comm = create("mpi", MPI.COMM_SELF)
    ddp, opt = train_mlp(comm, kind=kind, optimizer=optimizer)
    path = tmp_path / "ckpt.h5"
    save_checkpoint(path, ddp, opt, config=MLP_CONFIG, input_shape=(64,), num_classes=10, epoch=2)
    fresh, fresh_opt = train_mlp(comm, steps=0, kind=kind, optimizer=optimizer, seed=7)
    got = load_checkpoint(path, fresh, fresh_opt)
    assert (got["epoch"], got["batches_done"], got["step"]) == (2, 0, 3) and got["config"]["hidden"] == [16]
    assert np.array_equal(values(fresh), values(ddp))
    for wrapper, o in ((ddp, opt), (fresh, fresh_opt)):       # both continue identically
        rng = np.random.default_rng(0)
        x, y = rng.standard_normal((8, 64)).astype(np.float32), rng.integers(0, 10, 8)
        loss_fn = CrossEntropyLoss()
        wrapper.zero_grad()
        loss_fn.forward(wrapper(x), y)
        wrapper.backward(loss_fn.backward())
        wrapper.step(o)
    assert np.array_equal(values(fresh), values(ddp))
    params_only, _ = train_mlp(comm, steps=0, kind=kind, optimizer=optimizer, seed=9)
    assert load_checkpoint(path, params_only)["step"] == 3
    assert np.array_equal(values(params_only), np.concatenate([v.ravel() for v in
                                                               fileformat.read(path).params.values()]))


@pytest.mark.parametrize("change, pattern", [
    (dict(config={"model": "mlp", "hidden": [17]}), r"parameter #0 is 0.weight \(17, 64\).*0.weight \(16, 64\)"),
    (dict(config={"model": "mlp", "hidden": [16], "dtype": "float64"}), "float64"),
    (dict(config={"model": "mlp", "hiden": [16]}), r"unknown settings \['hiden'\]"),
    (dict(config={"model": "mlp", "hidden": [16], "lr": 0.5}), r"lr=0.5 \(the objects say 0.05\)"),
    (dict(num_classes=0), "num_classes must be an int >= 1"),
    (dict(epoch=4), r"epoch must be an int in \[0, 3\]"),
])
def test_bad_arguments_raise_before_anything_is_written(tmp_path, change, pattern):
    comm = create("mpi", MPI.COMM_SELF)
    ddp, opt = train_mlp(comm)
    path = tmp_path / "never.h5"
    kwargs = {"config": MLP_CONFIG, "input_shape": (64,), "num_classes": 10, **change}
    with pytest.raises(ValueError, match=pattern):
        save_checkpoint(path, ddp, opt, **kwargs)
    assert not path.exists()


def test_load_names_what_does_not_fit(tmp_path):
    comm = create("mpi", MPI.COMM_SELF)
    ddp, opt = train_mlp(comm)
    path = tmp_path / "ckpt.h5"
    save_checkpoint(path, ddp, opt, config=MLP_CONFIG, input_shape=(64,), num_classes=10)
    other = DistributedDataParallel(mlp(64, [8], 10, seed=0), comm)
    with pytest.raises(fileformat.CheckpointError, match=r"parameter '0.weight' is \(16, 64\).*\(8, 64\)"):
        load_checkpoint(path, other, SGD(other.parameters(), lr=0.05, momentum=0.9))
    with pytest.raises(fileformat.CheckpointError, match="holds SGD state|holds sgd state"):
        load_checkpoint(path, ddp, AdamW(ddp.parameters()))
    with pytest.raises(fileformat.CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.h5", ddp, opt)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", ["ddp", 3])
def test_save_and_load_on_every_rank(kind, agreed_tmpdir):
    comm = create("ring", world_raw())
    ddp, opt = train_mlp(comm, kind=kind)
    path = agreed_tmpdir / f"ranks-{kind}.h5"
    save_checkpoint(path, ddp, opt, config=MLP_CONFIG, input_shape=(64,), num_classes=10, epoch=1)
    fresh, fresh_opt = train_mlp(comm, steps=0, kind=kind, seed=5)
    got = load_checkpoint(path, fresh, fresh_opt)
    check_all_ranks(got["step"] == 3 and bool(np.array_equal(values(fresh), values(ddp))),
                    "the loaded parameters differ from the saved ones")
    check_ranks_agree(values(fresh))
    if comm.rank == 0:
        world = fileformat.read(path).world_size
        shutil.rmtree(agreed_tmpdir)
        assert world == comm.size
