"""Time npddp.nn forward+loss+backward against the same math in bare NumPy, or in PyTorch for the GPT.

    python benchmarks/nn.py                       # MLP and CNN, default batches, 30 repeats
    python benchmarks/nn.py --model mlp --batch 256 --repeats 50
    python benchmarks/nn.py --model gpt           # GPT small, context 256, batch 4 vs PyTorch eager

Models: the MLP 784-1024-1024-1024-10 (batch 128) and the default CNN of the training CLI:
in_shape (1, 28, 28), channels (32, 64), hidden (128,), 10 classes (batch 64).  One training
step is zero_grad, forward, cross-entropy, backward into the gradient buffers; the first layer
computes no input gradient in either version.  The bare version reads the same weights and
accumulates into its own gradient arrays with ``+=``, as the library's contract requires.

GPT (``--model gpt``): the preset ``--gpt-size`` (default small: d_model 768, 12 layers, 12
heads, d_ff 3072) with ``--vocab`` 10000 tokens, ``--context`` 256 and batch 4, tied LM head,
exact GELU, against the same network in PyTorch eager mode built from a copy of its weights
(benchmarks/torch_gpt.py): ``torch`` computes attention with explicit matmuls and a masked
softmax, as npddp does; ``torch-sdpa`` calls PyTorch's fused scaled_dot_product_attention.
Without torch installed only npddp is timed. Loss and gradients are compared first.

Everything runs on one thread: ``npddp.util.threads.set_threads(1)`` caps NumPy's BLAS (and
torch.set_num_threads(1)).  After a warm-up the contenders are timed in
alternating order, ``--repeats`` times each; the median wall time, its interquartile range and
minimum, the median CPU time of the process (steadier on a shared machine) and the ratios
npddp/other of the medians are printed.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run by path: the repository root stands in for this folder, so `benchmarks` imports as a package
    sys.path[0] = str(Path(__file__).resolve().parents[1])

import argparse
import time

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from npddp.nn import PRESETS, CrossEntropyLoss, cnn, gpt_preset, mlp
from npddp.util.threads import set_threads


# --- bare NumPy -----------------------------------------------------------------------
def bare_xent(logits, t):
    """Mean softmax cross-entropy and its gradient."""
    b = logits.shape[0]
    z = logits - logits.max(axis=1, keepdims=True)        # (B, K)
    e = np.exp(z)                                          # (B, K)
    s = e.sum(axis=1)                                      # (B,)
    loss = float((np.log(s) - z[np.arange(b), t]).mean())
    d = e / s[:, None]                                     # (B, K)
    d[np.arange(b), t] -= 1
    d /= b
    return loss, d


def bare_mlp_step(w, g, x, t):
    """Forward, loss and backward of Linear/ReLU layers; ``w``, ``g``: [W1, b1, W2, b2, ...]."""
    for a in g:
        a[...] = 0
    n = len(w) // 2
    acts, pre = [x], []
    for i in range(n):
        h = acts[-1] @ w[2 * i].T                          # (B, out)
        h += w[2 * i + 1]
        if i < n - 1:
            pre.append(h)
            acts.append(np.maximum(h, 0))
        else:
            logits = h
    loss, d = bare_xent(logits, t)
    for i in reversed(range(n)):
        g[2 * i] += d.T @ acts[i]                          # (out, in)
        g[2 * i + 1] += d.sum(axis=0)                      # (out,)
        if i > 0:
            d = (d @ w[2 * i]) * (pre[i - 1] > 0)          # (B, in)
    return loss


def bare_conv(x, wt, b):
    """3x3 conv, padding 1: returns the output and the columns."""
    n, c, h, wd = x.shape
    xp = np.zeros((n, c, h + 2, wd + 2), x.dtype)           # (B, C, H+2, W+2)
    xp[:, :, 1:-1, 1:-1] = x
    cols = np.ascontiguousarray(
        sliding_window_view(xp, (3, 3), axis=(2, 3)).transpose(0, 1, 4, 5, 2, 3))  # (B, C, 3, 3, H, W)
    cols = cols.reshape(n, c * 9, h * wd)                  # (B, K, L)
    y = np.matmul(wt.reshape(wt.shape[0], -1), cols)       # (B, O, L)
    y += b[:, None]
    return y.reshape(n, wt.shape[0], h, wd), cols


def bare_conv_back(d, cols, wt, gw, gb, x_shape):
    """Weight and bias gradients (accumulated); the input gradient if ``x_shape`` is given."""
    n, o = d.shape[:2]
    d3 = d.reshape(n, o, -1)                               # (B, O, L)
    gw += np.matmul(d3, cols.transpose(0, 2, 1)).sum(axis=0).reshape(gw.shape)
    gb += d3.sum(axis=(0, 2))
    if x_shape is None:
        return None
    _, c, h, wd = x_shape
    dc = np.matmul(wt.reshape(o, -1).T, d3).reshape(n, c, 3, 3, h, wd)  # (B, C, 3, 3, H, W)
    dxp = np.zeros((n, c, h + 2, wd + 2), d.dtype)
    for i in range(3):
        for j in range(3):
            dxp[:, :, i:i + h, j:j + wd] += dc[:, :, i, j]
    return dxp[:, :, 1:-1, 1:-1]


def bare_pool(x):
    """2x2 max pool, stride 2."""
    y = x[:, :, 0::2, 0::2].copy()
    for i, j in ((0, 1), (1, 0), (1, 1)):
        np.maximum(y, x[:, :, i::2, j::2], out=y)
    return y


def bare_pool_back(d, x, y):
    """Route each gradient to the first maximum of its window."""
    dx = np.empty_like(x)
    free = None
    for i, j in ((0, 0), (0, 1), (1, 0), (1, 1)):
        if (i, j) == (1, 1):
            hit = free
        else:
            hit = x[:, :, i::2, j::2] == y
            if free is None:
                free = ~hit
            else:
                hit &= free
                free ^= hit
        np.multiply(d, hit, out=dx[:, :, i::2, j::2])
    return dx


def bare_mlp_tail(w, g, x, t):
    """Like bare_mlp_step, but also return dL/dx (without zeroing)."""
    h = x @ w[0].T
    h += w[1]
    a = np.maximum(h, 0)
    logits = a @ w[2].T
    logits += w[3]
    loss, d = bare_xent(logits, t)
    g[2] += d.T @ a
    g[3] += d.sum(axis=0)
    d = (d @ w[2]) * (h > 0)
    g[0] += d.T @ x
    g[1] += d.sum(axis=0)
    return d @ w[0], loss


def bare_cnn_step(w, g, x, t):
    """Two conv stages, then Linear/ReLU head; ``w``: [C1, c1, C2, c2, W1, b1, W2, b2]."""
    for a in g:
        a[...] = 0
    h1, cols1 = bare_conv(x, w[0], w[1])
    r1 = np.maximum(h1, 0)
    p1 = bare_pool(r1)
    h2, cols2 = bare_conv(p1, w[2], w[3])
    r2 = np.maximum(h2, 0)
    p2 = bare_pool(r2)
    f = p2.reshape(p2.shape[0], -1)
    d, loss = bare_mlp_tail(w[4:], g[4:], f, t)
    d = bare_pool_back(d.reshape(p2.shape), r2, p2) * (h2 > 0)
    d = bare_conv_back(d, cols2, w[2], g[2], g[3], p1.shape)
    d = bare_pool_back(d, r1, p1) * (h1 > 0)
    bare_conv_back(d, cols1, w[0], g[0], g[1], None)
    return loss


# --- harness ----------------------------------------------------------------------------
def library_step(model, lossfn, x, t):
    """One zero_grad + forward + loss + backward through npddp.nn."""
    model.zero_grad()
    loss = lossfn.forward(model.forward(x), t)
    model.backward(lossfn.backward())
    return loss


def setup(name, batch, dtype):
    """Model, bare step function, weights, bare gradient arrays and one batch."""
    rng = np.random.default_rng(1)
    if name == "mlp":
        model, bare = mlp(784, (1024, 1024, 1024), 10, dtype=dtype, seed=0), bare_mlp_step
        x = rng.standard_normal((batch, 784)).astype(dtype)
    else:
        model, bare = cnn((1, 28, 28), (32, 64), (128,), 10, dtype=dtype, seed=0), bare_cnn_step
        x = rng.standard_normal((batch, 1, 28, 28)).astype(dtype)
    t = rng.integers(0, 10, batch)
    w = [p.data for p in model.parameters()]
    g = [np.zeros_like(a) for a in w]
    return model, bare, w, g, x, t


def check(model, lossfn, bare, w, g, x, t) -> float:
    """Both versions agree on loss and gradients; returns the largest relative difference."""
    l1 = library_step(model, lossfn, x, t)
    l2 = bare(w, g, x, t)
    worst = abs(l1 - l2) / max(abs(l2), 1e-30)
    for p, gb in zip(model.parameters(), g):
        worst = max(worst, float(np.abs(p.grad - gb).max() / max(np.abs(gb).max(), 1e-30)))
    if worst > 1e-4:
        raise SystemExit(f"npddp and bare NumPy disagree: max relative difference {worst:.3g}")
    return worst


def bench(name, batch, repeats, warmup, dtype):
    """Interleaved timings of both versions; prints one line per version and the ratios."""
    model, bare, w, g, x, t = setup(name, batch, dtype)
    lossfn = CrossEntropyLoss()
    diff = check(model, lossfn, bare, w, g, x, t)
    runs = {"npddp": lambda: library_step(model, lossfn, x, t), "bare": lambda: bare(w, g, x, t)}
    return time_runs(name, batch, runs, repeats, warmup, dtype, diff)


def time_runs(name, batch, runs, repeats, warmup, dtype, diff):
    """Warm up, time ``runs`` interleaved, print a line each and npddp's ratio to every other one."""
    for _ in range(warmup):
        for f in runs.values():
            f()
    wall = {k: [] for k in runs}
    cpu = {k: [] for k in runs}
    order = list(runs)
    for r in range(repeats):
        for k in (order if r % 2 == 0 else order[::-1]):
            t0, c0 = time.perf_counter(), time.process_time()
            runs[k]()
            c1, t1 = time.process_time(), time.perf_counter()
            wall[k].append((t1 - t0) * 1e3)
            cpu[k].append((c1 - c0) * 1e3)
    med = {}
    for k in runs:
        q1, m, q3 = np.percentile(wall[k], [25, 50, 75])
        med[k] = (m, float(np.median(cpu[k])))
        print(f"  {name:4s} {k:10s} batch {batch:4d} {np.dtype(dtype).name}: wall median {m:8.2f} ms "
              f"(IQR {q1:.2f}-{q3:.2f}, min {min(wall[k]):.2f})   cpu median {med[k][1]:8.2f} ms")
    ratio = None
    for other in order[1:]:
        r, cpu_ratio = med["npddp"][0] / med[other][0], med["npddp"][1] / med[other][1]
        ratio = r if ratio is None else ratio
        print(f"  {name:4s} ratio npddp/{other}: wall {r:.3f}, cpu {cpu_ratio:.3f}   "
              f"(gradients agree to {diff:.1e} relative)", flush=True)
    return ratio


# --- GPT against PyTorch ------------------------------------------------------------------
def bench_gpt(size, batch, context, vocab, repeats, warmup, dtype):
    """npddp's GPT step against PyTorch eager (manual attention, and fused SDPA) when torch is there."""
    model = gpt_preset(size, vocab, context, dtype=dtype, seed=0)
    rng = np.random.default_rng(1)
    x, t = rng.integers(0, vocab, (batch, context)), rng.integers(0, vocab, (batch, context))
    lossfn = CrossEntropyLoss()
    print(f"  gpt {size}: {model.num_parameters():,} parameters, vocab {vocab}, context {context}, "
          f"batch {batch} ({batch * context} tokens per step)", flush=True)
    runs = {"npddp": lambda: library_step(model, lossfn, x, t)}
    try:
        import torch
    except ImportError:
        print("  torch is not installed: timing npddp alone (pip install torch==<version> for the comparison)")
        time_runs("gpt", batch, runs, repeats, warmup, dtype, 0.0)
        return None
    from benchmarks import torch_gpt
    torch.set_num_threads(1)
    tx, tt = torch.tensor(x), torch.tensor(t)
    diff = 0.0
    for label, attention in (("torch", "manual"), ("torch-sdpa", "sdpa")):
        tmodel = torch_gpt.build(torch, model, attention=attention)
        runs[label] = _torch_step(torch, tmodel, tx, tt, vocab)
        diff = max(diff, _check_gpt(model, lossfn, x, t, torch_gpt, tmodel, runs[label]))
    return time_runs("gpt", batch, runs, repeats, warmup, dtype, diff)


def _torch_step(torch, tmodel, tx, tt, vocab):
    """One zero_grad + forward + cross-entropy + backward of the torch model; returns the loss."""
    def step():
        tmodel.zero_grad(set_to_none=False)
        loss = torch.nn.functional.cross_entropy(tmodel(tx).view(-1, vocab), tt.view(-1))
        loss.backward()
        return loss.item()
    return step


def _check_gpt(model, lossfn, x, t, torch_gpt, tmodel, torch_step) -> float:
    """Largest relative difference of loss and gradients between npddp and torch (exit if > 1e-3)."""
    ours, theirs = library_step(model, lossfn, x, t), torch_step()
    worst = abs(ours - theirs) / abs(theirs)
    grads = torch_gpt.grads(tmodel)
    for name, p in model.named_parameters():
        worst = max(worst, float(np.abs(p.grad - grads[name]).max() / max(np.abs(grads[name]).max(), 1e-30)))
    if worst > 1e-3:
        raise SystemExit(f"npddp and torch disagree: max relative difference {worst:.3g}")
    return worst


def main(argv=None) -> None:
    set_threads(1)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--model", choices=("mlp", "cnn", "both", "gpt"), default="both",
                    help="both: mlp and cnn against bare NumPy; gpt: against PyTorch")
    ap.add_argument("--batch", type=int, default=None, help="batch size (default: 128 MLP, 64 CNN, 4 GPT)")
    ap.add_argument("--repeats", type=int, default=None, help="timed steps per version (default 30; GPT 5)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps per version first (default 3; GPT 1)")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    ap.add_argument("--gpt-size", choices=tuple(PRESETS), default="small", help="GPT preset (default small)")
    ap.add_argument("--context", type=int, default=256, help="GPT context length (default 256)")
    ap.add_argument("--vocab", type=int, default=10000, help="GPT vocabulary size (default 10000)")
    args = ap.parse_args(argv)
    for name, value, low in (("--batch", args.batch, 1), ("--repeats", args.repeats, 1),
                             ("--warmup", args.warmup, 0), ("--context", args.context, 1),
                             ("--vocab", args.vocab, 2)):
        if value is not None and value < low:
            ap.error(f"{name} must be >= {low}, got {value}")
    dtype = np.dtype(args.dtype).type
    print(f"numpy {np.__version__}, BLAS threads: 1 (threadpoolctl)")
    if args.model == "gpt":
        repeats = args.repeats or 5
        warmup = 1 if args.warmup is None else args.warmup
        bench_gpt(args.gpt_size, args.batch or 4, args.context, args.vocab, repeats, warmup, dtype)
        return
    for name in (("mlp", "cnn") if args.model == "both" else (args.model,)):
        batch = args.batch or {"mlp": 128, "cnn": 64}[name]
        bench(name, batch, args.repeats or 30, 3 if args.warmup is None else args.warmup, dtype)


if __name__ == "__main__":
    main()
