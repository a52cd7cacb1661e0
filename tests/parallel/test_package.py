"""``npddp.parallel`` exports DistributedDataParallel, and importing it loads no MPI."""

import subprocess
import sys


def test_ddp_is_importable_from_the_package_without_loading_mpi():
    code = ("import sys; from npddp.parallel import DistributedDataParallel; import npddp.parallel.ddp as d; "
            "assert DistributedDataParallel is d.DistributedDataParallel; "
            "bad = [m for m in sys.modules if m.startswith(('mpi4py', 'npddp.comm'))]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"{out.stdout} {out.stderr}"
