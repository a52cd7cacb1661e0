"""Pipeline parallelism (alone, with tensor and with data parallelism) ends at one process's parameters.

Run under ``mpirun -n K`` or ``python -m npddp.run --nproc K`` (K = 2, 3, 4). Every layout of the
world that the test names and K allows trains the dropout MLP (SGD) and the tied-head GPT
(AdamW) for a dozen steps under both schedules, with 3 micro-batches per step.
"""

import pytest

from tests.helpers.split import compare, train_split

# (tp, pp, model): PP 2 (x DP 2 at four ranks), PP 3, TP 2 x PP 2, and PP 4 for the GPT (the MLP has 3 Linears)
CASES = [(tp, pp, kind, opt) for tp, pp in [(1, 2), (1, 3), (2, 2), (1, 4)]
         for kind, opt in [("mlp", "sgd"), ("gpt", "adamw")] if pp <= 3 or kind == "gpt"]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("tp,pp,kind,opt_name", CASES, ids=[f"tp{t}-pp{p}-{k}" for t, p, k, _ in CASES])
def test_pipeline_equals_one_process(world, backend, tp, pp, kind, opt_name, schedule, assert_all_ranks):
    if world.size % (tp * pp):
        pytest.skip(f"a world of {world.size} does not hold tp {tp} x pp {pp}")
    got, shards = train_split(world, kind, tp, pp, 3, schedule, opt_name, backend)
    problems = compare(kind, opt_name, got, shards)
    assert_all_ranks(not problems, f"{kind} tp {tp} pp {pp} {schedule} N={world.size}: " + "; ".join(problems[:4]))
