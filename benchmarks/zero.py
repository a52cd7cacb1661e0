"""ZeRO stages against DDP on a GPT: bytes held per rank (formula and measured), peak resident memory, step time.

    python benchmarks/zero.py --sizes small --ranks 1,2 --stages 0,1,2,3        # the sweep (a few minutes)
    mpirun -n 2 python benchmarks/zero.py --worker --size small --stage 3      # one configuration

Each (ranks, stage) runs in its own ``mpirun`` job, because peak resident memory
(``getrusage``'s ``ru_maxrss``, measured by the operating system) is a high-water mark of a
process. A worker builds the GPT preset (vocabulary 256, ``--context`` tokens, float32), AdamW,
and the stage's engine (0: DDP overlap; 1: DDP + ZeroRedundancyOptimizer; 2, 3:
ZeroDataParallel), then trains ``--warmup`` untimed and ``--steps`` timed steps on
``--batch`` random sequences per rank; a step is as slow as its slowest rank (max over ranks),
rows give the median. Columns: Psi parameters; the issue's formula for bytes of parameters +
gradients + optimizer state per rank (float32 AdamW: DDP 16 Psi, ZeRO-1 8 Psi + 8 Psi/N, ZeRO-2
4 Psi + 12 Psi/N, ZeRO-3 16 Psi/N); what this implementation holds between steps (the formula:
ZeRO-2 keeps gradient shards only, ZeRO-3 builds the model sharded); the peak RSS of the
largest rank; step time and its ratio to stage 0 at the same N (separate jobs, one after
another). ``--paired`` adds, per stage > 0, a job that trains the stage and DDP side by side on
two copies of the model, steps interleaved, and reports the median of the per-step ratios: the
figure to quote for speed on a loaded machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from npddp.parallel.ddp import BUCKET_CAP_MB  # noqa: E402

FORMULA = {0: (16, 0), 1: (8, 8), 2: (4, 12), 3: (0, 16)}   # bytes per parameter: (whole, divided by N)
MARK = "ZERO-BENCH "


def formula_bytes(stage: int, psi: int, n: int) -> float:
    """The issue's per-rank bytes of parameters, gradients and AdamW state (float32)."""
    whole, shared = FORMULA[stage]
    return whole * psi + shared * psi / n


def worker(args) -> None:
    """One configuration under mpirun; rank 0 prints one JSON line."""
    from npddp.comm import create
    from npddp.nn import CrossEntropyLoss, gpt
    from npddp.optim import AdamW
    from npddp.parallel.ddp import DistributedDataParallel
    from npddp.parallel.zero import ShardedInit, ShardedOptimizer, ZeroDataParallel, ZeroRedundancyOptimizer
    from npddp.train.sharding import CheckpointedOptimizer, bytes_per_rank

    comm = create(args.backend)
    vocab = 256
    d_model, d_ff, layers, heads = _preset(args.size)

    def build(stage: int):
        init = ShardedInit(comm) if stage == 3 else None      # ZeRO-3: no rank builds the whole model
        with init or contextlib.nullcontext():
            model = gpt(vocab, args.context, d_model=d_model, num_layers=layers, num_heads=heads, d_ff=d_ff,
                        dtype=np.float32, seed=0)
        if stage >= 2:
            engine = ZeroDataParallel(model, comm, stage=stage, bucket_cap_mb=args.bucket_mb, init=init)
            return model, engine, CheckpointedOptimizer(ShardedOptimizer(engine, AdamW, lr=1e-4), comm)
        engine = DistributedDataParallel(model, comm, bucket_cap_mb=args.bucket_mb)
        return model, engine, (CheckpointedOptimizer(ZeroRedundancyOptimizer(engine.parameters(), AdamW, comm,
                                                                             lr=1e-4), comm)
                               if stage == 1 else AdamW(engine.parameters(), lr=1e-4))

    contenders = [build(args.stage)] + ([build(0)] if args.paired else [])   # paired: DDP beside it
    psi = contenders[0][0].num_parameters()
    rng = np.random.default_rng(comm.rank)
    tokens = rng.integers(0, vocab, size=(args.batch, args.context + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    loss = CrossEntropyLoss()
    times = np.zeros((len(contenders), args.steps))
    for step in range(args.warmup + args.steps):
        order = range(len(contenders)) if step % 2 == 0 else reversed(range(len(contenders)))  # interleaved
        for k in order:
            _, engine, opt = contenders[k]
            comm.barrier()
            t0 = time.perf_counter()
            engine.zero_grad()
            loss.forward(engine(x), y)
            engine.backward(loss.backward())
            engine.step(opt)
            if step >= args.warmup:
                times[k, step - args.warmup] = time.perf_counter() - t0
    _, engine, opt = contenders[0]
    held = bytes_per_rank(args.stage, engine, opt)
    slowest = comm.allreduce(times.reshape(-1), op="max").reshape(times.shape)  # (contenders, steps)
    peak = comm.allreduce(np.array([_peak_rss()], dtype=np.float64), op="max")[0]
    if comm.rank == 0:
        row = {"size": args.size, "ranks": comm.size, "stage": args.stage, "psi": psi,
               "formula_bytes": formula_bytes(args.stage, psi, comm.size),
               "held_bytes": int(sum(held.values())), "held": held, "peak_rss": peak,
               "step_s": float(np.median(slowest[0])), "step_spread_s": float(np.ptp(slowest[0]))}
        if args.paired:
            ratios = slowest[0] / slowest[1]
            row.update(paired=True, ddp_step_s=float(np.median(slowest[1])), ratio=float(np.median(ratios)),
                       ratio_min=float(ratios.min()), ratio_max=float(ratios.max()))
        print(MARK + json.dumps(row), flush=True)


def _preset(size: str):
    from npddp.nn.gpt import PRESETS
    d_model, d_ff, layers, heads = PRESETS[size]
    return d_model, d_ff, layers, heads


def _peak_rss() -> float:
    """Peak resident set size of this process in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


def sweep(args) -> None:
    """Every (size, ranks, stage) in its own mpirun job; a table of the rows."""
    rows = []
    mpirun = shutil.which("mpirun") or str(Path(sys.executable).parent / "mpirun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for _ in range(args.repeats):
        for size in args.sizes.split(","):
            for n in (int(v) for v in args.ranks.split(",")):
                for stage in (int(v) for v in args.stages.split(",")):
                    command = [mpirun, "-n", str(n), sys.executable, str(Path(__file__).resolve()), "--worker",
                               "--size", size, "--stage", str(stage), "--steps", str(args.steps), "--warmup",
                               str(args.warmup), "--batch", str(args.batch), "--context", str(args.context),
                               "--backend", args.backend, "--bucket-mb", str(args.bucket_mb)]
                    for paired in ([False, True] if stage and args.paired else [False]):
                        proc = subprocess.run(command + ["--paired"] * paired, capture_output=True, text=True,
                                              env=env)
                        found = [line[len(MARK):] for line in proc.stdout.splitlines() if line.startswith(MARK)]
                        if proc.returncode or not found:
                            print(f"size {size} N={n} stage {stage}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
                            continue
                        rows.append(json.loads(found[0]))
                        print(_line(rows[-1], rows), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def _line(row: dict, rows: list) -> str:
    if row.get("paired"):
        return (f"{row['size']:6s} N={row['ranks']} zero {row['stage']} beside DDP, interleaved: step "
                f"{row['step_s']:.3f} s vs {row['ddp_step_s']:.3f} s, ratio {row['ratio']:.2f}x (per-step "
                f"{row['ratio_min']:.2f}..{row['ratio_max']:.2f})")
    base = [r for r in rows if r["size"] == row["size"] and r["ranks"] == row["ranks"] and r["stage"] == 0]
    ratio = (f"{row['step_s'] / base[-1]['step_s']:.2f}x step, {row['peak_rss'] / base[-1]['peak_rss']:.2f}x RSS "
             "vs DDP" if base else "")
    mib = 2.0 ** 20
    return (f"{row['size']:6s} N={row['ranks']} zero {row['stage']}: Psi {row['psi'] / 1e6:.1f} M, formula "
            f"{row['formula_bytes'] / mib:8.1f} MiB, held {row['held_bytes'] / mib:8.1f} MiB, peak RSS "
            f"{row['peak_rss'] / mib:8.1f} MiB, step {row['step_s']:.3f} s (spread {row['step_spread_s']:.3f}) "
            + ratio)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--worker", action="store_true", help="run one configuration (under mpirun)")
    p.add_argument("--size", default="small", help="worker: GPT preset")
    p.add_argument("--stage", type=int, default=0, choices=(0, 1, 2, 3), help="worker: ZeRO stage (0: DDP)")
    p.add_argument("--sizes", default="small", help="sweep: GPT presets, comma-separated")
    p.add_argument("--ranks", default="1,2", help="sweep: world sizes, comma-separated")
    p.add_argument("--stages", default="0,1,2,3", help="sweep: stages, comma-separated")
    p.add_argument("--repeats", type=int, default=1, help="sweep: passes over every configuration")
    p.add_argument("--steps", type=int, default=3, help="timed steps")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    p.add_argument("--batch", type=int, default=2, help="sequences per rank")
    p.add_argument("--context", type=int, default=64, help="tokens per sequence")
    p.add_argument("--backend", default="ring", help="communicator backend")
    p.add_argument("--bucket-mb", type=float, default=BUCKET_CAP_MB, help="bucket / group cap in MiB")
    p.add_argument("--json", default=None, help="sweep: also write the rows to this JSON file")
    p.add_argument("--paired", action="store_true",
                   help="time the stage against DDP in the same job, steps interleaved (memory columns then "
                        "count both); the sweep adds one such run per stage > 0")
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
    else:
        sweep(args)


if __name__ == "__main__":
    main()
