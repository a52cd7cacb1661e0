"""Comm hooks side by side: PowerSGD rank 1 and 4 against plain all-reduce, same model, same steps.

    mpirun -n 2 python benchmarks/hooks.py                               # the MLP and a tiny GPT
    mpirun -n 2 python benchmarks/hooks.py --models mlp --steps 60 --hooks allreduce,powersgd1,fp16
    python -m npddp.run --nproc 2 benchmarks/hooks.py --backend ring      # over TCP, no MPI

Each combination is one run of the training CLI (``npddp.train``, in this process) for one
epoch of exactly ``--steps`` steps from the same seed, then validation: ``mlp`` is the 5-layer
1024-wide MLP (4.3 M parameters) on the synthetic classification set, ``gpt`` the ``tiny`` GPT
preset on synthetic tokens. Rank 0 reads each run's metrics file and prints, per combination:
bytes this rank handed to collectives per step once PowerSGD has started (the median over
those steps; ``--powersgd-start-iter`` steps of plain all-reduce come first), the median step
time, and the validation loss and accuracy after the same steps. Runs follow one another, so
step times carry the machine's drift; the bytes and the losses do not depend on timing.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse  # noqa: E402

import numpy as np  # noqa: E402

from npddp.util.atomicfile import target_problem  # noqa: E402

#: Hook choices: name -> the training CLI's flags.
HOOKS = {"allreduce": ["--comm-hook", "allreduce"], "fp16": ["--comm-hook", "fp16"],
         "topk": ["--comm-hook", "topk", "--topk-ratio", "0.01"],
         "powersgd1": ["--comm-hook", "powersgd", "--powersgd-rank", "1"],
         "powersgd4": ["--comm-hook", "powersgd", "--powersgd-rank", "4"]}
#: Model choices: name -> (flags, global batch).
MODELS = {"mlp": (["--hidden", "1024", "1024", "1024", "1024", "1024"], 96),
          "gpt": (["--model", "gpt", "--model-size", "tiny", "--optimizer", "adamw", "--lr", "1e-3"], 16)}


def parse_args(argv=None) -> argparse.Namespace:
    """The options."""
    p = argparse.ArgumentParser(prog="hooks.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="mlp,gpt", help=f"comma-separated: {', '.join(MODELS)} (default mlp,gpt)")
    p.add_argument("--hooks", default="allreduce,powersgd1,powersgd4",
                   help=f"comma-separated: {', '.join(HOOKS)} (default allreduce,powersgd1,powersgd4)")
    p.add_argument("--steps", type=int, default=40, help="training steps (one epoch) per run (default 40)")
    p.add_argument("--powersgd-start-iter", type=int, default=10, help="plain steps before PowerSGD (default 10)")
    p.add_argument("--backend", default="mpi", help="communication backend (default mpi)")
    p.add_argument("--csv", default="", help="write the table as CSV here (rank 0)")
    a = p.parse_args(argv)
    for what, valid in (("models", MODELS), ("hooks", HOOKS)):
        bad = [n for n in getattr(a, what).split(",") if n not in valid]
        if bad:
            p.error(f"--{what}: unknown {bad[0]!r}; valid: {', '.join(valid)}")
    if a.steps <= a.powersgd_start_iter:
        p.error(f"--steps {a.steps} must exceed --powersgd-start-iter {a.powersgd_start_iter}")
    problem = a.csv and target_problem(f"--csv {a.csv!r}", a.csv)
    if problem:  # checked before any run: a FIFO or a device is never opened, a missing folder is named
        p.error(problem)
    return a


def run_one(model: str, hook: str, a, metrics: str) -> int:
    """Train one combination; the CLI's exit status."""
    from npddp.train.cli.main import train
    flags, batch = MODELS[model]
    argv = [*flags, *HOOKS[hook], "--backend", a.backend, "--epochs", "1", "--batch-size", str(batch),
            "--train-samples", str(batch * a.steps), "--val-samples", "1024", "--seed", "0",
            "--powersgd-start-iter", str(a.powersgd_start_iter), "--metrics", metrics, "--progress", "none",
            "--quiet"]
    return train(argv)


def summarize(metrics: str, start: int) -> dict:
    """Bytes per step after ``start``, median step time, validation loss and accuracy of one metrics file."""
    import h5py
    with h5py.File(metrics, "r") as f:
        steps = {k: f["steps"][k][:] for k in f["steps"]}
        epochs = {k: f["epochs"][k][:] for k in f["epochs"]}
        params = int(f.attrs["parameters"])
    later = steps["step"] > start
    return {"params": params, "bytes_per_step": float(np.median(steps["comm_bytes"][later])),
            "step_ms": float(np.median(steps["step_s"][later]) * 1e3),
            "val_loss": float(epochs["val_loss"][-1]), "val_acc": float(epochs["val_acc"][-1])}


def main(argv=None) -> int:
    """Run every model x hook; rank 0 prints the table."""
    a = parse_args(argv)
    from npddp.util import env
    rank = env.world_rank()
    rows = []
    with tempfile.TemporaryDirectory(prefix="npddp-hooks-") as tmp:
        for model in a.models.split(","):
            for hook in a.hooks.split(","):
                path = str(Path(tmp) / f"{model}-{hook}.h5")
                code = run_one(model, hook, a, path)
                if code:
                    return code
                if rank == 0:
                    rows.append({"model": model, "hook": hook, **summarize(path, a.powersgd_start_iter)})
    if rank == 0:
        base = {r["model"]: r["bytes_per_step"] for r in rows if r["hook"] == "allreduce"}
        print(f"# hooks.py: {a.steps} steps, PowerSGD from step {a.powersgd_start_iter + 1}, backend {a.backend}; "
              "bytes: per rank per step after that (median)")
        print(f"{'model':>5} {'params':>10} {'hook':>10} {'bytes/step':>12} {'vs allreduce':>12} {'step_ms':>8} "
              f"{'val_loss':>9} {'val_acc':>8}")
        for r in rows:
            ratio = r["bytes_per_step"] / base[r["model"]] if base.get(r["model"]) else float("nan")
            print(f"{r['model']:>5} {r['params']:>10,} {r['hook']:>10} {r['bytes_per_step']:>12,.0f} {ratio:>12.4f} "
                  f"{r['step_ms']:>8.1f} {r['val_loss']:>9.4f} {r['val_acc']:>8.3f}")
        if a.csv:
            with open(a.csv, "w") as f:
                f.write(",".join(rows[0]) + "\n")
                f.writelines(",".join(str(v) for v in r.values()) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
