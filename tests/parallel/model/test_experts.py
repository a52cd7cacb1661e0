"""Expert parallelism: a GPT with mixture-of-experts blocks, experts spread over ep ranks, ends where one
process holding every expert and the whole batch ends (float64, <= 1e-9 normwise after a dozen steps).

Run under ``mpirun -n K`` (K = 2, 4): ep 2 at two ranks, ep 2 x data 2 and ep 4 at four.
"""

import numpy as np
import pytest

from npddp.comm import create
from npddp.comm.transports.base import is_transport
from npddp.nn import CrossEntropyLoss, gpt
from npddp.nn.moe import LocalExperts
from npddp.optim import SGD, AdamW
from npddp.parallel.model.experts import (AllToAllExperts, ExpertDataParallel, check_ep, expert_owner,
                                          expert_parallel, is_expert_parameter)

from tests.helpers.ranks import world_raw

VOCAB, CONTEXT, BATCH, STEPS, EXPERTS = 13, 8, 8, 12, 4
MOE = {"num_experts": EXPERTS, "top_k": 2, "capacity_factor": 1.0, "aux_coef": 0.05}


def make_model():
    return gpt(VOCAB, CONTEXT, d_model=8, num_layers=2, num_heads=2, d_ff=12, dtype=np.float64, seed=3, moe=MOE)


def make_data():
    tokens = np.random.default_rng(0).integers(0, VOCAB, size=(STEPS, BATCH, CONTEXT + 1))
    return tokens[..., :-1], tokens[..., 1:]


def make_optimizer(name, params):
    return AdamW(params, lr=0.01, weight_decay=0.1) if name == "adamw" else SGD(params, lr=0.2, momentum=0.9)


def train(engine_or_model, rows, opt_name):
    """STEPS steps on ``rows`` of every batch; parameters by name."""
    model = getattr(engine_or_model, "module", engine_or_model)
    opt, loss = make_optimizer(opt_name, model.parameters()), CrossEntropyLoss()
    X, Y = make_data()
    for t in range(STEPS):
        engine_or_model.zero_grad()
        loss.forward(engine_or_model.forward(X[t, rows]), Y[t, rows])
        engine_or_model.backward(loss.backward())
        opt.step()
    return model.state_dict()


def test_owner_blocks_and_bad_ep():
    assert [expert_owner(e, 8, 4) for e in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    check_ep(8, 2, 4)
    with pytest.raises(ValueError, match="ep must be >= 1 and divide both the number of experts 6 and the world"):
        check_ep(6, 4, 4)
    assert is_expert_parameter("blocks.0.mlp.experts.3.0.weight") and not is_expert_parameter("blocks.0.mlp.router.weight")


def _world(backend):
    raw = world_raw()
    own = raw.split([0] * raw.size) if is_transport(raw) else raw.Dup()
    return create(backend, group=own)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
@pytest.mark.parametrize("ep", [2, 4])
def test_expert_parallel_equals_one_process(world, backend, ep, opt_name, assert_all_ranks):
    if world.size % ep or world.size > 4:
        pytest.skip(f"a world of {world.size} does not hold ep {ep} (or is above 4)")
    comm = _world(backend)
    group = comm.split(comm.rank // ep, comm.rank)                # the expert group: ep consecutive ranks
    same = comm.split(comm.rank % ep, comm.rank)                  # the ranks holding the same experts
    model = expert_parallel(make_model(), group)
    assert all(isinstance(m.dispatcher, AllToAllExperts) for _, m in model.named_modules() if hasattr(m, "dispatcher"))
    rows = np.array_split(np.arange(BATCH), comm.size)[comm.rank]
    got = train(ExpertDataParallel(model, comm, same), rows, opt_name)
    want = train(make_model(), np.arange(BATCH), opt_name)
    problems = []
    per = EXPERTS // ep
    for name, ref in want.items():
        if is_expert_parameter(name) and not group.rank * per <= int(name.split(".experts.")[1].split(".")[0]) < (group.rank + 1) * per:
            assert name not in got
            continue
        err = float(np.linalg.norm(got[name] - ref) / max(np.linalg.norm(ref), 1e-300))
        if not err <= 1e-9:
            problems.append(f"{name}: {err:.3g}")
    assert_all_ranks(not problems, "; ".join(problems))
    assert_all_ranks(all(n in want for n in got))


def test_local_dispatcher_is_the_default():
    model = make_model()
    assert isinstance(model.blocks[0].mlp.dispatcher, LocalExperts)


@pytest.mark.mpi(min_size=2)
def test_whole_state_gathers_every_expert_and_loads_into_any_ep(world, backend, assert_all_ranks):
    """Saved at ep 2 -> the whole model (what one process holds); the whole model -> ep 2 gives the same logits."""
    from npddp.parallel.model.experts import load_whole, whole_state_dict
    if world.size % 2 or world.size > 4:
        pytest.skip(f"a world of {world.size} does not hold ep 2 (or is above 4)")
    comm = _world(backend)
    group = comm.split(comm.rank // 2, comm.rank)
    same = comm.split(comm.rank % 2, comm.rank)
    rows = np.array_split(np.arange(BATCH), comm.size)[comm.rank]
    model = expert_parallel(make_model(), group)
    train(ExpertDataParallel(model, comm, same), rows, "sgd")
    whole = whole_state_dict(model, group)
    want = train(make_model(), np.arange(BATCH), "sgd")
    assert_all_ranks(sorted(whole) == sorted(want), "names differ from one process's")
    errs = [float(np.linalg.norm(whole[n] - want[n]) / np.linalg.norm(want[n])) for n in want]
    assert_all_ranks(max(errs) <= 1e-9, f"largest difference {max(errs):.3g}")
    one = make_model()                                            # resumed at ep 1 ...
    load_whole(one, whole)
    back = expert_parallel(make_model(), group)                   # ... and at ep 2 again
    load_whole(back, whole)
    X, _ = make_data()
    np.testing.assert_allclose(back.forward(X[0, rows]), one.forward(X[0, rows]), rtol=0, atol=1e-12)
    assert_all_ranks(not any(".experts.0." in n for n in back.state_dict()) or group.rank == 0)
