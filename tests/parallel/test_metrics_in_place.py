"""``DistributedDataParallel.reduce_metrics`` works in place like every collective, and a non-contiguous
buffer handed to an in-place collective is an error that says a copy would be left unreduced."""

import numpy as np
import pytest
from mpi4py import MPI

from npddp.comm import create
from npddp.nn import mlp
from npddp.parallel.ddp import DistributedDataParallel


def _ddp():
    return DistributedDataParallel(mlp(4, [3], 2, seed=0), create("mpi", MPI.COMM_SELF))


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "2-d"])
def test_an_array_is_summed_in_place_and_returned(dtype, layout):
    base = np.arange(12, dtype=dtype).reshape(3, 4) + 1
    sums = {"contiguous": base[0], "strided": base[:, 1], "2-d": base}[layout]
    expected = sums.copy()
    got = _ddp().reduce_metrics(sums)
    assert got is sums and got.dtype == dtype and np.array_equal(got, expected)   # one rank: the sum is itself


def test_a_list_gives_a_new_float64_array_and_a_read_only_array_is_refused():
    got = _ddp().reduce_metrics([1.0, 2.0, 3])
    assert got.dtype == np.float64 and got.tolist() == [1.0, 2.0, 3.0]
    frozen = np.ones(3)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        _ddp().reduce_metrics(frozen)


@pytest.mark.parametrize("backend", ["mpi", "ring"])
def test_a_non_contiguous_in_place_buffer_is_an_error_that_says_to_copy_the_result_back(backend):
    comm = create(backend, MPI.COMM_SELF)
    x = np.ones((4, 4))[:, 0]
    with pytest.raises(ValueError) as info:
        comm.allreduce(x)
    assert "copy the result back" in str(info.value) and "x[...] = tmp" in str(info.value)
