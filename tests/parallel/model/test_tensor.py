"""Tensor parallelism (alone, and with data parallelism) ends at one process's parameters.

Run under ``mpirun -n K`` or ``python -m npddp.run --nproc K`` (K = 2, 3, 4): the world is laid
out as a (dp, pp, tp) mesh; every rank also trains the full model in one process on the whole
global batch and compares its shards with the matching slices. The serial tests check the
errors raised before anything is sent.
"""

import numpy as np
import pytest

from npddp.nn import Linear, ReLU, Sequential, gpt
from npddp.parallel.model import Mesh, mesh_groups, tensor_parallel
from npddp.parallel.model.tensor import ColumnParallelLinear, RowParallelLinear

from tests.helpers.ranks import world_raw
from tests.helpers.split import CONTEXT, VOCAB, compare, make_model, train_split

def fits(world, tp: int, pp: int) -> bool:
    return world.size % (tp * pp) == 0 and world.size > 1


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind,opt_name", [("mlp", "sgd"), ("gpt", "adamw")])
def test_tensor_parallel_equals_one_process(world, backend, kind, opt_name, assert_all_ranks):
    """TP 2 over the world's pairs (TP 2 x DP 2 at four ranks, TP 2 alone at two)."""
    if not fits(world, 2, 1) or world.size > 4:
        pytest.skip(f"TP 2 needs an even world of 2 or 4 ranks, not {world.size}")
    got, shards = train_split(world, kind, 2, 1, 2, "1f1b", opt_name, backend)
    problems = compare(kind, opt_name, got, shards)
    assert_all_ranks(not problems, f"{kind} TP 2 N={world.size}: " + "; ".join(problems[:4]))


@pytest.mark.mpi(min_size=2)
def test_tensor_parallel_layers_split_as_planned(world, backend, assert_all_ranks):
    """The MLP pairs column/row and keeps its odd last Linear whole; the GPT's names are the full model's."""
    if world.size % 2:
        pytest.skip("needs an even world")
    raw = world_raw()
    groups = mesh_groups(Mesh(world.size, tp=2), raw, backend)
    mlp = tensor_parallel(make_model("mlp"), groups.tensor)
    kinds = [type(m).__name__ for m in mlp.layers]
    g = make_model("gpt")
    names = [n for n, _ in g.named_parameters()]
    tp_gpt = tensor_parallel(g, groups.tensor)
    ok = (isinstance(mlp.layers[0], ColumnParallelLinear) and isinstance(mlp.layers[3], RowParallelLinear)
          and kinds[2] == "SplitDropout" and type(mlp.layers[6]) is Linear
          and [n for n, _ in tp_gpt.named_parameters()] == names)
    assert_all_ranks(ok, f"layers {kinds}")


class _Group:
    """A stand-in tensor group: the checks run before any message, so none is ever sent."""

    def __init__(self, size: int):
        self.rank, self.size, self.name = 0, size, "stand-in"

    def allreduce(self, buf, op="sum", out=None):
        raise AssertionError("a message was sent")


def test_heads_not_divisible_is_one_value_error_before_sending():
    model = gpt(VOCAB, CONTEXT, d_model=9, num_layers=1, num_heads=3, d_ff=12, dtype=np.float64)
    with pytest.raises(ValueError, match=r"num_heads 3 is not divisible by the tensor-parallel size 2"):
        tensor_parallel(model, _Group(2))
    assert model.blocks.layers[0].attn.__class__.__name__ == "CausalSelfAttention"   # nothing converted


def test_hidden_not_divisible_is_one_value_error():
    with pytest.raises(ValueError, match=r"^layer '0' \(Linear 5 -> 12\): out_features 12 is not divisible by the "
                                         r"tensor-parallel size 5"):
        tensor_parallel(make_model("mlp"), _Group(5))
    model = gpt(VOCAB, CONTEXT, d_model=8, num_layers=1, num_heads=4, d_ff=10, dtype=np.float64)
    with pytest.raises(ValueError, match=r"d_ff 10 is not divisible by the tensor-parallel size 4"):
        tensor_parallel(model, _Group(4))


def test_a_layer_that_cannot_split_is_named():
    from npddp.nn import Flatten
    with pytest.raises(ValueError, match=r"layer 0 is Flatten"):
        tensor_parallel(Sequential(Flatten(), Linear(4, 4), ReLU(), Linear(4, 2)), _Group(2))
