"""Benchmark tests: the repository root on sys.path (the faces under benchmarks/ import as a
package), and a fixture that launches a benchmark script under mpirun."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _mpirun() -> str:
    """The mpirun beside this Python (the virtual environment's), else the one on PATH."""
    found = shutil.which("mpirun", path=os.path.dirname(sys.executable)) or shutil.which("mpirun")
    assert found, "no mpirun found beside the interpreter or on PATH"
    return found


def _child_env() -> dict:
    """This environment without the variables of an enclosing MPI job."""
    skip = ("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_")
    return {k: v for k, v in os.environ.items() if not k.startswith(skip)}


@pytest.fixture
def run_script():
    """``run_script(n, "allreduce.py", *args, cwd=None)``: run benchmarks/<script> on n ranks; CompletedProcess."""
    def run(n: int, script: str, *args: str, cwd=None, timeout: float = 120):
        command = [_mpirun(), "-n", str(n), sys.executable, str(ROOT / "benchmarks" / script), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=_child_env(), cwd=cwd or ROOT)
    return run
