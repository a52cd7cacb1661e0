"""Serial tests of the benchmark helpers: size units, the alpha-beta fit and the DDP projection."""

import math

import numpy as np
import pytest

from benchmarks import _common as bc


@pytest.mark.parametrize("text, value", [("8", 8), ("1K", 1024), ("64m", 64 << 20), ("1G", 1 << 30),
                                         (" 3 K ", 3072), ("0", 0)])
def test_parse_size_uses_binary_multiples(text, value):
    assert bc.parse_size(text) == value


@pytest.mark.parametrize("text, value", [("1M", 10**6), ("350M", 350 * 10**6), ("25k", 25_000), ("7", 7)])
def test_parse_count_uses_decimal_multiples(text, value):
    assert bc.parse_count(text) == value


@pytest.mark.parametrize("bad", ["", "K", "1.5M", "-8", "8X", "1MB", "one"])
def test_parse_size_rejects_bad_text(bad):
    with pytest.raises(ValueError, match="bad size"):
        bc.parse_size(bad)


def test_format_size_and_count_roundtrip():
    for n in [1, 8, 1000, 1024, 1536, 4096, 3 << 20, 256 << 20, 1 << 30, 5 << 40]:
        assert bc.parse_size(bc.format_size(n)) == n
    assert [bc.format_size(n) for n in (8, 4096, 3 << 20, 1536)] == ["8", "4K", "3M", "1536"]
    assert [bc.format_count(n) for n in (999, 1500, 25 * 10**6, 350 * 10**6)] == ["999", "1.5K", "25M", "350M"]


def test_busbw_factor_and_ring_steps():
    for n in range(1, 9):
        assert bc.busbw_factor("allreduce", n) == pytest.approx(2 * (n - 1) / n)
        assert bc.busbw_factor("allgather", n) == bc.busbw_factor("reduce_scatter", n) == pytest.approx((n - 1) / n)
        assert bc.busbw_factor("broadcast", n) == 1.0
        assert bc.ring_steps("allreduce", n) == 2 * (n - 1)
        assert bc.ring_steps("reduce_scatter", n) == bc.ring_steps("allgather", n) == n - 1
    with pytest.raises(ValueError, match="unknown collective 'alltoall'"):
        bc.busbw_factor("alltoall", 2)
    with pytest.raises(ValueError, match="world size"):
        bc.ring_steps("allreduce", 0)


SIZES = 2.0 ** np.arange(3, 27, 2)  # 8 B .. 64 MiB


@pytest.mark.parametrize("collective", bc.COLLECTIVES)
def test_fit_recovers_alpha_and_beta_exactly(collective):
    for n in (2, 3, 8, 64):
        for alpha, beta in [(1e-6, 25e9), (5e-5, 1.25e9), (3e-7, 4e9)]:
            times = bc.model_time(SIZES, collective, n, alpha, beta)
            fit = bc.fit_alpha_beta(SIZES, times, collective, n)
            assert fit.alpha == pytest.approx(alpha, rel=1e-8)
            assert fit.beta == pytest.approx(beta, rel=1e-8)
            assert fit.rel_rms < 1e-10


def test_fit_weights_relative_error_so_noise_costs_a_few_percent():
    rng = np.random.default_rng(0)
    for seed in range(5):
        times = bc.model_time(SIZES, "allreduce", 4, 8e-6, 3e9) * rng.lognormal(0.0, 0.02, SIZES.size)
        fit = bc.fit_alpha_beta(SIZES, times, "allreduce", 4)
        assert fit.alpha == pytest.approx(8e-6, rel=0.05), seed
        assert fit.beta == pytest.approx(3e9, rel=0.05), seed
        assert 0.005 < fit.rel_rms < 0.05


def test_fit_keeps_alpha_and_inverse_beta_non_negative():
    pure_bandwidth = bc.model_time(SIZES, "allreduce", 2, 0.0, 2e9) * np.where(np.arange(SIZES.size) % 2, 1.01, 0.99)
    fit = bc.fit_alpha_beta(SIZES, pure_bandwidth, "allreduce", 2)
    assert fit.alpha >= 0 and fit.beta == pytest.approx(2e9, rel=0.02)
    flat = np.full(SIZES.size, 1e-3) * np.where(np.arange(SIZES.size) < 6, 1.05, 1.0)  # slower when smaller
    fit = bc.fit_alpha_beta(SIZES, flat, "allreduce", 3)
    assert fit.beta == math.inf and fit.alpha == pytest.approx(1e-3 / 4, rel=0.05)


def test_fit_ignores_missing_times_and_rejects_what_it_cannot_fit():
    times = bc.model_time(SIZES, "allreduce", 2, 2e-6, 5e9)
    times[3] = np.nan
    assert bc.fit_alpha_beta(SIZES, times, "allreduce", 2).alpha == pytest.approx(2e-6, rel=1e-8)
    with pytest.raises(ValueError, match="world size >= 2"):
        bc.fit_alpha_beta(SIZES, times, "allreduce", 1)
    with pytest.raises(ValueError, match="two distinct sizes"):
        bc.fit_alpha_beta([8, 8], [1e-6, 1e-6], "allreduce", 2)
    with pytest.raises(ValueError, match="differ in length"):
        bc.fit_alpha_beta(SIZES, times[:-1], "allreduce", 2)


def test_projection_matches_hand_computed_numbers():
    rate = 4e-9  # s per parameter per step: 100 ms for 25M parameters
    rows = bc.project_ddp([25_000_000, 1_000_000], [8, 2], rate)
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
    one = bc.project_ddp([25 * 10**6], [64], 0.0, networks=bc.NETWORKS[:1], bucket_bytes=1 << 40)[0]
    many = bc.project_ddp([25 * 10**6], [64], 0.0, networks=bc.NETWORKS[:1], bucket_bytes=10**6)[0]
    assert (one.buckets, many.buckets) == (1, 100)
    assert many.comm - one.comm == pytest.approx(99 * 2 * 63 * 50e-6)
    assert one.efficiency_serial == 0.0
    with pytest.raises(ValueError):
        bc.project_ddp([10**6], [2], -1.0)
