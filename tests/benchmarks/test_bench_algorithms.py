"""The sweep's rows per all-gather/reduce-scatter algorithm (``BACKEND:ALGORITHM``) and auto's ratio to the best."""

from __future__ import annotations

import pytest

from benchmarks import auto_collectives, collectives
from npddp.comm.algorithms import registry


@pytest.mark.parametrize("collective", ["allgather", "reduce_scatter"])
def test_default_rows_are_each_registered_algorithm_auto_and_mpi(collective):
    cfg = collectives.parse_config(["--collective", collective], verbose=False)
    assert cfg.backends == ("raw", "mpi", *(f"ring:{n}" for n in registry.names(collective)), "auto")
    assert collectives.split_backend("rd:halving", collective) == ("rd", {collective: "halving"})
    assert collectives.split_backend("auto", collective) == ("auto", None)


@pytest.mark.parametrize("argv, named", [
    (["--collective", "reduce_scatter", "--backends", "ring:bruck"], "'bruck'; valid: auto, "),
    (["--collective", "allgather", "--backends", "mpi:rd"], "'mpi' is not a backend"),
    (["--backends", "ring:rd"], "allreduce has no algorithm menu"),
])
def test_a_bad_backend_algorithm_pair_is_refused_naming_it(argv, named, capsys):
    with pytest.raises(SystemExit) as exc:
        collectives.parse_config(argv)
    assert exc.value.code == 2 and named in capsys.readouterr().err


def test_ratios_compare_auto_with_the_fastest_candidate_per_size():
    rows = [{"bytes": b, "backend": k, "algorithm": a, "time_median_s": t} for b, k, a, t in (
        (1024, "ring:ring", "ring", 4.0), (1024, "ring:bruck", "bruck", 2.0), (1024, "auto", "bruck", 2.2),
        (4096, "ring:ring", "ring", 3.0), (4096, "ring:bruck", "bruck", 6.0), (4096, "auto", "bruck", 6.0))]
    got = auto_collectives.ratios(rows)
    assert [(b, pick, best, ratio) for b, pick, best, _, _, ratio in got] == \
        [(1024, "bruck", "bruck", pytest.approx(1.1)), (4096, "bruck", "ring", pytest.approx(2.0))]
    assert auto_collectives.candidates("reduce_scatter")[-1] == "auto"
    assert set(auto_collectives.candidates("allgather")[:-1]) == \
        {f"ring:{n}" for n in registry.names("allgather", auto=True)}
