"""The collective sweep under its older name: benchmarks/collectives.py, whose default collective is allreduce.

    mpirun -n 2 python benchmarks/allreduce.py --backends mpi,ring -b 1K -e 64M -f 4 --out ar.h5
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder, so `benchmarks` imports as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

from benchmarks.collectives import main  # noqa: E402
from npddp.process.job import abort_on_exception  # noqa: E402

__all__ = ["main"]

if __name__ == "__main__":
    abort_on_exception()
    sys.exit(main())
