"""Serial tests of benchmarks/_costmodel.py: algorithm cost models, the alpha-beta fit, the DDP projection."""

import math

import numpy as np
import pytest

from benchmarks import _costmodel as cm
from benchmarks.columns import COLLECTIVES

SIZES = 2.0 ** np.arange(3, 27, 2)  # 8 B .. 64 MiB


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_fit_recovers_alpha_and_beta_exactly(collective):
    for n in (2, 3, 8, 64):
        for alpha, beta in [(1e-6, 25e9), (5e-5, 1.25e9), (3e-7, 4e9)]:
            times = cm.model_time(SIZES, collective, n, alpha, beta)
            fit = cm.fit_alpha_beta(SIZES, times, collective, n)
            assert fit.alpha == pytest.approx(alpha, rel=1e-8)
            assert fit.bandwidth == pytest.approx(beta, rel=1e-8)
            assert fit.rel_rms < 1e-10


def test_fit_weights_relative_error_so_noise_costs_a_few_percent():
    rng = np.random.default_rng(0)
    for seed in range(5):
        times = cm.model_time(SIZES, "allreduce", 4, 8e-6, 3e9) * rng.lognormal(0.0, 0.02, SIZES.size)
        fit = cm.fit_alpha_beta(SIZES, times, "allreduce", 4)
        assert fit.alpha == pytest.approx(8e-6, rel=0.05), seed
        assert fit.bandwidth == pytest.approx(3e9, rel=0.05), seed
        assert 0.005 < fit.rel_rms < 0.05


def test_fit_keeps_alpha_and_inverse_beta_non_negative():
    pure_bandwidth = cm.model_time(SIZES, "allreduce", 2, 0.0, 2e9) * np.where(np.arange(SIZES.size) % 2, 1.01, 0.99)
    fit = cm.fit_alpha_beta(SIZES, pure_bandwidth, "allreduce", 2)
    assert fit.alpha >= 0 and fit.bandwidth == pytest.approx(2e9, rel=0.02)
    flat = np.full(SIZES.size, 1e-3) * np.where(np.arange(SIZES.size) < 6, 1.05, 1.0)  # slower when smaller
    fit = cm.fit_alpha_beta(SIZES, flat, "allreduce", 3)
    assert fit.bandwidth == math.inf and fit.alpha == pytest.approx(1e-3 / 4, rel=0.05)


def test_fit_ignores_missing_times_and_rejects_what_it_cannot_fit():
    times = cm.model_time(SIZES, "allreduce", 2, 2e-6, 5e9)
    times[3] = np.nan
    assert cm.fit_alpha_beta(SIZES, times, "allreduce", 2).alpha == pytest.approx(2e-6, rel=1e-8)
    with pytest.raises(ValueError, match="world size >= 2"):
        cm.fit_alpha_beta(SIZES, times, "allreduce", 1)
    with pytest.raises(ValueError, match="two distinct sizes"):
        cm.fit_alpha_beta([8, 8], [1e-6, 1e-6], "allreduce", 2)
    with pytest.raises(ValueError, match="differ in length"):
        cm.fit_alpha_beta(SIZES, times[:-1], "allreduce", 2)


def test_projection_matches_hand_computed_numbers():
    rate = 4e-9  # s per parameter per step: 100 ms for 25M parameters
    rows = cm.project_ddp([25_000_000, 1_000_000], [8, 2], rate)
    assert len(rows) == 3 * 2 * 2
    assert [(r.network, r.params, r.n) for r in rows[:4]] == [
        ("10 GbE", 25_000_000, 8), ("10 GbE", 25_000_000, 2), ("10 GbE", 1_000_000, 8), ("10 GbE", 1_000_000, 2)]
    r = rows[0]  # 1e8 bytes in ceil(1e8 / 25 MiB) = 4 buckets, N = 8, 10 GbE
    assert r.buckets == 4
    assert r.comm == pytest.approx(4 * 14 * 50e-6 + 1.75 * 1e8 / 1.25e9)  # 2.8 ms + 140 ms
    assert r.comm == pytest.approx(0.1428)
    assert r.compute == pytest.approx(0.1)
    assert r.overhead_serial == pytest.approx(0.1428 / 0.2428)
    assert r.efficiency_serial == pytest.approx(0.1 / 0.2428)
    assert r.efficiency_overlap == pytest.approx(0.1 / 0.1428)
    assert r.overhead_overlap == pytest.approx(0.0428 / 0.1428)
    ib = [x for x in rows if x.network == "InfiniBand HDR" and x.params == 1_000_000 and x.n == 2][0]
    assert ib.buckets == 1
    assert ib.comm == pytest.approx(2 * 1.5e-6 + 4e6 / 25e9)  # 163 us
    assert ib.efficiency_serial == pytest.approx(4e-3 / (4e-3 + 163e-6))
    assert ib.efficiency_overlap == 1.0 and ib.overhead_overlap == 0.0


def test_projection_bucket_size_only_changes_the_latency_term():
    one = cm.project_ddp([25 * 10**6], [64], 0.0, networks=cm.NETWORKS[:1], bucket_bytes=1 << 40)[0]
    many = cm.project_ddp([25 * 10**6], [64], 0.0, networks=cm.NETWORKS[:1], bucket_bytes=10**6)[0]
    assert (one.buckets, many.buckets) == (1, 100)
    assert many.comm - one.comm == pytest.approx(99 * 2 * 63 * 50e-6)
    assert one.efficiency_serial == 0.0
    with pytest.raises(ValueError):
        cm.project_ddp([10**6], [2], -1.0)


def test_algorithm_models_match_the_schedules_they_run():
    # d = ceil(log2 n); p = floor(log2 n) active levels and f = 1 fold step in and out when n is not a power of two
    for n, d, p, f in [(1, 0, 0, 0), (2, 1, 1, 0), (4, 2, 2, 0), (8, 3, 3, 0), (5, 3, 2, 1), (6, 3, 2, 1), (1024, 10, 10, 0)]:
        if n == 1:
            assert all(cm.terms("allreduce", 1, a) == (0, 0.0) for a in cm.ALLREDUCE_MODELS)
            continue
        assert cm.terms("allreduce", n, "ring") == (2 * (n - 1), pytest.approx(2 * (n - 1) / n))
        assert cm.terms("allreduce", n, "naive") == (2 * (n - 1), 2.0 * (n - 1))
        assert cm.terms("allreduce", n, "rd") == (p + 2 * f, p + 2 * f)
        assert cm.terms("allreduce", n, "rabenseifner") == (2 * p + 2 * f, pytest.approx(2 * (2**p - 1) / 2**p + 2 * f))
        assert cm.terms("allreduce", n, "tree") == (2 * d, 2 * d)
        assert cm.terms("allreduce", n, "mpi") == cm.terms("allreduce", n, "ring")  # no model: the ring's shape
        assert cm.terms("reduce_scatter", n, "rd") == (n - 1, pytest.approx((n - 1) / n))
    assert [a for a in ("ring", "rd", "mpi", "auto") if cm.modelled(a)] == ["ring", "rd"]


@pytest.mark.parametrize("algorithm", sorted(cm.ALLREDUCE_MODELS))
def test_fit_uses_the_algorithms_own_model(algorithm):
    times = cm.model_time(SIZES, "allreduce", 8, 4e-6, 2e9, algorithm=algorithm)
    fit = cm.fit_alpha_beta(SIZES, times, "allreduce", 8, algorithm=algorithm)
    assert fit.alpha == pytest.approx(4e-6, rel=1e-8) and fit.bandwidth == pytest.approx(2e9, rel=1e-8)


def test_projection_has_one_series_per_algorithm_and_refuses_unmodelled_ones():
    rows = cm.project_ddp([10**7], [2, 64], 1e-9, algorithms=("ring", "tree"))
    assert {(r.network, r.algorithm) for r in rows} == {(net.name, a) for net in cm.NETWORKS for a in ("ring", "tree")}
    at64 = {r.algorithm: r for r in rows if r.n == 64 and r.network == "10 GbE"}
    assert at64["tree"].comm > at64["ring"].comm  # 12 whole-buffer hops against 2 x 63/64 of it
    with pytest.raises(ValueError, match="no cost model for mpi"):
        cm.project_ddp([10**7], [2], 1e-9, algorithms=("ring", "mpi"))
