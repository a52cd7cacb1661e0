"""Serial tests of the benchmark helpers: size units, bus-bandwidth factors, argument types, NoComm."""

import numpy as np
import pytest

from benchmarks import _common as bc


@pytest.mark.parametrize("text, value", [("8", 8), ("1K", 1024), ("64m", 64 << 20), ("1G", 1 << 30),
                                         (" 3 K ", 3072), ("0", 0)])
def test_parse_size_uses_binary_multiples(text, value):
    assert bc.parse_size(text) == value


@pytest.mark.parametrize("text, value", [("1M", 10**6), ("350M", 350 * 10**6), ("25k", 25_000), ("7", 7)])
def test_parse_count_uses_decimal_multiples(text, value):
    assert bc.parse_count(text) == value


@pytest.mark.parametrize("bad", ["", "K", "1.5M", "-8", "8X", "1MB", "one"])
def test_parse_size_rejects_bad_text(bad):
    with pytest.raises(ValueError, match="bad size"):
        bc.parse_size(bad)


def test_format_size_and_count_roundtrip():
    for n in [1, 8, 1000, 1024, 1536, 4096, 3 << 20, 256 << 20, 1 << 30, 5 << 40]:
        assert bc.parse_size(bc.format_size(n)) == n
    assert [bc.format_size(n) for n in (8, 4096, 3 << 20, 1536)] == ["8", "4K", "3M", "1536"]
    assert [bc.format_count(n) for n in (999, 1500, 25 * 10**6, 350 * 10**6)] == ["999", "1.5K", "25M", "350M"]
    assert bc.format_count(1_068_810) == "1.07M"


def test_busbw_factor():
    for n in range(1, 9):
        assert bc.busbw_factor("allreduce", n) == pytest.approx(2 * (n - 1) / n)
        assert bc.busbw_factor("allgather", n) == bc.busbw_factor("reduce_scatter", n) == pytest.approx((n - 1) / n)
        assert bc.busbw_factor("alltoall", n) == pytest.approx((n - 1) / n)
        assert bc.busbw_factor("broadcast", n) == 1.0
    with pytest.raises(ValueError, match="unknown collective 'reduce'"):
        bc.busbw_factor("reduce", 2)
    with pytest.raises(ValueError, match="world size"):
        bc.busbw_factor("allreduce", 0)


def test_argument_types_reject_what_they_do_not_take():
    import argparse
    assert bc.names(("a", "b"))("b,a") == ("b", "a")
    assert bc.positive_floats("1,2.5") == (1.0, 2.5)
    assert bc.int_at_least(2)("3") == 3
    for convert, bad in [(bc.names(("a",)), "a,z"), (bc.names(("a",)), "a,a"), (bc.positive_floats, "0"),
                         (bc.positive_floats, "1,x"), (bc.int_at_least(2), "1"), (bc.int_at_least(0), "one")]:
        with pytest.raises(argparse.ArgumentTypeError):
            convert(bad)


def test_param_count_matches_the_built_models():
    from npddp.nn import mlp
    for name in ("tiny", "small"):
        assert mlp(bc.IN_FEATURES, bc.MODELS[name], bc.OUT_FEATURES, seed=0).num_parameters() == bc.param_count(name)
    assert bc.widths("tiny") == (784, 1024, 256, 10)


def test_algorithm_of_asks_a_backend_that_picks_and_names_one_that_does_not():
    class Picks:
        def algorithm_for(self, nbytes, dtype):
            return "rd" if nbytes < 4096 else f"ring-{dtype}"
    assert bc.algorithm_of(Picks(), "auto", 8, "float32") == "rd"
    assert bc.algorithm_of(Picks(), "auto", 1 << 20, "float64") == "ring-float64"
    assert bc.algorithm_of(object(), "ring", 8, "float32") == "ring"


def test_nocomm_skips_allreduces_and_delegates_the_rest():
    from mpi4py import MPI

    from npddp import comm as npcomm
    inner = npcomm.create("mpi", MPI.COMM_SELF)
    comm = bc.NoComm(inner)
    assert (comm.rank, comm.size, comm.name) == (0, 1, "none")
    buf = np.arange(4.0)
    assert comm.allreduce(buf) is buf and buf.tolist() == [0, 1, 2, 3]
    out = np.zeros(4)
    assert comm.allreduce(buf, out=out) is out and out.tolist() == buf.tolist()
    work = comm.iallreduce(buf)
    assert work.test() and work.wait() is buf
    assert comm.allgather(np.array([7])).tolist() == [[7]]  # the wrapped communicator's
