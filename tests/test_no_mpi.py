"""With the TCP transport nothing needs mpi4py: jobs run where it cannot be imported at all.

Each test puts a stand-in ``mpi4py`` package first on ``PYTHONPATH`` whose import fails, the
way it fails on a machine without MPI, then runs a job under ``python -m npddp.run``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

JOB = """
import sys
import numpy as np
import npddp, npddp.parallel.ddp, npddp.nn, npddp.optim, npddp.data, npddp.comm
from npddp.comm import create
for name in sys.argv[1:]:
    comm = create(name)
    x = np.full(1000, comm.rank + 1.0)
    comm.allreduce(x)
    assert (x == comm.size * (comm.size + 1) / 2).all(), name
    assert comm.transport.name == "tcp"
assert "mpi4py.MPI" not in sys.modules and "mpi4py" not in sys.modules
sys.stdout.write(f"rank {comm.rank} ok without mpi4py\\n")   # one write: ranks share the pipe
"""


@pytest.fixture
def no_mpi4py(tmp_path):
    """An environment in which ``import mpi4py`` fails."""
    fake = tmp_path / "fake" / "mpi4py"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("mpi4py is not installed (made unimportable by the test)")\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "OMPI_", "HYDRA_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(fake.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def test_the_stand_in_really_blocks_mpi4py(no_mpi4py):
    done = subprocess.run([sys.executable, "-c", "import mpi4py"], env=no_mpi4py, capture_output=True, text=True)
    assert done.returncode == 1 and "made unimportable by the test" in done.stderr


def test_every_hand_written_backend_runs_over_tcp_without_mpi4py(no_mpi4py, tmp_path):
    from npddp.comm import BACKENDS
    script = tmp_path / "job.py"
    script.write_text(JOB)
    names = [b for b in BACKENDS if b != "mpi"]
    done = subprocess.run([sys.executable, "-m", "npddp.run", "--nproc", "2", str(script), *names],
                          env=no_mpi4py, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["rank 0 ok without mpi4py", "rank 1 ok without mpi4py"]


def test_the_training_cli_runs_under_npddp_run_without_mpi4py(no_mpi4py, tmp_path):
    """Train, checkpoint and print a header over TCP where mpi4py cannot even be imported."""
    env = {**no_mpi4py, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "npddp.run", "--nproc", "2", "-m", "npddp.train",
                           "--backend", "auto", "--train-samples", "256", "--val-samples", "64",
                           "--batch-size", "32", "--hidden", "16", "--epochs", "1", "--checkpoint", "c.h5"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "npddp.train: 2 ranks, backend auto over tcp, TCP sockets, no MPI"
    assert "; auto picks " in lines[3] and lines[-1].startswith("done: epoch 1/1, step 8,")
    assert (tmp_path / "c.h5").stat().st_size > 0


@pytest.mark.slow
def test_the_mpi_backend_under_npddp_run_is_one_line_naming_the_backends_that_work(no_mpi4py, tmp_path):
    done = subprocess.run([sys.executable, "-m", "npddp.run", "--nproc", "2", "-m", "npddp.train", "--backend", "mpi"],
                          cwd=tmp_path, env=no_mpi4py, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: --backend mpi runs MPI's own collectives, which a job over TCP (--transport auto "
                      "chose tcp: no MPI launcher started it) does not have; use a hand-written backend, e.g. "
                      "--backend ring or --backend auto"]


@pytest.fixture(params=["import", "library"])
def without_mpi(request, no_mpi4py, tmp_path):
    """No MPI: mpi4py missing (``import``), or present without an MPI library (``library``, as without the extra)."""
    if request.param == "library":   # mpi4py imports, loading the MPI library fails as it does without the mpich extra
        (tmp_path / "fake" / "mpi4py" / "__init__.py").write_text("")
        (tmp_path / "fake" / "mpi4py" / "MPI.py").write_text(
            'raise RuntimeError("cannot load MPI library\\n/usr/lib/libmpi.so: cannot open shared object file")\n')
    return {**no_mpi4py, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


TINY_RUN = ["--train-samples", "256", "--val-samples", "64", "--batch-size", "32", "--hidden", "16", "--epochs", "1"]


def test_one_process_without_mpi_trains_and_runs_a_plain_script(without_mpi, tmp_path):
    """No launcher, no MPI: a world of one over tcp; backend mpi is refused in one line, as under npddp.run."""
    script = tmp_path / "mine.py"
    script.write_text("import numpy as np\nfrom npddp.comm import create\ncomm = create('ring')\nx = np.arange(5.0)\n"
                      "comm.allreduce(x)\nassert comm.size == 1 and x.tolist() == [0, 1, 2, 3, 4]\n"
                      "try:\n    create('mpi')\nexcept ValueError as exc:\n    print('refused', exc)\n"
                      "print('ok', comm.size, comm.transport.name)\n")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=without_mpi, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.endswith("ok 1 tcp\n"), done.stderr
    assert done.stdout.startswith("refused backend 'mpi' runs MPI's own collectives") and "no MPI here" in done.stdout
    done = subprocess.run([sys.executable, "-m", "npddp.train", *TINY_RUN], cwd=tmp_path, env=without_mpi,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("npddp.train: 1 rank, backend auto over tcp (default: no MPI here, mpi4py"), lines[0]
    assert lines[-1].startswith("done: epoch 1/1, step 8,"), done.stdout


@pytest.mark.parametrize("command", [["npddp.train", *TINY_RUN, "--backend", "mpi"],
                                     ["npddp.check", "--backend", "mpi"]])
def test_backend_mpi_without_mpi_is_one_line_and_exit_2(without_mpi, tmp_path, command):
    """Before: ``npddp.train --backend mpi`` printed ``backend mpi over tcp`` and trained, ``npddp.check`` passed."""
    done = subprocess.run([sys.executable, "-m", *command], cwd=tmp_path, env=without_mpi, capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout) == (2, ""), done.stdout + done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("error: "), done.stderr
    assert "--backend mpi" in done.stderr or "backend 'mpi'" in done.stderr
    assert "no MPI here, mpi4py" in done.stderr or "(no MPI here: mpi4py" in done.stderr


def test_the_cannot_load_mpi_line_keeps_whole_paths():
    from npddp.process.job import mpi_load_detail
    paths = [f"/very/long/site-packages/mpi4py/../lib{i}/libmpi.so.12: cannot open shared object file" for i in range(9)]
    detail = mpi_load_detail("cannot load MPI library\n" + "\n".join(paths))
    shown = detail.split(" (and ")[0].split("; ")
    assert shown and all(p in paths for p in shown), detail           # every path shown whole, none cut
    assert detail.endswith(f" (and {len(paths) - len(shown)} more)") and len(shown) < len(paths)
    assert mpi_load_detail("cannot load MPI library") == "libmpi not found"


def test_the_allreduce_benchmark_says_in_one_line_that_it_needs_mpi4py(no_mpi4py):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-m", "npddp.run", "--nproc", "2",
                           os.path.join(root, "benchmarks", "allreduce.py"), "--backends", "ring"],
                          env=no_mpi4py, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == "", done.stderr
    lines = [line for line in done.stderr.splitlines() if "allreduce.py" in line]
    assert len(lines) == 1 and "mpi4py cannot be imported here" in lines[0], done.stderr
