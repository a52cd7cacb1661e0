"""Validation at forward speed (:mod:`npddp.parallel.evaluation`): rows split over ranks give one process's totals,
every rank makes the same forward calls, the batch follows the memory a row needs, and the epoch line shows the time.

The ``mpi`` tests run under ``mpirun -n K`` and ``python -m npddp.run --nproc K`` (K = 2, 3, 4).
"""

import tracemalloc

import numpy as np
import pytest

from npddp.comm import create
from npddp.nn import CrossEntropyLoss, gpt, mlp
from npddp.parallel.zero import ZeroDataParallel
from npddp.train.console.printer import epoch_line
from npddp.parallel.evaluation import (PROBE_ROWS, WORKING_SET, agreed_batch, batch_for, evaluate_rows,
                                    forward_bytes_per_row)

from tests.helpers.ranks import check_all_ranks, check_ranks_agree

VOCAB, CONTEXT = 13, 8


def _gpt(dtype=np.float64):
    return gpt(VOCAB, CONTEXT, d_model=8, num_layers=2, num_heads=2, d_ff=12, dtype=dtype, seed=1)


def _tokens(rows, seed=0):
    t = np.random.default_rng(seed).integers(0, VOCAB, (rows, CONTEXT + 1))
    return t[:, :-1], t[:, 1:]


def _one_process(model, X, y):
    """(loss sum, correct, rows) the plain way: every row through the training forward, one row at a time."""
    loss, sums = CrossEntropyLoss(), np.zeros(3)
    for i in range(len(X)):
        logits = model.forward(X[i:i + 1])
        sums += (loss.forward(logits, y[i:i + 1]), loss.correct(logits, y[i:i + 1]) / y[i].size, 1)
    return sums


def _calls(model):
    """A list that grows by the batch size at every forward call of ``model``."""
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(len(args[0])))
    return seen


@pytest.mark.parametrize("rows", [0, 1, 2, 7, 23])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
@pytest.mark.parametrize("batch", [1, 3, 64])
def test_ranks_sharing_the_rows_sum_to_one_process_and_call_forward_alike(rows, size, batch):
    X, y = _tokens(rows)
    model = _gpt()
    want = _one_process(model, X, y) if rows else np.zeros(3)
    seen = _calls(model)
    got, calls = np.zeros(3), []
    for rank in range(size):
        got += evaluate_rows(model, X, y, rank, size, batch, lambda s: s)
        calls.append(len(seen))
        seen.clear()
    assert got[1:].tolist() == want[1:].tolist()                            # correct and rows exactly
    assert got[0] == pytest.approx(want[0], rel=1e-12, abs=1e-12)
    assert len(set(calls)) == 1, calls                                       # ZeRO-3 gathers in every call
    most = -(-rows // size)                                                  # the largest share
    assert calls[0] == max(1, min(-(-most // batch), rows // size))          # no empty pass while every rank has rows
    assert all(m.grad_enabled for _, m in model.named_modules())


def test_the_rows_go_through_forward_without_gradients_in_batches_of_at_most_the_batch():
    X, y = _tokens(20)
    model = _gpt()
    for p in model.parameters():
        p.grad[...] = 2.0
    seen = []
    model.register_forward_pre_hook(lambda module, args: seen.append(
        (len(args[0]), [m.grad_enabled for _, m in module.named_modules()])))
    evaluate_rows(model, X, y, 0, 1, 6, lambda s: s)
    assert [n for n, _ in seen] == [5, 5, 5, 5] and not any(any(flags) for _, flags in seen)
    assert all((p.grad == 2.0).all() for p in model.parameters())


def test_a_row_costs_what_its_forward_allocates_and_the_batch_fills_the_working_set():
    per_row = forward_bytes_per_row(gpt(256, 128, d_model=64, num_layers=2, num_heads=4, d_ff=256),
                                    np.zeros((8, 128), np.int64))
    # the tiny GPT at context 128 (float32): 4 heads of 128 x 128 scores, qkv and the output of one layer at a time
    assert 4 * 128 * 128 * 4 < per_row < 2 * (4 * 128 * 128 * 4 + 128 * (3 * 64 + 64 + 256) * 4), per_row
    assert batch_for(per_row) == WORKING_SET // per_row and 8 <= batch_for(per_row) <= 32
    small = forward_bytes_per_row(mlp(4, [8], 3), np.zeros((10, 4), np.float32))
    assert 0 < small < 1024 and batch_for(small) > 1000
    assert batch_for(10 ** 12) == 1 and batch_for(0) == WORKING_SET and batch_for(100, budget=1000) == 10
    assert forward_bytes_per_row(mlp(4, [8], 3), np.zeros((PROBE_ROWS[0], 4), np.float32)) == 1   # too few rows
    assert not tracemalloc.is_tracing()


def test_measuring_leaves_a_tracemalloc_session_already_running_as_it_was():
    tracemalloc.start()
    try:
        forward_bytes_per_row(mlp(4, [8], 3), np.zeros((10, 4), np.float32))
        assert tracemalloc.is_tracing()
    finally:
        tracemalloc.stop()


def test_the_epoch_line_shows_training_and_validation_time():
    row = {"epoch": 1, "train_loss": 1.0, "val_loss": 2.0, "val_acc": 0.5, "samples_per_s": 100.0,
           "compute_share": 0.9, "comm_share": 0.1, "train_s": 0.5, "val_s": 0.1234}
    assert epoch_line(row, 3).endswith("comm  10%  (0.50 s, val 0.12 s)")


@pytest.mark.mpi
@pytest.mark.parametrize("rows, batch", [(23, 2), (2, 1), (40, 64)])
def test_split_validation_gives_every_rank_the_totals_of_one_process(rows, batch):
    comm = create("ring")
    X, y = _tokens(rows)
    model = _gpt()
    want = _one_process(model, X, y)
    got = evaluate_rows(model, X, y, comm.rank, comm.size, batch, lambda s: comm.allreduce(s))
    check_ranks_agree(got)
    check_all_ranks(got[1:].tolist() == want[1:].tolist() and abs(got[0] - want[0]) <= 1e-12 * abs(want[0]),
                    f"{got} != {want}")


@pytest.mark.mpi
def test_zero_3_validation_with_uneven_shares_and_small_batches_ends_with_one_process_totals():
    comm = create("ring")
    X, y = _tokens(4 * comm.size + 1)                                       # one rank holds a row more
    want = _one_process(_gpt(), X, y)
    model = _gpt()
    ZeroDataParallel(model, comm, stage=3, bucket_cap_mb=1e-3)
    batch = agreed_batch(comm, model, X)                                    # the probe gathers parameters too
    check_ranks_agree(np.array([batch]))
    alone = agreed_batch(create("ring"), _gpt(), X)                         # what the gathers cost is not per row
    # the probe's peak also holds the group ZeRO-3 prefetches while a layer computes: a smaller batch, not a per-row cost
    check_all_ranks(abs(batch - alone) <= alone // 5, f"ZeRO-3's batch {batch}, the whole model's {alone}")
    got = evaluate_rows(model, X, y, comm.rank, comm.size, 2, lambda s: comm.allreduce(s))
    check_all_ranks(got[1:].tolist() == want[1:].tolist() and abs(got[0] - want[0]) <= 1e-12 * abs(want[0]),
                    f"{got} != {want}")
