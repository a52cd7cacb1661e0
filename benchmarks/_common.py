"""What the benchmark faces share: size units and the alpha-beta cost model of collectives.

Units: message sizes are bytes with binary suffixes (``1K`` = 1024, as nccl-tests does);
parameter counts use decimal suffixes (``25M`` = 25,000,000); bandwidths are GB/s with
GB = 1e9 bytes.

Cost model: a collective on ``n`` ranks moving ``S`` bytes in a ring takes
``T = steps * alpha + fraction * S / beta``, where ``alpha`` is the per-message latency,
``beta`` the link bandwidth, ``steps`` the number of sequential messages and ``fraction``
the share of ``S`` each rank sends (which is also the nccl-tests bus-bandwidth factor):

=================  ===============  =================
collective         steps            fraction (busbw)
=================  ===============  =================
allreduce          2(n-1)           2(n-1)/n
reduce_scatter     n-1              (n-1)/n
allgather          n-1              (n-1)/n
broadcast          n-1 (a chain)    1
=================  ===============  =================
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass

import numpy as np

GB = 1e9
COLLECTIVES = ("allreduce", "broadcast", "allgather", "reduce_scatter")

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)\s*$", re.IGNORECASE)
_BINARY = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_DECIMAL = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def parse_size(text: str) -> int:
    """Bytes from ``"8"``, ``"1K"``, ``"64M"``, ``"1G"`` (binary multiples); ValueError otherwise."""
    return _parse(text, _BINARY, "size")


def parse_count(text: str) -> int:
    """A count from ``"1M"``, ``"350M"`` (decimal multiples); ValueError otherwise."""
    return _parse(text, _DECIMAL, "count")


def _parse(text: str, table: dict, what: str) -> int:
    """Integer with an optional K/M/G/T suffix scaled by ``table``."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"bad {what} {text!r}; expected an integer with an optional K, M, G or T "
                         "suffix, e.g. 8, 1K, 64M")
    return int(m.group(1)) * table[m.group(2).upper()]


def format_size(nbytes: int) -> str:
    """Short binary size: 8 -> "8", 4096 -> "4K", 3 << 20 -> "3M", 1536 -> "1536"."""
    for suffix in ("T", "G", "M", "K"):
        unit = _BINARY[suffix]
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return str(nbytes)


def format_count(n: int) -> str:
    """Short decimal count: 25_000_000 -> "25M", 1500 -> "1.5K"."""
    for suffix in ("T", "G", "M", "K"):
        unit = _DECIMAL[suffix]
        if n >= unit:
            return f"{n / unit:g}{suffix}"
    return str(n)


def _check_collective(collective: str, n: int) -> None:
    """ValueError for an unknown collective or a world size below 1."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; valid: {', '.join(COLLECTIVES)}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"world size must be an int >= 1, got {n!r}")


def busbw_factor(collective: str, n: int) -> float:
    """Share of the message each rank sends in a ring; busbw = algbw * this factor."""
    _check_collective(collective, n)
    if collective == "allreduce":
        return 2.0 * (n - 1) / n
    if collective == "broadcast":
        return 1.0
    return (n - 1) / n


def ring_steps(collective: str, n: int) -> int:
    """Sequential messages of the ring (chain for broadcast) algorithm on ``n`` ranks."""
    _check_collective(collective, n)
    return 2 * (n - 1) if collective == "allreduce" else n - 1


def model_time(nbytes, collective: str, n: int, alpha: float, beta: float, calls=1):
    """Alpha-beta time (s) of ``calls`` collectives moving ``nbytes`` in total (beta in bytes/s)."""
    return calls * ring_steps(collective, n) * alpha + busbw_factor(collective, n) * np.asarray(nbytes) / beta


@dataclass(frozen=True)
class Fit:
    """Fitted alpha (s per message) and beta (bytes/s) with the fit's relative RMS error."""

    alpha: float
    beta: float
    rel_rms: float


def fit_alpha_beta(nbytes, times, collective: str, n: int) -> Fit:
    """Least-squares fit of ``times = steps*alpha + fraction*nbytes/beta``, weighted by 1/time.

    Minimises the relative error, so small and large messages count alike; alpha and 1/beta
    are kept non-negative (beta = inf when the times show no size dependence). Needs n >= 2
    and at least two distinct sizes with positive times.
    """
    b = np.asarray(nbytes, dtype=np.float64).ravel()
    t = np.asarray(times, dtype=np.float64).ravel()
    if b.shape != t.shape:
        raise ValueError(f"nbytes and times differ in length: {b.size} vs {t.size}")
    keep = np.isfinite(t) & (t > 0)
    b, t = b[keep], t[keep]
    if n < 2:
        raise ValueError(f"the alpha-beta fit needs a world size >= 2 (got {n}): one rank sends nothing")
    if np.unique(b).size < 2:
        raise ValueError("the alpha-beta fit needs at least two distinct sizes with positive times")
    cols = np.stack([np.full_like(b, ring_steps(collective, n)), busbw_factor(collective, n) * b], axis=1) / t[:, None]
    y = np.ones_like(t)  # (model - t) / t = cols @ x - 1
    best = None
    for active in ((0, 1), (0,), (1,)):  # unconstrained, then each non-negative boundary
        a = cols[:, active]
        scale = np.linalg.norm(a, axis=0)
        scale[scale == 0] = 1.0
        sol = np.linalg.lstsq(a / scale, y, rcond=None)[0] / scale
        if np.any(sol < 0):
            continue
        x = np.zeros(2)
        x[list(active)] = sol
        err = float(np.sqrt(np.mean((cols @ x - y) ** 2)))
        if best is None or err < best[1] - 1e-15:
            best = (x, err)
        if len(active) == 2:
            break
    if best is None:
        raise ValueError("the alpha-beta fit found no non-negative solution")
    x, err = best
    return Fit(alpha=float(x[0]), beta=float(1.0 / x[1]) if x[1] > 0 else math.inf, rel_rms=err)


# ----------------------------------------------------------------------------- DDP projection

@dataclass(frozen=True)
class Network:
    """An interconnect described by per-message latency (s) and bandwidth (bytes/s)."""

    name: str
    alpha: float
    beta: float


#: Typical published figures, not measurements: per-message latency of an MPI
#: point-to-point exchange and per-link bandwidth.
NETWORKS = (
    Network("10 GbE", alpha=50e-6, beta=1.25 * GB),
    Network("100 GbE", alpha=10e-6, beta=12.5 * GB),
    Network("InfiniBand HDR", alpha=1.5e-6, beta=25.0 * GB),
)


@dataclass(frozen=True)
class Projection:
    """Projected DDP step of one model on ``n`` ranks of one network (times in seconds)."""

    network: str
    params: int
    n: int
    buckets: int
    compute: float
    comm: float

    @property
    def step_serial(self) -> float:
        """Step time when communication starts after compute (no overlap)."""
        return self.compute + self.comm

    @property
    def step_overlap(self) -> float:
        """Step time when communication hides perfectly behind compute."""
        return max(self.compute, self.comm)

    @property
    def overhead_serial(self) -> float:
        """comm / (comm + compute): share of the step spent communicating, no overlap."""
        return self.comm / self.step_serial if self.step_serial > 0 else 0.0

    @property
    def overhead_overlap(self) -> float:
        """Exposed communication share of the step with perfect overlap."""
        return (self.step_overlap - self.compute) / self.step_overlap if self.step_overlap > 0 else 0.0

    @property
    def efficiency_serial(self) -> float:
        """Scaling efficiency (throughput per rank relative to one rank), no overlap."""
        return self.compute / self.step_serial if self.step_serial > 0 else 1.0

    @property
    def efficiency_overlap(self) -> float:
        """Scaling efficiency with perfect overlap."""
        return self.compute / self.step_overlap if self.step_overlap > 0 else 1.0


def project_ddp(params, world_sizes, compute_s_per_param: float, networks=NETWORKS,
                bytes_per_param: int = 4, bucket_bytes: int = 25 << 20) -> list[Projection]:
    """Project DDP's per-step gradient all-reduce for each network x model size x world size.

    Gradients (``params * bytes_per_param`` bytes) go in ``ceil(bytes / bucket_bytes)``
    ring all-reduces: ``buckets * 2(n-1) * alpha + 2(n-1)/n * bytes / beta``. Compute per
    step is ``compute_s_per_param * params`` (FLOPs, hence time, scale with parameters at a
    fixed batch size).
    """
    if compute_s_per_param < 0 or bytes_per_param < 1 or bucket_bytes < 1:
        raise ValueError("compute time, bytes per parameter and bucket size must be positive")
    out = []
    for net in networks:
        for p in params:
            nbytes = int(p) * bytes_per_param
            buckets = max(1, math.ceil(nbytes / bucket_bytes))
            for n in world_sizes:
                comm = float(model_time(nbytes, "allreduce", int(n), net.alpha, net.beta, calls=buckets))
                out.append(Projection(net.name, int(p), int(n), buckets, compute_s_per_param * int(p), comm))
    return out


class RankParser(argparse.ArgumentParser):
    """ArgumentParser that prints (help, usage, errors) only where ``verbose`` is set."""

    def __init__(self, *args, verbose: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.verbose = verbose

    def _print_message(self, message, file=None):
        if self.verbose:
            super()._print_message(message, file)
