"""Alpha-beta cost models of collectives, their least-squares fit, and a projection of DDP to big clusters.

A collective on ``n`` ranks moving ``S`` bytes takes ``T = steps * alpha + fraction * S / bandwidth``,
npddp's one cost model (:class:`npddp.comm.engine.cost.Cost` with gamma 0 and beta = 1 / bandwidth, s/byte):
``alpha`` is the per-message latency, ``bandwidth`` the link's bytes/s, ``steps`` the sequential
messages on the critical path and ``fraction`` the multiple of ``S`` the busiest link carries.
An all-reduce algorithm's steps and fraction are its own cost description (the ``cost`` of its
class in ``npddp/comm/algorithms/``, the one ``auto`` and the tuner read too), taken unpipelined:
``p = floor(log2 n)``, ``f`` = 1 when n is not a power of two (the fold), ``d = ceil(log2 n)``:

==============  ============  ==================  ==============================================
algorithm       steps         fraction            schedule
==============  ============  ==================  ==============================================
ring            2(n-1)        2(n-1)/n            reduce-scatter then all-gather around a ring
naive           2(n-1)        2(n-1)              gather to rank 0, reduce, send to every rank
rd              p + 2f        p + 2f              recursive doubling: whole buffer each round
rabenseifner    2p + 2f       2(p-1)/p + 2f       recursive halving, then doubling
tree            2d            2d                  binomial reduce, then binomial broadcast
==============  ============  ==================  ==============================================

Other collectives use the ring (chain for broadcast): reduce-scatter and all-gather n-1 steps
and (n-1)/n, broadcast n-1 steps and 1. An algorithm without a model here (e.g. ``mpi``, whose
schedule MPI chooses) is fitted with the ring's shape and left out of projections.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from benchmarks._common import GB, busbw_factor, check_collective
from npddp.comm.engine.cost import Cost
from npddp.comm.algorithms.registry import ALGORITHMS, costed
from npddp.comm.algorithms.registry import algorithm as algorithm_class


#: All-reduce algorithms with a cost description (the hand-written ones over messages).
ALLREDUCE_MODELS = tuple(ALGORITHMS)


def terms(collective: str, n: int, algorithm: str = "ring") -> tuple[float, float]:
    """(steps, fraction) of ``algorithm`` (ring when it has no model, or for other collectives)."""
    check_collective(collective, n)
    if collective == "allreduce":
        if n == 1:
            return 0, 0.0
        cost = algorithm_class(algorithm if modelled(algorithm) else "ring").cost(1.0, n)
        return cost.steps, cost.sent
    steps = n - 1
    return steps, busbw_factor(collective, n)


def modelled(algorithm: str) -> bool:
    """True if the all-reduce ``algorithm`` has a cost model here."""
    return algorithm in ALLREDUCE_MODELS or algorithm in costed()


def model_time(nbytes, collective: str, n: int, alpha: float, bandwidth: float, calls=1, algorithm: str = "ring"):
    """Alpha-beta time (s) of ``calls`` collectives moving ``nbytes`` in total, by :meth:`Cost.time`.

    ``bandwidth`` is the link's bytes/s (what the fit and the tables report); the model's beta is its
    inverse, seconds per byte (:mod:`npddp.comm.engine.cost`).
    """
    steps, fraction = terms(collective, n, algorithm)
    return Cost(steps=calls * steps, sent=fraction * np.asarray(nbytes), reduced=0.0).time(alpha, 1.0 / bandwidth)


@dataclass(frozen=True)
class Fit:
    """Fitted alpha (s per message) and bandwidth (bytes/s, 1 / beta) with the fit's relative RMS error."""

    alpha: float
    bandwidth: float
    rel_rms: float


def fit_alpha_beta(nbytes, times, collective: str, n: int, algorithm: str = "ring") -> Fit:
    """Least-squares fit of ``times = steps*alpha + fraction*nbytes*beta`` (beta = 1 / bandwidth), weighted by 1/time.

    Minimises the relative error, so small and large messages count alike; alpha and beta
    are kept non-negative (bandwidth = inf when the times show no size dependence). Needs n >= 2
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
    steps, fraction = terms(collective, n, algorithm)
    cols = np.stack([np.full_like(b, steps), fraction * b], axis=1) / t[:, None]  # (sizes, 2)
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
    return Fit(alpha=float(x[0]), bandwidth=float(1.0 / x[1]) if x[1] > 0 else math.inf, rel_rms=err)


# ----------------------------------------------------------------------------- DDP projection

@dataclass(frozen=True)
class Network:
    """An interconnect described by per-message latency (s) and bandwidth (bytes/s)."""

    name: str
    alpha: float
    bandwidth: float


#: Typical published figures, not measurements: per-message latency of an MPI
#: point-to-point exchange and per-link bandwidth.
NETWORKS = (
    Network("10 GbE", alpha=50e-6, bandwidth=1.25 * GB),
    Network("100 GbE", alpha=10e-6, bandwidth=12.5 * GB),
    Network("InfiniBand HDR", alpha=1.5e-6, bandwidth=25.0 * GB),
)


@dataclass(frozen=True)
class Projection:
    """Projected DDP step of one model on ``n`` ranks of one network with one algorithm (seconds)."""

    network: str
    algorithm: str
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
        """Scaling efficiency (compute / step), no overlap."""
        return self.compute / self.step_serial if self.step_serial > 0 else 1.0

    @property
    def efficiency_overlap(self) -> float:
        """Scaling efficiency with perfect overlap."""
        return self.compute / self.step_overlap if self.step_overlap > 0 else 1.0


def project_ddp(params, world_sizes, compute_s_per_param: float, networks=NETWORKS, algorithms=("ring",),
                bytes_per_param: int = 4, bucket_bytes: int = 25 << 20) -> list[Projection]:
    """Project DDP's per-step gradient all-reduce for each network x algorithm x model size x world size.

    Gradients (``params * bytes_per_param`` bytes) go in ``ceil(bytes / bucket_bytes)``
    all-reduces: ``buckets * steps * alpha + fraction * bytes / bandwidth``. Compute per step is
    ``compute_s_per_param * params`` (FLOPs, hence time, scale with parameters at a fixed batch).
    """
    if compute_s_per_param < 0 or bytes_per_param < 1 or bucket_bytes < 1:
        raise ValueError("compute time, bytes per parameter and bucket size must be positive")
    unknown = [a for a in algorithms if not modelled(a)]
    if unknown:
        raise ValueError(f"no cost model for {', '.join(unknown)}; modelled: {', '.join(ALLREDUCE_MODELS)}")
    out = []
    for net in networks:
        for algorithm in algorithms:
            for p in params:
                nbytes = int(p) * bytes_per_param
                buckets = max(1, math.ceil(nbytes / bucket_bytes))
                for n in world_sizes:
                    comm = float(model_time(nbytes, "allreduce", int(n), net.alpha, net.bandwidth, calls=buckets,
                                            algorithm=algorithm))
                    out.append(Projection(net.name, algorithm, int(p), int(n), buckets,
                                          compute_s_per_param * int(p), comm))
    return out
