"""npddp.checkpoint.save and load: Stateful objects to one whole file or to shards and an index, and back.

Serial: TrainState's state dict round trip. Under MPI (``mpirun -n K python -m pytest --with-mpi``):
a DDP run and a ZeRO-2 run, each saved, scrambled and loaded, come back bit for bit on every rank.
"""

import os

import numpy as np
import pytest

from npddp import checkpoint
from npddp.checkpoint import fileformat
from npddp.nn import CrossEntropyLoss, mlp
from npddp.optim import SGD, AdamW


@pytest.mark.parametrize("totals", [np.zeros(0), np.arange(5.0)])
def test_train_state_round_trips_its_state_dict(totals):
    a = checkpoint.TrainState(2, 3, 40, totals, tuple("abcde"[:totals.size]))
    b = checkpoint.TrainState()
    b.load_state_dict(a.state_dict())
    assert (b.epochs_done, b.batches_done, b.step, b.columns) == (2, 3, 40, a.columns)
    assert np.array_equal(b.totals, totals) and b.totals is not a.totals


def _trained(comm, zero: int, kind: str):
    """(engine, optimizer, model) after three steps of DDP (zero 0) or a ZeRO-2 engine."""
    from npddp.parallel.ddp import DistributedDataParallel
    from npddp.parallel.zero import ShardedOptimizer, ZeroDataParallel

    model = mlp(6, [8], 3, seed=1, dtype=np.float64)
    make = (lambda params, **kw: SGD(params, momentum=0.9, **kw)) if kind == "sgd" else AdamW
    if zero:
        engine = ZeroDataParallel(model, comm, stage=zero)
        opt = checkpoint.CheckpointedOptimizer(ShardedOptimizer(engine, make, lr=0.1), comm)
    else:
        engine = DistributedDataParallel(model, comm)
        opt = make(engine.parameters(), lr=0.1)
    rng, loss = np.random.default_rng(comm.rank), CrossEntropyLoss()
    for _ in range(3):
        engine.zero_grad()
        loss.forward(engine(rng.standard_normal((4, 6))), rng.integers(0, 3, 4))
        engine.backward(loss.backward())
        engine.step(opt)
    return engine, opt, model


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("zero, kind", [(0, "sgd"), (0, "adamw"), (2, "sgd"), (2, "adamw")])
def test_save_then_load_brings_back_every_rank_whole_or_sharded(comm_world, assert_all_ranks, agreed_tmpdir,
                                                                zero, kind):
    from npddp.comm import create

    comm = create("mpi", comm_world)
    engine, opt, model = _trained(comm, zero, kind)
    path = os.path.join(agreed_tmpdir, "c.h5")
    objects = {"model": checkpoint.ModelState(model.named_parameters(), [], engine), "optim": opt,
               "train": checkpoint.TrainState(1, 2, 3, np.arange(3.0), ("a", "b", "c"))}
    before = [p.data.copy() for p in model.parameters()]
    checkpoint.save(comm, path, objects, info=checkpoint.RunInfo({"seed": 0}, comm.name, kind))
    shards = sorted(e for e in os.listdir(agreed_tmpdir) if e.startswith("c.h5.step-"))
    ok = len(shards) == (1 if zero else 0)                  # ZeRO: shards and an index; DDP: one whole file
    saved_state = opt.state_dict() if not zero else None     # DDP: every rank's own optimizer state
    for p in model.parameters():
        p.data[...] = -3.0
    where = checkpoint.TrainState()
    objects["train"] = where
    got = checkpoint.load(comm, path, objects, optimizer=kind)
    ok = ok and all(np.array_equal(p.data, b) for p, b in zip(model.parameters(), before))
    ok = ok and (where.epochs_done, where.batches_done, where.step) == (1, 2, 3) and engine.steps == 3
    ok = ok and np.array_equal(where.totals, np.arange(3.0)) and got["config"] == {"seed": 0}
    ok = ok and got["world_size"] == comm.size and got["fresh"] == []
    if saved_state is not None:
        after = opt.state_dict()
        ok = ok and all(np.array_equal(after[k], v) for k, v in saved_state.items())
    if comm.rank == 0:
        ok = ok and fileformat.read(path).step == 3
    assert_all_ranks(ok, f"rank {comm.rank}: state differs after save and load (zero {zero}, {kind})")


@pytest.mark.mpi(min_size=2)
def test_load_refuses_another_optimizer_on_every_rank(comm_world, assert_all_ranks, agreed_tmpdir):
    from npddp.comm import create

    comm = create("mpi", comm_world)
    engine, opt, model = _trained(comm, 0, "sgd")
    path = os.path.join(agreed_tmpdir, "c.h5")
    objects = {"model": checkpoint.ModelState(model.named_parameters(), [], engine), "optim": opt,
               "train": checkpoint.TrainState(step=3)}                  # the optimizer's three steps
    checkpoint.save(comm, path, objects, info=checkpoint.RunInfo({}, comm.name, "sgd"))
    with pytest.raises(checkpoint.CheckpointError, match="holds sgd state, this run uses adamw"):
        checkpoint.load(comm, path, objects, optimizer="adamw")
    assert_all_ranks(True)
