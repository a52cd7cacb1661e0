"""A user's own DDP script under plain ``mpirun``: its speed with no thread variables set vs ``OMP_NUM_THREADS=1``.

    python benchmarks/library_threads.py                    # 2 ranks, 5 interleaved rounds
    python benchmarks/library_threads.py --ranks 4 --rounds 3 --steps 40

The script (this file with ``--worker``) is what a user writes: ``create("ring")``, an MLP in
``DistributedDataParallel``, SGD steps; it sets no threads itself. The first ``create`` gives
each rank its share of the node's cores for BLAS (:mod:`npddp.util.guard`) unless a thread
variable is set. Three environments take turns, ``--rounds`` times each:

* ``none``: no thread variable set (the library's share applies);
* ``omp1``: ``OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=MKL_NUM_THREADS=1``, the reference;
* ``off``: no thread variable and ``NPDDP_THREADS=off``: BLAS's own default, as before the library did this.

Printed: the median seconds of the timed steps (rank 0, after a barrier) for each, and the
ratios none/omp1 (target <= 1.2) and off/omp1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from npddp.util import variables

VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
CASES = ("none", "omp1", "off")


def worker(steps: int, warmup: int, batch: int) -> None:
    """The user's script: DDP steps on random data; rank 0 prints ``SECONDS <timed steps>``."""
    import numpy as np

    from npddp.comm import create
    from npddp.nn import CrossEntropyLoss, mlp
    from npddp.optim import SGD
    from npddp.parallel.ddp import DistributedDataParallel

    comm = create("ring")
    model = DistributedDataParallel(mlp(512, [1024, 1024], 10, seed=0), comm)
    opt, loss_fn = SGD(model.parameters(), lr=0.01), CrossEntropyLoss()
    rng = np.random.default_rng(comm.rank)
    x, y = rng.standard_normal((batch, 512)).astype(np.float32), rng.integers(0, 10, batch)
    for step in range(warmup + steps):
        if step == warmup:
            comm.barrier()
            t0 = time.perf_counter()
        model.zero_grad()
        loss_fn.forward(model(x), y)
        model.backward(loss_fn.backward())
        model.step(opt)
    comm.barrier()
    if comm.rank == 0:
        print(f"SECONDS {time.perf_counter() - t0:.6f}", flush=True)


def environment(case: str) -> dict:
    """The job's environment for ``case``, without an enclosing job's launcher variables."""
    skip = ("PMI_", "PMIX_", "HYDRA_", "MPIR_", "OMPI_", variables.PREFIX)
    env = {k: v for k, v in os.environ.items() if not k.startswith(skip) and k not in VARIABLES
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    if case == "omp1":
        env.update({v: "1" for v in VARIABLES})
    if case == "off":
        env[variables.THREADS.name] = "off"
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def run_once(mpirun: str, case: str, args) -> float:
    """Seconds of the timed steps of one job."""
    command = [mpirun, "-n", str(args.ranks), sys.executable, str(Path(__file__).resolve()), "--worker",
               "--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch)]
    done = subprocess.run(command, env=environment(case), capture_output=True, text=True, timeout=600)
    if done.returncode:
        sys.exit(f"library_threads.py: the {case} job failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return float(next(line.split()[1] for line in done.stdout.splitlines() if line.startswith("SECONDS")))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/library_threads.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2, help="ranks of the mpirun job (default 2)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the three environments (default 5)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per job (default 30)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument("--batch", type=int, default=128, help="rows per rank per step (default 128)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("ranks", "rounds", "steps", "batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.worker:
        worker(args.steps, args.warmup, args.batch)
        return 0
    mpirun = shutil.which("mpirun", path=os.path.dirname(sys.executable)) or shutil.which("mpirun")
    if not mpirun:
        p.error("no mpirun found beside this Python or on PATH")
    print(f"# a user's DDP script (MLP 512-1024-1024-10, batch {args.batch} per rank, {args.steps} steps) under "
          f"mpirun -n {args.ranks} on {os.cpu_count()} CPUs; {args.rounds} interleaved rounds", flush=True)
    times: dict[str, list[float]] = {case: [] for case in CASES}
    for r in range(args.rounds):
        for case in (CASES if r % 2 == 0 else CASES[::-1]):
            times[case].append(run_once(mpirun, case, args))
        print(f"# round {r + 1}/{args.rounds}: " + ", ".join(f"{c} {times[c][-1]:.2f} s" for c in CASES), flush=True)
    median = {case: statistics.median(v) for case, v in times.items()}
    for case in CASES:
        print(f"{case:5s} median {median[case]:.3f} s  (min {min(times[case]):.3f}, max {max(times[case]):.3f})")
    print(f"ratio none/omp1 {median['none'] / median['omp1']:.2f}x (target <= 1.2)   "
          f"off/omp1 {median['off'] / median['omp1']:.2f}x (BLAS's own default)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
