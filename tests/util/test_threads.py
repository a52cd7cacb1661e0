"""BLAS threads per rank: counting the ranks on this node from launcher variables, the auto rule,
and that the number is really applied to the BLAS library NumPy loaded."""

import json
import os
import subprocess
import sys

import pytest

from npddp.util import threads


@pytest.mark.parametrize("environ, ranks, source", [
    ({}, 1, "no launcher variable"),
    ({"LOCAL_WORLD_SIZE": "4"}, 4, "LOCAL_WORLD_SIZE"),
    ({"MPI_LOCALNRANKS": "3"}, 3, "MPI_LOCALNRANKS"),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, 2, "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ({"LOCAL_WORLD_SIZE": "5", "MPI_LOCALNRANKS": "2"}, 5, "LOCAL_WORLD_SIZE"),
    ({"MPI_LOCALNRANKS": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "x"}, 1, "no launcher variable"),
])
def test_ranks_on_this_node_come_from_the_launchers_variables(monkeypatch, environ, ranks, source):
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)    # as before MPI is initialised
    assert threads.local_ranks(environ) == (ranks, source)


def test_without_launcher_variables_an_initialised_mpi_is_asked():
    from mpi4py import MPI

    assert threads.local_ranks({}) == (MPI.COMM_WORLD.Get_size(), "MPI shared-memory split")


@pytest.mark.parametrize("cpus, ranks, expected", [(2, 2, 1), (2, 1, 2), (16, 4, 4), (16, 3, 5), (2, 8, 1),
                                                   (1, 1, 1)])
def test_auto_divides_the_cpus_among_the_ranks_at_least_one_each(cpus, ranks, expected):
    n, why = threads.auto_threads({"LOCAL_WORLD_SIZE": str(ranks), "OMP_NUM_THREADS": ""}, cpus=cpus)
    assert n == expected and why == (f"auto: {cpus} CPU{'s' * (cpus != 1)} / {ranks} rank{'s' * (ranks != 1)} "
                                     "on this node")


@pytest.mark.parametrize("environ, expected", [({"OMP_NUM_THREADS": "3"}, (3, "auto: OMP_NUM_THREADS=3")),
                                               ({"OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "5"},
                                                (2, "auto: OPENBLAS_NUM_THREADS=2")),
                                               ({"MKL_NUM_THREADS": "4", "OMP_NUM_THREADS": "0"},
                                                (4, "auto: MKL_NUM_THREADS=4"))])
def test_a_thread_variable_set_by_the_user_is_their_choice(environ, expected):
    assert threads.auto_threads({"LOCAL_WORLD_SIZE": "2", **environ}, cpus=16) == expected


def test_available_cpus_is_the_affinity_mask():
    assert threads.available_cpus() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("text, value", [("auto", "auto"), ("AUTO", "auto"), ("3", 3), (2, 2)])
def test_parse_threads_accepts_auto_or_a_positive_integer(text, value):
    assert threads.parse_threads(text) == value


@pytest.mark.parametrize("text", ["0", "-1", "two", "", 0, 1.5])
def test_parse_threads_names_the_valid_values(text):
    with pytest.raises(ValueError, match="threads must be 'auto' or a positive integer"):
        threads.parse_threads(text)


PROBE = """
import json, numpy
from threadpoolctl import threadpool_info
from npddp.util import threads
n, why = threads.set_threads("auto")
print(json.dumps({"n": n, "why": why, "blas": [i["num_threads"] for i in threadpool_info()
                                               if i["user_api"] == "blas"]}))
"""


@pytest.mark.parametrize("ranks", [1, 2, 64])
def test_auto_is_applied_to_numpys_blas_in_a_fresh_shell(ranks):
    """No thread variable set, as in a new user's shell: OpenBLAS would start one thread per core."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env.update(LOCAL_WORLD_SIZE=str(ranks))
    out = json.loads(subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                                    timeout=60, check=True).stdout)
    expected = max(1, len(os.sched_getaffinity(0)) // ranks)
    assert out["n"] == expected and out["blas"] and all(n == expected for n in out["blas"]), out


def test_the_command_line_prints_what_mpi_run_sh_exports():
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-m", "npddp.util.threads", "--ranks", "2"], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert out.strip() == str(max(1, len(os.sched_getaffinity(0)) // 2))


@pytest.mark.parametrize("cpus, launcher_cpus, ranks, expected", [
    (1, 2, 2, (1, "bound to 1 CPU by the launcher")),             # Open MPI's or Intel MPI's binding on 2 cores
    (4, 16, 4, (4, "bound to 4 CPUs by the launcher")),           # each rank all of its own 4, not 4 / 4
    (2, 2, 2, (1, "auto: 2 CPUs / 2 ranks on this node")),        # not bound: the ranks share the CPUs
    (4, 8, 4, (1, "auto: 4 CPUs / 4 ranks on this node")),        # 4 masks of 4 cannot lie side by side in 8
])
def test_a_rank_its_launcher_bound_to_cpus_of_its_own_uses_them_all(cpus, launcher_cpus, ranks, expected):
    environ = {"OMPI_COMM_WORLD_LOCAL_SIZE": str(ranks), "OMPI_COMM_WORLD_SIZE": str(ranks)}
    assert threads.auto_threads(environ, cpus=cpus, launcher_cpus=launcher_cpus) == expected


def test_a_smaller_mask_without_an_mpi_launcher_is_divided_as_before():
    assert threads.auto_threads({"LOCAL_WORLD_SIZE": "2"}, cpus=1, launcher_cpus=2) == (
        1, "auto: 1 CPU / 2 ranks on this node")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to bind a child to fewer than its parent")
def test_the_header_line_says_a_rank_is_bound_by_its_launcher():
    cpu = min(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                            "MKL_NUM_THREADS", "SLURM_CPUS_PER_TASK")}
    env.update(OMPI_COMM_WORLD_LOCAL_SIZE="2", OMPI_COMM_WORLD_SIZE="2", OMPI_COMM_WORLD_RANK="0")
    code = "from npddp.util import threads; print(threads.describe(*threads.resolve('auto')))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))    # as mpirun's binding does
    assert done.stdout.strip() == "threads: 1 BLAS thread per rank (bound to 1 CPU by the launcher)", done.stderr
