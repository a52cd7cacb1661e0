"""Sequence parallelism (with tensor parallelism, alone and with data or pipeline parallelism) ends at one
process's parameters; its errors come before any message.

Run under ``mpirun -n K`` (K = 2, 4) for the MPI tests; the serial ones check the layout and the errors.
"""

import numpy as np
import pytest

from npddp.nn import gpt
from npddp.parallel.model import tensor_parallel
from npddp.parallel.model.sequence import (GatherSequence, ScatterSequence, SequenceLayerNorm,
                                           SequenceParallelBlock, own_block)

from tests.helpers.split import CONTEXT, VOCAB, compare, make_model, train_split


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_sequence_parallel_equals_one_process(world, backend, opt_name, assert_all_ranks):
    """TP 2 with the sequence split over the world's pairs (x DP 2 at four ranks)."""
    if world.size not in (2, 4):
        pytest.skip(f"TP 2 needs 2 or 4 ranks, not {world.size}")
    got, shards = train_split(world, "gpt", 2, 1, 2, "1f1b", opt_name, backend, sequence=True)
    problems = compare("gpt", opt_name, got, shards)
    assert_all_ranks(not problems, f"gpt TP 2 + SP N={world.size}: " + "; ".join(problems[:4]))


@pytest.mark.mpi(min_size=4)
def test_sequence_parallel_with_pipeline_equals_one_process(world, backend, assert_all_ranks):
    """TP 2 x PP 2 with the sequence split: the stages pass sequence blocks."""
    if world.size != 4:
        pytest.skip(f"TP 2 x PP 2 needs 4 ranks, not {world.size}")
    got, shards = train_split(world, "gpt", 2, 2, 2, "1f1b", "adamw", backend, sequence=True)
    problems = compare("gpt", "adamw", got, shards)
    assert_all_ranks(not problems, "gpt TP 2 x PP 2 + SP: " + "; ".join(problems[:4]))


class _Group:
    """A stand-in tensor group of ``size`` ranks: the layout is built and checked without any message."""

    def __init__(self, size: int, rank: int = 0):
        self.rank, self.size, self.name = rank, size, "stand-in"

    def allreduce(self, buf, op="sum", out=None):
        raise AssertionError("a message was sent")

    allgather = reduce_scatter = allreduce


def test_layout_keeps_the_full_models_names():
    model = make_model("gpt")
    names = [n for n, _ in model.named_parameters()]
    sp = tensor_parallel(model, _Group(2), sequence=True)
    blocks = sp.blocks.layers
    assert [n for n, _ in sp.named_parameters()] == names
    assert all(isinstance(b, SequenceParallelBlock) for b in blocks) and [b.first for b in blocks] == [True, False]
    assert isinstance(blocks[0].attn.qkv.enter, GatherSequence) and isinstance(blocks[0].attn.proj.reduce,
                                                                               ScatterSequence)
    assert isinstance(blocks[1].mlp.layers[0].enter, GatherSequence)
    assert isinstance(sp.ln_f, SequenceLayerNorm) and sp.ln_f.gather_input and not blocks[0].ln1.gather_input


@pytest.mark.parametrize("tp,rank", [(2, 0), (2, 1), (3, 2)])
def test_own_block_is_array_splits_block(tp, rank):
    x = np.arange(2 * 6 * 3).reshape(2, 6, 3)
    assert np.array_equal(own_block(_Group(tp, rank), x), np.array_split(x, tp, axis=1)[rank])


def test_sequence_not_divisible_is_one_value_error_before_sending():
    model = gpt(VOCAB, CONTEXT, d_model=8, num_layers=1, num_heads=2, d_ff=12, dtype=np.float64)
    sp = tensor_parallel(model, _Group(2), sequence=True)
    with pytest.raises(ValueError, match=r"sequence length 5 is not divisible by the tensor-parallel size 2"):
        sp.forward(np.zeros((1, 5), np.int64))


def test_sequence_parallel_needs_a_gpt():
    with pytest.raises(ValueError, match=r"sequence parallelism splits a GPT's sequence, got Sequential"):
        tensor_parallel(make_model("mlp"), _Group(2), sequence=True)
