"""nn/ and optim.py know nothing of MPI: importing them loads neither mpi4py nor npddp.comm."""

import subprocess
import sys


def test_nn_and_optim_import_without_mpi():
    code = ("import sys, npddp.nn, npddp.nn.gradcheck, npddp.optim; "
            "bad = [m for m in sys.modules if m.startswith(('mpi4py', 'npddp.comm', 'npddp.parallel.ddp'))]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"modules loaded: {out.stdout} {out.stderr}"
