"""Data replicas of a split model (--tp/--pp at N > tp x pp): one process's dropout masks, and the banner's share.

A DistributedSampler gives replica ``r`` of ``N`` the rows ``r, r + N, ...`` of each global
batch, so a replica's dropout draws are those of every ``N``-th row of one process's batch
(:meth:`RowAlignedDropout.at_rows` with a stride). The whole-run tests start mpirun themselves
(serial pytest, marked slow): --pp 2 and --tp 2 at N = 4 with --dropout end within 1e-9 of one
process after a dozen float64 steps.
"""

from types import SimpleNamespace

import numpy as np
import pytest

from npddp.nn import Dropout, Sequential
from npddp.parallel.model import RowAlignedDropout
from npddp.checkpoint import fileformat
from npddp.train.config import Config
from npddp.train.cli.parser import parse_args
from npddp.train.console.banner import header
from tests.helpers.cli import ok, train

MLP = ["--model", "mlp", "--hidden", "32", "32", "--dropout", "0.2", "--dtype", "float64", "--train-samples", "96",
       "--val-samples", "32", "--batch-size", "8", "--epochs", "1", "--max-steps", "12", "--progress", "none"]


@pytest.mark.parametrize("replicas", [2, 3])
@pytest.mark.parametrize("drawn_before", [0, 3])            # 3: the stream holds half a 64-bit output
def test_strided_rows_get_the_one_process_bits_of_those_rows(replicas, drawn_before):
    rows = 4 * replicas
    whole = Dropout(0.3, seed=11)
    split = [Dropout(0.3, seed=11) for _ in range(replicas)]
    for layer in [whole, *split]:
        layer.forward(np.ones((1, drawn_before))) if drawn_before else None
    x = np.ones((rows, 5))
    want = whole.forward(x)
    for r, layer in enumerate(split):                       # replica r holds rows r, r + replicas, ...
        aligned = RowAlignedDropout(Sequential(layer))
        aligned.begin_step()
        mine = x[r::replicas]
        aligned.at_rows(r + 2 * replicas, replicas)          # its micro-batch 1 (local rows 2, 3), then 0
        late = layer.forward(mine[2:])
        aligned.at_rows(r, replicas)
        early = layer.forward(mine[:2])
        assert np.array_equal(np.concatenate([early, late]), want[r::replicas]), f"replica {r}"
        dx = layer.backward(np.ones_like(late))
        assert np.array_equal(dx != 0, want[r::replicas][:2] != 0)       # backward uses the forward's mask
        aligned.end_step(rows)
        assert np.array_equal(layer.get_rng_state(), whole.get_rng_state())   # the next step starts alike


def test_a_stride_below_one_is_named():
    aligned = RowAlignedDropout(Sequential(Dropout(0.5)))
    with pytest.raises(ValueError, match=r"stride must be an integer >= 1, got 0"):
        aligned.at_rows(0, 0)


@pytest.mark.parametrize("argv,world,text", [
    (["--tp", "2"], 4, "batch 8 = 2 replicas x 4, 12 steps per epoch"),
    (["--tp", "2", "--pp", "2"], 4, "batch 8 = 1 replica x 8, 12 steps per epoch"),
    ([], 4, "batch 8 = 4 x 2, 12 steps per epoch"),
])
def test_the_data_line_divides_the_batch_by_the_data_replicas(argv, world, text):
    cfg = Config(**parse_args(["--model", "mlp", "--batch-size", "8", *argv]))
    comm = SimpleNamespace(size=world, rank=0, transport=SimpleNamespace(name="tcp"))
    ds = SimpleNamespace(name="synthetic", n_train=96, n_val=32, input_shape=(64,), num_classes=10)
    model = SimpleNamespace(num_bytes=lambda: 8, num_parameters=lambda: 1)
    trainer = SimpleNamespace(loader=range(12))
    lines = header(cfg, comm, ds, "mlp", model, SimpleNamespace(buckets=[], whole_count=lambda: 3), trainer, {},
                   "threads: 1")
    data = next(line for line in lines if line.startswith("data: "))
    assert data.endswith(text), data


@pytest.mark.parametrize("argv,count,sync", [
    (["--tp", "2"], "3 parameters (float32, 24 B)", "sync: none (one data replica), comm hook allreduce"),
    ([], "1 parameters (float32, 8 B)", "sync: overlap, 0 bucket, comm hook allreduce"),
])
def test_the_model_line_counts_the_whole_model_not_the_ranks_part(argv, count, sync):
    cfg = Config(**parse_args(["--model", "mlp", "--batch-size", "8", *argv]))
    comm = SimpleNamespace(size=2, rank=0, transport=SimpleNamespace(name="tcp"))
    ds = SimpleNamespace(name="synthetic", n_train=96, n_val=32, input_shape=(64,), num_classes=10)
    part = SimpleNamespace(num_bytes=lambda: 8, num_parameters=lambda: 1)   # this rank's part: 1 of 3
    lines = header(cfg, comm, ds, "mlp", part, SimpleNamespace(buckets=[], whole_count=lambda: 3),
                   SimpleNamespace(loader=range(12)), {}, "threads: 1")
    assert next(line for line in lines if line.startswith("model: ")).endswith(count), lines
    assert sync in lines, lines


def _worst(a: dict, b: dict) -> float:
    assert list(a) == list(b)
    return max(float(np.abs(a[k] - b[k]).max() / np.abs(a[k]).max()) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [["--pp", "2", "--pp-schedule", "gpipe"], ["--pp", "2", "--micro-batches", "4"],
                                    ["--tp", "2", "--micro-batches", "2"]], ids=["pp2-gpipe", "pp2-1f1b", "tp2"])
def test_two_data_replicas_with_dropout_end_at_one_process(tmp_path, layout):
    ok(train(tmp_path, *MLP, "--quiet", "--checkpoint", "one.h5", n=None))
    out = ok(train(tmp_path, *MLP, *layout, "--checkpoint", "split.h5", n=4))
    assert "batch 8 = 2 replicas x 4," in out.stdout and "dp 2 x " in out.stdout
    one, split = fileformat.read(tmp_path / "one.h5"), fileformat.read(tmp_path / "split.h5")
    assert split.step == 12 and _worst(one.params, split.params) <= 1e-9
    for row in split.dropout_rng:                           # every replica's streams stand where one process's do
        assert np.array_equal(row, one.dropout_rng[0])
