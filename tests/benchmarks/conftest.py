"""Benchmark tests: the repository root on sys.path (the faces under benchmarks/ import as a
package), and fixtures that launch a benchmark script or a job under mpirun."""

import subprocess
import sys

import pytest

from tests.helpers.jobs import ROOT, mpirun, outside_env, run_job as run_one

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def run_script():
    """``run_script(n, "allreduce.py", *args, cwd=None)``: run benchmarks/<script> on n ranks; CompletedProcess."""
    def run(n: int, script: str, *args: str, cwd=None, timeout: float = 120):
        command = [mpirun(), "-n", str(n), sys.executable, str(ROOT / "benchmarks" / script), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=outside_env(), cwd=cwd or ROOT)
    return run


@pytest.fixture
def run_job():
    """``run_job(args, n=2, cwd=None, timeout=120, **env)`` -> CompletedProcess of ``mpirun -n n python ARGS``."""
    return run_one


def _torch_compare_rows():
    """Rows of a torch_compare dump made by the benchmark's own row builder (no PyTorch needed)."""
    from types import SimpleNamespace

    import numpy as np

    from benchmarks import compare_torch as ct
    cfg = ct.parse_config(["--model", "tiny", "--reps", "3", "--steps", "2", "--batch", "4"], verbose=False)
    sides = [SimpleNamespace(framework="torch", backend="gloo", sync="ddp", label="torch gloo"),
             SimpleNamespace(framework="npddp", backend="mpi", sync="overlap", label="npddp mpi"),
             SimpleNamespace(framework="npddp", backend="ring", sync="overlap", label="npddp ring")]
    sps = np.array([[100.0, 120.0, 90.0], [110.0, 125.0, 95.0], [105.0, 118.0, 99.0]])  # (reps, sides)
    return ct.result_rows(sides, sps, [0.0, 1e-7, 2e-7], cfg, 1), sps, sides


@pytest.fixture(scope="session")
def dumps(tmp_path_factory):
    """{kind: path} of one small dump of every kind, each written by its producer on MPI.COMM_SELF."""
    from mpi4py import MPI

    from benchmarks import collectives as ar
    from benchmarks import ddp as bd
    from benchmarks import results
    directory = tmp_path_factory.mktemp("dumps")
    paths = {k: directory / f"{k}.h5" for k in ("allreduce_sweep", "ddp_breakdown", "weak_scaling", "torch_compare",
                                                "naive_ddp", "parallelism")}
    quiet = ["--batch", "4", "--steps", "2", "--warmup", "0", "--models", "tiny"]
    assert ar.main(["-b", "8", "-e", "4K", "-f", "8", "--iters", "3", "--warmup", "1", "--budget", "0.001",
                    "--out", str(paths["allreduce_sweep"])], mpi_comm=MPI.COMM_SELF) == 0
    assert bd.main(quiet + ["--syncs", "flat,overlap", "--bucket-mb", "1", "--backends", "mpi,ring", "--no-comm",
                            "--out", str(paths["ddp_breakdown"])], mpi_comm=MPI.COMM_SELF) == 0
    assert bd.main(quiet + ["--weak-scaling", "--repeats", "2", "--no-comm", "--out", str(paths["weak_scaling"])],
                   mpi_comm=MPI.COMM_SELF) == 0
    from benchmarks import naive_ddp as nd
    assert nd.main(["--model-size", "tiny", "--sync", "per_param,overlap", "--context-length", "8", "--vocab-size",
                    "32", "--batch-size", "2", "--num-steps", "2", "--num-warmup", "0",
                    "--out", str(paths["naive_ddp"])], mpi_comm=MPI.COMM_SELF) == 0
    from benchmarks import parallelism as bp
    rows = [bp.measure(MPI.COMM_SELF, "mpi", "tiny", layout, steps=2, warmup=0, batch=2, context=8, micro=1)
            for layout in ("ddp", "zero3")]
    results.write_dump(paths["parallelism"], "parallelism", rows, world_size=1, backends=["mpi"])
    rows, sps, sides = _torch_compare_rows()
    results.write_dump(paths["torch_compare"], "torch_compare", rows, world_size=1, backends=["mpi", "ring"],
                       raw={"samples_per_s": sps}, attrs={"sides": [s.label for s in sides]})
    return paths
