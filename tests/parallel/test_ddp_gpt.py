"""DDP on a tiny GPT whose LM head is tied to the token embedding (one parameter, two layers).

The tied weight's gradient is final only after both the head's and the embedding's backward;
N ranks must still end with the parameters of one process on the global batch, for every
sync strategy. Runs under ``mpirun -n K python -m pytest --with-mpi`` for any K dividing 12.
"""

import numpy as np
import pytest
from mpi4py import MPI

from npddp.comm import create
from npddp.parallel.ddp import SYNCS, DistributedDataParallel
from npddp.nn import CrossEntropyLoss, gpt
from npddp.optim import AdamW

from tests.helpers.fakes import IallreduceSpy

GLOBAL_BATCH, VOCAB, CONTEXT = 12, 11, 6     # 12 sequences: 1, 2, 3, 4 or 6 ranks
STEPS = 3
BUCKET_MB = 2e-3                              # a few parameters per bucket


def make_model():
    return gpt(VOCAB, CONTEXT, d_model=8, num_layers=2, num_heads=2, d_ff=12, dtype=np.float64, seed=3)


def make_data():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, size=(STEPS, GLOBAL_BATCH, CONTEXT + 1))
    return tokens[..., :-1], tokens[..., 1:]                 # (steps, B, T) inputs and next tokens


def flat(params):
    return np.concatenate([p.data.ravel() for p in params])


def train(model, step_fn, parts):
    """STEPS AdamW steps; ``step_fn(model, x, y)`` runs forward and backward."""
    X, Y = make_data()
    for t in range(STEPS):
        step_fn(X[t, parts], Y[t, parts])
    return model


def reference():
    model, loss = make_model(), CrossEntropyLoss()
    opt = AdamW(model.parameters(), lr=0.01, weight_decay=0.1)

    def step(x, y):
        model.zero_grad()
        loss.forward(model.forward(x), y)
        model.backward(loss.backward())
        opt.step()

    return flat(train(model, step, slice(None)).parameters())


@pytest.mark.mpi
@pytest.mark.parametrize("backend", ["mpi", "ring"])
def test_tied_gpt_matches_one_process_for_every_sync(backend, assert_all_ranks, assert_ranks_agree):
    world = MPI.COMM_WORLD
    usable = GLOBAL_BATCH % world.Get_size() == 0
    if not usable:
        pytest.skip(f"the global batch {GLOBAL_BATCH} does not split over {world.Get_size()} ranks")
    comm = create(backend, world)
    expected = reference()
    per = GLOBAL_BATCH // comm.size
    part = slice(comm.rank * per, (comm.rank + 1) * per)
    errors, finals = {}, {}
    for sync in SYNCS:
        model, loss = make_model(), CrossEntropyLoss()
        ddp = DistributedDataParallel(model, comm, sync=sync, bucket_cap_mb=BUCKET_MB)
        assert model.head.weight is model.tok_emb.weight
        opt = AdamW(ddp.parameters(), lr=0.01, weight_decay=0.1)

        def step(x, y, ddp=ddp, opt=opt, loss=loss):
            ddp.zero_grad()
            loss.forward(ddp(x), y)
            ddp.backward(loss.backward())
            ddp.step(opt)

        finals[sync] = flat(train(model, step, part).parameters())
        errors[sync] = float(np.max(np.abs(finals[sync] - expected)))
    for sync in SYNCS:
        assert_ranks_agree(finals[sync])
    assert_all_ranks(max(errors.values()) <= 1e-10, f"max |N ranks - one process| per sync: {errors}")


@pytest.mark.mpi(min_size=2)
def test_overlap_reduces_the_tied_weight_only_after_the_embedding_backward(assert_all_ranks):
    events = []
    comm = IallreduceSpy(create("mpi", MPI.COMM_WORLD), events)
    model = make_model()
    model.register_grad_hook(lambda layer: events.append(("layer", layer)))   # runs before DDP's hook
    ddp = DistributedDataParallel(model, comm, sync="overlap", bucket_cap_mb=BUCKET_MB)
    tied = next(b for b in ddp.buckets if any(p is model.tok_emb.weight for p in b.params))
    model_backward = model.backward

    def backward_then_mark(dout):
        model_backward(dout)
        events.append(("returned", None))

    model.backward = backward_then_mark
    X, _ = make_data()
    ddp.backward(np.ones_like(ddp(X[0, :2])))
    kinds = [(kind, obj is model.tok_emb if kind == "layer" else obj is tied.buffer) for kind, obj in events]
    started = [i for i, (kind, hit) in enumerate(kinds) if kind == "iallreduce" and hit]
    embedding_done = [i for i, (kind, hit) in enumerate(kinds) if kind == "layer" and hit]
    returned = kinds.index(("returned", False))
    # the tied bucket starts from the embedding's report: after both users, still inside backward
    assert_all_ranks(len(started) == 1 and len(embedding_done) == 1
                     and embedding_done[0] < started[0] < returned,
                     f"tied bucket started at event {started}, embedding backward done at {embedding_done}, "
                     f"backward returned at {returned}")
    # every other bucket still starts during backward, before the embedding's report
    others = [i for i, (kind, hit) in enumerate(kinds) if kind == "iallreduce" and not hit]
    assert_all_ranks(len(others) == len(ddp.buckets) - 1 and all(i < embedding_done[0] for i in others),
                    f"other buckets started at {others}")
