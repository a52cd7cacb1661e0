"""The backends the tensor- and pipeline-parallel tests run their groups on."""

import pytest

from tests.helpers.ranks import RUN_BACKENDS


@pytest.fixture(params=[b for b in ("mpi", "ring") if b in RUN_BACKENDS])
def backend(request):
    """mpi and ring (mpi only under mpirun)."""
    return request.param
