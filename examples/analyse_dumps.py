"""Analysing benchmark dumps from anywhere npddp is installed: a notebook in ``# %%`` cells.

    python examples/analyse_dumps.py             # makes a small all-reduce dump first (needs this checkout)
    python examples/analyse_dumps.py ar.h5       # reads a dump of any kind, from any directory

Open it in Jupyter (jupytext), VS Code or Spyder to run cell by cell. ``read_table`` checks the
file against its kind's declared columns first and gives a pandas DataFrame, or a dict of
NumPy arrays when pandas is not installed; the cells below work with either.
"""

# %% Which dump: the one named on the command line, or a small sweep made now
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from npddp.results import read_meta, read_table

if len(sys.argv) > 1:
    path = Path(sys.argv[1])
else:
    sweep = Path(__file__).resolve().parents[1] / "benchmarks" / "allreduce.py"
    if not sweep.exists():
        sys.exit("error: give a dump to read (this copy of the example has no benchmarks/ beside it to make one)")
    path = Path(tempfile.mkdtemp(prefix="dumps-")) / "ar.h5"                 # kept: read it again later
    mpirun = shutil.which("mpirun", path=os.path.dirname(sys.executable)) or "mpirun"   # the venv's MPICH first
    subprocess.run([mpirun, "-n", "2", sys.executable, str(sweep), "--backends", "mpi,ring,tree", "-b", "1K",
                    "-e", "64K", "-f", "8", "--iters", "5", "--warmup", "1", "--budget", "0.2", "--out", str(path)],
                   check=True, stdout=subprocess.DEVNULL)
    print(f"made {path}")

# %% What was measured, where and when (the root attributes)
meta = read_meta(path)
print(f"{path.name}: {meta['kind']} on {meta['world_size']} rank(s), host {meta.get('host')}, "
      f"{meta.get('time_utc')}, npddp {meta.get('npddp_version', '?')}")

# %% The table: one row per measurement, columns in their declared order
table = read_table(path)
columns = {name: np.asarray(table[name]) for name in table}     # DataFrame or dict alike
print(f"{len(next(iter(columns.values())))} rows; columns: {', '.join(columns)}")

# %% An all-reduce sweep: median time (us) per size and backend; any other kind: its first rows
if meta["kind"] == "allreduce_sweep":
    backends = sorted(set(columns["backend"]))
    sizes = sorted(set(columns["bytes"].tolist()))
    print(f"{'bytes':>10} " + " ".join(f"{b:>10}" for b in backends))
    for size in sizes:
        cells = []
        for b in backends:
            rows = (columns["bytes"] == size) & (columns["backend"] == b)
            cells.append(f"{1e6 * np.median(columns['time_median_s'][rows]):10.1f}" if rows.any() else f"{'-':>10}")
        print(f"{size:>10} " + " ".join(cells))
else:
    for i in range(min(5, len(next(iter(columns.values()))))):
        print({name: values[i].item() if hasattr(values[i], "item") else values[i] for name, values in columns.items()})

# %% With pandas the same in one line (skipped without it)
try:
    import pandas  # noqa: F401
except ImportError:
    print("(pandas not installed: the dict of arrays above is what read_table gives)")
else:
    if meta["kind"] == "allreduce_sweep":
        print(table.pivot_table(index="bytes", columns="backend", values="busbw_GBps"))
