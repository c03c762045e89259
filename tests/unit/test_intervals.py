"""adapters/contract/intervals.py: the t quantile, the log-scale intervals, and their coverage at small n."""

from __future__ import annotations

import math

import numpy as np
import pytest

from adapters.contract.intervals import (
    log_mean_interval,
    log_ratio_interval,
    log_ratio_intervals,
    relative_half_width,
    t_quantile,
)

# t tables (e.g. Abramowitz & Stegun table 26.10)
T975 = {1: 12.706205, 2: 4.302653, 4: 2.776445, 9: 2.262157, 30: 2.042272, math.inf: 1.959964}


@pytest.mark.parametrize("df", list(T975))
def test_t_quantile_known_values(df):
    assert t_quantile(0.975, df) == pytest.approx(T975[df], abs=1e-6)
    assert t_quantile(0.025, df) == pytest.approx(-T975[df], abs=1e-6)   # symmetric


def test_t_quantile_closed_forms_and_arrays():
    p = np.array([0.6, 0.9, 0.99, 0.999])
    # df 1 is the Cauchy distribution; df 2 has t = (2p - 1) / sqrt(2p(1 - p))
    assert t_quantile(p, 1) == pytest.approx(np.tan(np.pi * (p - 0.5)), rel=1e-10)
    assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / np.sqrt(2 * p * (1 - p)), rel=1e-10)
    df = np.array([1.5, 2.62, 7.3, 500.0, 5e3, 1e9])   # Welch's dfs are not integers; large df -> normal
    t = t_quantile(0.975, df)
    assert t.shape == df.shape and np.all(np.diff(t) < 0) and t[-1] == pytest.approx(1.959964, abs=1e-6)
    assert t_quantile(0.5, 3) == 0.0 and t_quantile(1.0, 3) == math.inf and math.isnan(t_quantile(0.975, 0))
    assert isinstance(t_quantile(0.975, 4), float)


def test_log_ratio_interval_by_hand():
    a = 0.1
    # the baseline has no spread: Welch's df is the cell's n - 1 = 2, se = sd(log num) / sqrt(3)
    r, lo, hi = log_ratio_interval(2 * np.exp([-a, 0, a]), [1.0, 1.0, 1.0])
    h = 4.302653 * a / math.sqrt(3)
    assert (r, lo, hi) == pytest.approx((2.0, 2 * math.exp(-h), 2 * math.exp(h)), rel=1e-6)
    # equal spread, equal n: df = (2v)^2 / (2 v^2 / 2) = 4, se = sqrt(2 a^2 / 3)
    r, lo, hi = log_ratio_interval(1.5 * np.exp([-a, 0, a]), np.exp([a, 0, -a]))
    h = 2.776445 * math.sqrt(2 * a * a / 3)
    assert (r, lo, hi) == pytest.approx((1.5, 1.5 * math.exp(-h), 1.5 * math.exp(h)), rel=1e-6)
    # unequal n and spread: exp(scipy.stats.ttest_ind(log a, log b, equal_var=False).confidence_interval())
    assert log_ratio_interval([3.0, 3.3], [1.0, 1.1, 0.95, 1.02]) == pytest.approx(
        (3.09662404516583, 2.389320274399594, 4.013308964830512), rel=1e-9)


def test_log_mean_interval_and_relative_half_width():
    c, lo, hi = log_mean_interval(100 * np.exp([-0.1, 0, 0.1]))
    h = 4.302653 * 0.1 / math.sqrt(3)
    assert (c, lo, hi) == pytest.approx((100, 100 * math.exp(-h), 100 * math.exp(h)), rel=1e-6)
    assert relative_half_width(100 * np.exp([-0.1, 0, 0.1])) == pytest.approx(math.exp(h) - 1, rel=1e-6)
    # exp(scipy.stats.ttest_1samp(log x, 0).confidence_interval())
    assert log_mean_interval([98.0, 103, 101, 99])[1:] == pytest.approx((96.77370584673079, 103.81319616853321),
                                                                        rel=1e-9)
    assert relative_half_width([50.0, 50.0, 50.0]) == 0.0
    assert relative_half_width([50.0]) is None and relative_half_width([50.0, 0.0]) is None
    assert relative_half_width([50.0, 52.0], level=0.99) > relative_half_width([50.0, 52.0])


def test_degenerate_cases():
    r, lo, hi = log_ratio_interval([2.0], [1.0, 1.1])             # n = 1: no spread to estimate
    assert r == pytest.approx(2.0 / math.sqrt(1.1), rel=1e-15) and math.isnan(lo) and math.isnan(hi)
    r, lo, hi = log_ratio_interval([3.0, 3.0], [2.0, 2.0, 2.0])   # no spread anywhere: the point
    assert r == pytest.approx(1.5, rel=1e-15) and lo == hi == r
    for bad in ([1.0, 0.0, 1.0], [1.0, -2.0, 1.0], [1.0, math.nan, 1.0], [1.0, math.inf, 1.0]):
        assert all(math.isnan(v) for v in log_ratio_interval(bad, [1.0, 1.1, 0.9]))
        assert all(math.isnan(v) for v in log_ratio_interval([1.0, 1.1, 0.9], bad))
    c, lo, hi = log_mean_interval([7.0])
    assert c == pytest.approx(7.0, rel=1e-15) and math.isnan(lo) and math.isnan(hi)


def test_vectorised_rows_match_single_calls():
    rng = np.random.default_rng(3)
    num, den = np.exp(rng.normal(0.2, 0.1, (50, 3))), np.exp(rng.normal(0, 0.05, (50, 4)))
    num[7, 1] = 0.0
    r, lo, hi = log_ratio_intervals(num, den)
    for i in range(50):
        assert np.allclose(log_ratio_interval(num[i], den[i]), (r[i], lo[i], hi[i]), rtol=1e-12, equal_nan=True)


def _coverage(lo, hi, true):
    return float(np.mean((lo <= true) & (true <= hi)))


def _bootstrap(num, den, rng, resamples=2000):
    """The analysis's former interval: percentiles of mean(num*)/mean(den*) over resampled repeats."""
    pn = rng.integers(0, num.shape[1], (len(num), resamples, num.shape[1]))
    pd_ = rng.integers(0, den.shape[1], (len(den), resamples, den.shape[1]))
    ratio = np.take_along_axis(num[:, None], pn, 2).mean(2) / np.take_along_axis(den[:, None], pd_, 2).mean(2)
    return np.percentile(ratio, [2.5, 97.5], axis=1)


def test_coverage_at_three_repeats():
    # Seeded log-normal throughputs, true ratio 1.2, 3 repeats a side. Welch's interval is slightly
    # conservative here (its df is at most 4; 96.5% over 400k pairs), so 20,000 pairs (binomial sd
    # 0.13 point) keep the 97% edge > 3 sd away; the old percentile bootstrap covers about 81%.
    rng = np.random.default_rng(20240601)
    den = 100 * np.exp(0.1 * rng.standard_normal((20_000, 3)))
    num = 120 * np.exp(0.1 * rng.standard_normal((20_000, 3)))
    _, lo, hi = log_ratio_intervals(num, den)
    assert 0.93 <= _coverage(lo, hi, 1.2) <= 0.97
    assert _coverage(*_bootstrap(num[:2000], den[:2000], rng), 1.2) < 0.87


def test_coverage_with_unequal_noise_and_repeats():
    # Welch's point: a noisy cell over 3 repeats against a quiet baseline over 10 (a pooled variance
    # would take the baseline's calm for the cell's and under-cover)
    rng = np.random.default_rng(7)
    den = 100 * np.exp(0.02 * rng.standard_normal((2000, 10)))
    num = 80 * np.exp(0.2 * rng.standard_normal((2000, 3)))
    _, lo, hi = log_ratio_intervals(num, den)
    assert 0.93 <= _coverage(lo, hi, 0.8) <= 0.97


def test_run_noise_restores_coverage_when_runs_drift():
    """Two runs are two draws of the machine: log tok/s = config + run drift + repeat noise, the drift
    partly shared by a run's cells, partly each cell's own (cells run minutes apart). Intervals from
    the repeats alone miss it; adding run_noise, estimated from a repeat of OLD over the cells they
    share, brings a 95% interval back to about 95%. (A drift shared by every cell alone is seen once
    per pair of runs: there it reaches about 78%, against 17% for the repeats alone.)"""
    from adapters.contract.intervals import log_ratio_intervals, run_noise

    rng = np.random.default_rng(3)
    cells, n, shared, own, sd_rep = 8, 5, 0.05, 0.08, 0.02
    hit_alone = hit_noise = trials = 0
    for _ in range(400):
        def run():
            drift = rng.normal(0, shared) + rng.normal(0, own, (cells, 1))
            return np.exp(drift + rng.normal(0, sd_rep, (cells, n)))
        a, b, c = run(), run(), run()
        var, df = run_noise(list(a), list(b))
        _, lo1, hi1 = log_ratio_intervals(c, a)
        _, lo2, hi2 = log_ratio_intervals(c, a, 0.95, var, df)
        hit_alone += int(((lo1 <= 1) & (1 <= hi1)).sum())
        hit_noise += int(((lo2 <= 1) & (1 <= hi2)).sum())
        trials += cells
    assert hit_alone / trials < 0.3          # the repeats alone: far too narrow for the drift
    assert 0.92 <= hit_noise / trials <= 0.98, hit_noise / trials
