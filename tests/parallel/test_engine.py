"""Every engine keeps the one contract (:class:`npddp.parallel.engine.Engine`) and trains as one process would.

Property-style over the engines (DDP with each sync, ZeRO 1-3, a split model): each is driven by
the same loop -- ``zero_grad``, ``train_batch``, ``step`` -- on this replica's rows of the same
global batches, and must end at the parameters, losses and validation totals of one process
training the whole model on the whole batch (float64). The serial tests cover one rank; the MPI
ones run under ``mpirun -n K`` (K = 2, 3, 4) or ``python -m npddp.run --nproc K``, the split model
as a pipeline over the ranks.
"""

import numpy as np
import pytest
from mpi4py import MPI

from npddp.comm import create
from npddp.nn import CrossEntropyLoss, mlp
from npddp.optim import SGD
from npddp.parallel.ddp import SYNCS, DistributedDataParallel
from npddp.parallel.engine import Engine
from npddp.parallel.hooks import allreduce_hook
from npddp.parallel.model.engine import MeshEngine
from npddp.parallel.zero import ShardedOptimizer, ZeroDataParallel, ZeroRedundancyOptimizer
from npddp.util.tracing import NullTracer

from tests.helpers.ranks import world_raw

GLOBAL_BATCH, STEPS, FEATURES, CLASSES = 12, 3, 5, 3
SETTINGS = {"lr": 0.1, "momentum": 0.9}
TOLERANCE = 1e-10
ENGINES = tuple(f"ddp-{s}" for s in SYNCS) + ("zero1", "zero2", "zero3", "split")


def make_model():
    return mlp(FEATURES, [7, 6], CLASSES, dtype="float64", seed=3)


def make_data():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((STEPS, GLOBAL_BATCH, FEATURES)),
            rng.integers(0, CLASSES, size=(STEPS, GLOBAL_BATCH)))


class StepWatch(NullTracer):
    """An untraced run's tracer that notes every step count it is told of (what moves a real trace's window)."""

    def __init__(self):
        self.told = []

    def at_step(self, done: int) -> None:
        self.told.append(done)


def build(kind: str, comm, tracer):
    """``(engine, optimizer)`` of ``kind`` over ``comm`` (the split model: a pipeline of up to 3 stages)."""
    model = make_model()
    if kind == "split":
        pp = comm.size if comm.size <= 3 else 2
        engine = MeshEngine(comm, model, [], tp=1, pp=pp, backend="ring", timeout=120.0, micro_batches=2,
                            schedule="1f1b", sync="overlap", bucket_cap_mb=25.0,
                            comm_hook=lambda group: (group, allreduce_hook), eval_batch=5, tracer=tracer)
        return engine, SGD(engine.parameters(), **SETTINGS)
    if kind in ("zero2", "zero3"):
        engine = ZeroDataParallel(model, comm, stage=int(kind[-1]), bucket_cap_mb=2e-3, tracer=tracer)
        return engine, ShardedOptimizer(engine, SGD, **SETTINGS)
    engine = DistributedDataParallel(model, comm, sync="overlap" if kind == "zero1" else kind[4:], bucket_cap_mb=2e-3,
                                     tracer=tracer)
    if kind == "zero1":
        return engine, ZeroRedundancyOptimizer(engine.parameters(), SGD, comm, **SETTINGS)
    return engine, SGD(engine.parameters(), **SETTINGS)


def reference(rows):
    """One process on the whole batches: the parameters by name after the last step, and the mean loss over
    ``rows`` (a replica's) of each batch before its step."""
    model, loss_fn = make_model(), CrossEntropyLoss()
    opt = SGD(model.parameters(), **SETTINGS)
    X, y = make_data()
    losses = []
    for s in range(STEPS):
        model.zero_grad()
        losses.append(CrossEntropyLoss().score(model.forward(X[s][rows]), y[s][rows])[0])
        loss_fn.forward(model.forward(X[s]), y[s])
        model.backward(loss_fn.backward())
        opt.step()
    return {n: p.data.copy() for n, p in model.named_parameters()}, losses


def drive(engine, optimizer):
    """The training loop every engine runs: this replica's rows (r::replicas) of each global batch; the losses."""
    X, y = make_data()
    loss_fn, losses = CrossEntropyLoss(), []
    rows = np.arange(engine.replicas.rank, GLOBAL_BATCH, engine.replicas.size)
    for s in range(STEPS):
        engine.zero_grad()
        losses.append(engine.train_batch(X[s][rows], y[s][rows], loss_fn))
        engine.step(optimizer)
    return losses


def check_contract(kind: str, comm) -> None:
    """Train ``kind`` over ``comm`` and check it against one process (call on every rank of ``comm``)."""
    watch = StepWatch()
    engine, optimizer = build(kind, comm, watch)
    assert isinstance(engine, Engine) and not type(engine).__abstractmethods__
    X, y = make_data()
    before = engine.evaluate(X[0], y[0], CrossEntropyLoss())        # the initial model: one process's totals
    ref_model, loss_fn = make_model(), CrossEntropyLoss()
    logits = ref_model.forward(X[0])
    want = (loss_fn.forward(logits, y[0]) * GLOBAL_BATCH, loss_fn.correct(logits, y[0]), GLOBAL_BATCH)
    np.testing.assert_allclose(before, want, rtol=TOLERANCE)

    losses = drive(engine, optimizer)
    rows = np.arange(engine.replicas.rank, GLOBAL_BATCH, engine.replicas.size)
    want_params, want_losses = reference(rows)
    assert engine.steps == STEPS and watch.told[-1] == STEPS and set(range(STEPS + 1)) <= set(watch.told)
    with engine.full_parameters():
        got = {n: p.data.copy() for n, p in engine.named_parameters()}
    assert got and set(got) <= set(want_params)
    if not engine.splits_model:
        assert set(got) == set(want_params)
    for name, values in got.items():
        np.testing.assert_allclose(values, want_params[name], rtol=0, atol=TOLERANCE, err_msg=f"{kind}: {name}")
    if engine.reports:                          # the replica's mean loss, where this rank knows it
        np.testing.assert_allclose(losses, want_losses, rtol=TOLERANCE, err_msg=kind)

    state = engine.state_dict()
    assert set(state) == set(got)
    with engine.full_parameters():
        for _, p in engine.named_parameters():
            p.data[...] = 0
    assert engine.load_state_dict(state) == ([], [])
    with engine.full_parameters():
        for name, p in engine.named_parameters():
            np.testing.assert_array_equal(p.data, got[name])


@pytest.mark.parametrize("kind", ENGINES)
def test_every_engine_keeps_the_contract_on_one_rank(kind):
    check_contract(kind, create("ring", MPI.COMM_SELF))


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ENGINES)
def test_every_engine_keeps_the_contract_over_the_world(kind, assert_all_ranks):
    comm = create("ring", world_raw())
    try:
        check_contract(kind, comm)
        ok, why = True, ""
    except AssertionError as exc:
        ok, why = False, str(exc)
    assert_all_ranks(ok, why)
