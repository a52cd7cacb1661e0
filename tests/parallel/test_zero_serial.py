"""ZeRO on one rank (no peers needed): the partition rule, argument errors, the stages' arithmetic and ZeRO-3's freeing."""

import numpy as np
import pytest
from mpi4py import MPI

from npddp.comm import create
from npddp.nn import Parameter
from npddp.optim import SGD, AdamW
from npddp.parallel.zero import ShardedOptimizer, ZeroDataParallel, ZeroRedundancyOptimizer, partition_parameters

from tests.helpers.zero import make_model, train, values


@pytest.mark.parametrize("sizes, n, want", [
    ([5, 3, 3, 1], 2, [[0, 3], [1, 2]]),          # 5 -> 0; 3 -> 1; 3 -> 1 (3 < 5); 1 -> 0 (5 < 6)
    ([4, 4, 4, 4], 4, [[0], [1], [2], [3]]),       # ties go to the lowest rank, largest first
    ([1, 2], 3, [[1], [0], []]),                   # more ranks than parameters: an empty rank
    ([], 2, [[], []]),
])
def test_partition_whole_parameters_greedily_by_size(sizes, n, want):
    got = partition_parameters(sizes, n)
    assert sorted(i for ids in got for i in ids) == list(range(len(sizes)))
    totals = [sum(sizes[i] for i in ids) for ids in got]
    assert got == want, (got, totals)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_partition_rejects_a_bad_world_size(bad):
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        partition_parameters([1, 2], bad)


def test_bad_arguments_name_the_value():
    comm = create("ring", MPI.COMM_SELF)
    with pytest.raises(ValueError, match="stage must be one of"):
        ZeroDataParallel(make_model("mlp", "float64"), comm, stage=1)
    with pytest.raises(ValueError, match="bucket_cap_mb must be a positive number"):
        ZeroDataParallel(make_model("mlp", "float64"), comm, stage=2, bucket_cap_mb=0)
    with pytest.raises(ValueError, match="empty parameter list"):
        ZeroRedundancyOptimizer([], SGD, comm, lr=0.1)
    with pytest.raises(TypeError, match="not a Parameter"):
        ZeroRedundancyOptimizer([np.zeros(3)], SGD, comm, lr=0.1)
    opt = ZeroRedundancyOptimizer([Parameter(np.zeros(3))], SGD, comm, lr=0.1)
    with pytest.raises(ValueError, match="to=1 is out of range"):
        opt.consolidate_state_dict(to=1)


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("opt_name", ["adamw", "sgd"])
def test_one_rank_every_stage_is_the_plain_optimizer_bit_for_bit(stage, opt_name):
    comm = create("ring", MPI.COMM_SELF)
    m0, e0, _ = train(comm, "gpt", "float64", 0, opt_name)
    model, engine, _ = train(comm, "gpt", "float64", stage, opt_name)
    assert values(model, engine).tobytes() == values(m0, e0).tobytes()


def test_zero3_frees_values_and_gradients_between_uses():
    comm = create("ring", MPI.COMM_SELF)
    model, engine, _ = train(comm, "gpt", "float64", 3, "adamw", steps=1)
    for p in model.parameters():   # between steps: read-only zeros that occupy no memory
        assert p.data.strides == (0,) * p.data.ndim and not p.data.flags.writeable and not p.data.any()
        assert p.grad.strides == (0,) * p.grad.ndim
    with engine.full_parameters():
        assert all(p.data.flags.writeable and p.data.any() for p in model.parameters() if p.data.size > 1)
    held = engine.bytes_per_rank()
    assert held["params"] == held["grads"] == sum(g.shard_size * 8 for g in engine.buckets)


def test_zero2_on_one_rank_keeps_one_gradient_copy():
    """One rank: the shard is the whole group, so every p.grad is a view into the shard's gradient (DDP's memory)."""
    comm = create("ring", MPI.COMM_SELF)
    model, engine, _ = train(comm, "gpt", "float64", 2, "adamw", steps=1)
    for g in engine.buckets:
        assert all(np.shares_memory(p.grad, g.shard.grad) for p in g.params)
    held = engine.bytes_per_rank()
    assert held["grads"] == sum(g.padded * 8 for g in engine.buckets)


def test_state_dict_before_consolidation_is_a_clear_error():
    comm = create("ring", MPI.COMM_SELF)
    _, engine, opt = train(comm, "mlp", "float64", 2, "adamw", steps=1)
    with pytest.raises(RuntimeError, match=r"consolidate_state_dict\(to=RANK\)"):
        opt.state_dict()
    assert isinstance(opt, ShardedOptimizer) and isinstance(opt.optim, AdamW)


class _RankOf:
    """Stands in for rank ``rank`` of ``size`` where ShardedInit only asks which rank it is."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("kind", ["mlp", "cnn", "gpt"])
def test_sharded_build_pieces_are_the_whole_build_cut_bit_for_bit(size, kind, monkeypatch):
    """Each simulated rank's pieces, drawn in chunks smaller than a parameter, concatenate to the whole build's values."""
    from npddp.nn import init as init_module
    from npddp.parallel.zero import ShardedInit
    monkeypatch.setattr(init_module, "CHUNK", 7)                   # cuts every weight across chunks and ranks
    whole = make_model(kind, "float32").parameters()
    pieces = []
    for rank in range(size):
        init = ShardedInit(_RankOf(rank, size))
        with init:
            model = make_model(kind, "float32")
        assert all(p.data.strides == (0,) * p.data.ndim for p in model.parameters())
        pieces.append([init.pieces[id(p)] for p in model.parameters()])
    for i, p in enumerate(whole):
        got = np.concatenate([pieces[r][i] for r in range(size)])[:p.data.size]
        assert got.tobytes() == p.data.reshape(-1).tobytes(), f"parameter {i} {p.shape}"


def test_sharded_build_never_allocates_a_whole_parameter(monkeypatch):
    """While a rank builds its shards, its traced peak stays below its 1/N of the model plus one chunk, and
    below the largest parameter (the tied embedding, over half the model): the values are drawn a chunk at a time, never whole."""
    import tracemalloc
    from npddp.nn import gpt
    from npddp.nn import init as init_module
    from npddp.parallel.zero import ShardedInit
    monkeypatch.setattr(init_module, "CHUNK", 1024)
    build = lambda: gpt(4096, 16, d_model=64, num_layers=2, num_heads=2, d_ff=128, dtype=np.float64, seed=3)
    params = build().parameters()
    whole, largest = sum(p.data.nbytes for p in params), max(p.data.nbytes for p in params)
    init = ShardedInit(_RankOf(1, 2))
    tracemalloc.start()
    try:
        with init:
            build()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    chunk = 3 * 1024 * 8 + 96 * 1024                               # a chunk drawn and scaled; the modules' objects
    assert init.held_bytes() <= whole / 2 + 8 * len(params)
    assert peak < whole / 2 + chunk and peak < largest, (peak, whole, largest)
