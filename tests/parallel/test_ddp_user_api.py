"""What a user's own script meets of DDP and ZeRO: PyTorch's ``state_dict`` / ``load_state_dict`` on the
wrapper, the check that catches ``ddp.module.backward`` (gradients never averaged), short error messages.

Serial tests run on one rank (``COMM_SELF``); the ``mpi`` ones under ``mpirun -n 2`` and up.
"""

import subprocess
import sys
import time

import numpy as np
import pytest
from mpi4py import MPI

from npddp.comm import create
from npddp.nn import CrossEntropyLoss, mlp
from npddp.optim import SGD
from npddp.parallel.averaging import PeriodicModelAverager
from npddp.parallel.ddp import SYNCS, DistributedDataParallel
from npddp.parallel.hooks import TopKState
from npddp.parallel.powersgd import PowerSGDState
from npddp.parallel.wrapper import UnsyncedGradientsError
from npddp.parallel.zero import ShardedOptimizer, ZeroDataParallel

from tests.helpers.ranks import check_all_ranks, check_ranks_agree, world_raw

IN, OUT = 6, 3
WRAPPERS = [("ddp", s) for s in SYNCS] + [("zero", 2), ("zero", 3)]


def build(comm, kind, how, seed=1):
    """(model, wrapper, optimizer) for DDP with sync ``how`` or ZeRO stage ``how``."""
    model = mlp(IN, [5], OUT, dtype=np.float64, seed=seed)
    if kind == "ddp":
        ddp = DistributedDataParallel(model, comm, sync=how)
        return model, ddp, SGD(ddp.parameters(), lr=0.1)
    engine = ZeroDataParallel(model, comm, stage=how)
    return model, engine, ShardedOptimizer(engine, SGD, lr=0.1)


def batch(rank):
    rng = np.random.default_rng(rank)
    return rng.standard_normal((4, IN)), rng.integers(0, OUT, 4)


def loss_grad(ddp, rank):
    """Forward one batch through the wrapper; the loss gradient to send backward."""
    x, y = batch(rank)
    loss_fn = CrossEntropyLoss()
    loss_fn.forward(ddp(x), y)
    return loss_fn.backward()


# --- state_dict / load_state_dict -----------------------------------------------------------------

@pytest.mark.parametrize("kind, how", WRAPPERS)
def test_state_dict_is_the_modules_and_loads_back(kind, how):
    comm = create("mpi", MPI.COMM_SELF)
    model, ddp, opt = build(comm, kind, how)
    ddp.zero_grad()
    ddp.backward(loss_grad(ddp, 0))
    ddp.step(opt)
    with ddp.full_parameters():
        want = {name: p.data.copy() for name, p in model.named_parameters()}
    saved = ddp.state_dict()
    assert list(saved) == list(want)
    assert all(np.array_equal(saved[k], want[k]) for k in want)
    assert any(np.any(v) for v in saved.values())        # real values, not ZeRO-3's absent zeros
    ddp.load_state_dict({k: np.zeros_like(v) for k, v in saved.items()})
    assert not any(np.any(v) for v in ddp.state_dict().values())
    assert ddp.load_state_dict(saved) == ([], [])
    assert all(np.array_equal(ddp.state_dict()[k], want[k]) for k in want)
    with pytest.raises(ValueError, match="missing"):
        ddp.load_state_dict({})


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind, how", [("ddp", "overlap"), ("zero", 3)])
def test_state_dict_round_trip_on_every_rank(kind, how):
    comm = create("ring", world_raw())
    _, ddp, opt = build(comm, kind, how)
    ddp.zero_grad()
    ddp.backward(loss_grad(ddp, comm.rank))
    ddp.step(opt)
    saved = ddp.state_dict()
    flat = np.concatenate([v.ravel() for v in saved.values()])
    check_ranks_agree(flat)
    ddp.load_state_dict({k: np.full_like(v, 2.0) for k, v in saved.items()})
    after = np.concatenate([v.ravel() for v in ddp.state_dict().values()])
    check_all_ranks(bool(np.all(after == 2.0)), "load_state_dict did not take")
    ddp.load_state_dict(saved)
    check_ranks_agree(np.concatenate([v.ravel() for v in ddp.state_dict().values()]))


# --- the backward check ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind, how", WRAPPERS)
def test_model_backward_is_caught_at_step(kind, how):
    comm = create("mpi", MPI.COMM_SELF)
    model, ddp, opt = build(comm, kind, how)
    before = ddp.state_dict()
    ddp.zero_grad()
    ddp.module.backward(loss_grad(ddp, 0))
    with pytest.raises(UnsyncedGradientsError, match=r"call ddp\.backward\(dloss\) instead"):
        ddp.step(opt)
    after = ddp.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)   # raised before the optimizer moved


@pytest.mark.parametrize("kind, how", WRAPPERS)
def test_model_backward_is_caught_at_the_next_forward(kind, how):
    """A script that steps its optimizer itself (PyTorch's habit) hears of it at the next forward."""
    comm = create("mpi", MPI.COMM_SELF)
    _, ddp, opt = build(comm, kind, how)
    ddp.module.backward(loss_grad(ddp, 0))
    with pytest.raises(UnsyncedGradientsError, match="not averaged"):
        ddp(batch(0)[0])
    ddp.module.backward(loss_grad(ddp, 0))
    with pytest.raises(UnsyncedGradientsError):
        ddp.reduce_metrics(np.zeros(2))


@pytest.mark.parametrize("kind, how", WRAPPERS)
def test_no_sync_and_the_wrappers_backward_pass(kind, how):
    comm = create("mpi", MPI.COMM_SELF)
    _, ddp, opt = build(comm, kind, how)
    for _ in range(2):
        ddp.zero_grad()
        with ddp.no_sync():                              # accumulating without averaging is legal here
            ddp.module.backward(loss_grad(ddp, 0))
            ddp.backward(loss_grad(ddp, 1))
        ddp.backward(loss_grad(ddp, 2))
        ddp.step(opt)
    ddp.module.backward(loss_grad(ddp, 0))
    ddp.zero_grad()                                      # the stray gradients are gone
    ddp.step(opt)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind, how", [("ddp", s) for s in SYNCS] + [("zero", 3)])
def test_every_rank_raises_when_every_rank_bypasses(kind, how):
    comm = create("ring", world_raw())
    _, ddp, opt = build(comm, kind, how)
    ddp.zero_grad()
    ddp.module.backward(loss_grad(ddp, comm.rank))
    raised = False
    try:
        ddp.step(opt)
    except UnsyncedGradientsError as exc:
        raised = f"{comm.size} rank(s)" in str(exc)
    check_all_ranks(raised, "ddp.step did not raise after ddp.module.backward")
    ddp.zero_grad()                                      # and a correct step afterwards still works
    ddp.backward(loss_grad(ddp, comm.rank))
    ddp.step(opt)
    check_ranks_agree(np.concatenate([v.ravel() for v in ddp.state_dict().values()]))


ONE_RANK_WRONG = """
import sys
import numpy as np
from npddp.comm import create
from npddp.nn import CrossEntropyLoss, mlp
from npddp.optim import SGD
from npddp.parallel.ddp import DistributedDataParallel
comm = create("mpi")
ddp = DistributedDataParallel(mlp(6, [5], 3, dtype=np.float64, seed=1), comm)
opt, loss_fn = SGD(ddp.parameters(), lr=0.1), CrossEntropyLoss()
x, y = np.ones((4, 6)), np.zeros(4, dtype=np.int64)
for step in range(3):
    ddp.zero_grad()
    loss_fn.forward(ddp(x), y)
    (ddp.module if comm.rank == 1 else ddp).backward(loss_fn.backward())
    ddp.step(opt)
print("finished", flush=True)
"""


def test_one_rank_bypassing_ends_the_job_promptly(tmp_path):
    """Rank 1 alone calls ddp.module.backward: it raises at step, and the job ends instead of hanging rank 0."""
    from tests.helpers.jobs import job_env, mpirun

    script = tmp_path / "one_rank_wrong.py"
    script.write_text(ONE_RANK_WRONG)
    started = time.monotonic()
    done = subprocess.run([mpirun(), "-n", "2", sys.executable, str(script)], env=job_env(),
                          capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "finished" not in out, out
    assert "UnsyncedGradientsError" in out and "[rank 1]" in out and "ddp.backward(dloss)" in out, out
    assert took < 60, f"{took:.1f} s"


# --- error messages name a bad value briefly ----------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda comm, a: DistributedDataParallel(mlp(IN, [5], OUT, seed=1), comm, bucket_cap_mb=a),
    lambda comm, a: DistributedDataParallel(mlp(IN, [5], OUT, seed=1), comm, sync=a),
    lambda comm, a: ZeroDataParallel(mlp(IN, [5], OUT, seed=1), comm, bucket_cap_mb=a),
    lambda comm, a: TopKState(comm, ratio=a),
    lambda comm, a: PowerSGDState(comm, rank=a),
    lambda comm, a: PowerSGDState(comm, start_iter=a),
    lambda comm, a: PeriodicModelAverager(comm, period=a),
], ids=["bucket_cap_mb", "sync", "zero_bucket_cap_mb", "topk", "powersgd_rank", "powersgd_start", "averager"])
def test_an_array_given_for_a_number_is_named_by_shape(call):
    comm = create("mpi", MPI.COMM_SELF)
    bad = np.zeros((1024, 64))
    with pytest.raises((TypeError, ValueError)) as info:
        call(comm, bad)
    text = str(info.value)
    assert "ndarray of shape (1024, 64) float64" in text and len(text) < 300, text
