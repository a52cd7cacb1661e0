"""ZeRO-3 whose all-gathers and reduce-scatters run each registered algorithm ends with DDP's parameters (float64).

Run under ``mpirun -n K`` (K = 2, 3): every pairing below covers each all-gather and each reduce-scatter algorithm
at least once; the communicator's record of the algorithms it built shows they ran.
"""

from __future__ import annotations

from itertools import cycle, islice

import numpy as np
import pytest

from npddp.comm import create
from npddp.comm.algorithms import registry

from tests.helpers.ranks import world_raw
from tests.helpers.zero import TOLERANCE, train, values

GATHERS, SCATTERS = registry.names("allgather", builtin=True), registry.names("reduce_scatter", builtin=True)
PAIRS = list(zip(GATHERS, islice(cycle(SCATTERS), len(GATHERS)))) if len(GATHERS) >= len(SCATTERS) else \
    list(zip(islice(cycle(GATHERS), len(SCATTERS)), SCATTERS))


def test_the_pairs_cover_every_algorithm():
    assert {g for g, _ in PAIRS} == set(GATHERS) and {s for _, s in PAIRS} == set(SCATTERS)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", ["mlp", "gpt"])
@pytest.mark.parametrize("gather, scatter", PAIRS)
def test_zero3_with_each_algorithm_equals_ddp(kind, gather, scatter, assert_all_ranks, assert_ranks_agree):
    opt_name = "adamw" if kind == "gpt" else "sgd"
    plain = create("ring", world_raw())
    want = values(*train(plain, kind, "float64", 0, opt_name)[:2])
    comm = create("ring", world_raw(), algorithms={"allgather": gather, "reduce_scatter": scatter})
    model, engine, _ = train(comm, kind, "float64", 3, opt_name)
    got = values(model, engine)
    err = float(np.linalg.norm(got - want) / np.linalg.norm(want))
    ran = {name for _, name in comm.choice._built}   # (collective, name) of every algorithm instance built
    assert_ranks_agree(got)
    assert_all_ranks(err <= TOLERANCE["float64"] and {gather, scatter} <= ran,
                     f"{kind} allgather={gather} reduce_scatter={scatter} N={comm.size}: relative difference "
                     f"{err:.3g} from DDP, algorithms run {sorted(ran)}")
