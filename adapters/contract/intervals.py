"""Confidence intervals for throughputs and speed-ups measured over a few repeats.

numpy and the standard library only: this module is also imported inside engine environments
(the worker's `repeats: auto`), which need not have scipy.

Why not the percentile bootstrap: with the default 3 repeats a side has only 10 distinct
resamples, so the bootstrap distribution of a mean is a handful of values and its "95%" interval
covers the true ratio far less often than 95% (benchmarks/interval_coverage.py: about 80% at
3 repeats). Timings are positive and their noise is roughly multiplicative, so the intervals here
are Student-t intervals on log(samples), exponentiated: for log-normal data the one-sample
interval is exact at any n and Welch's ratio interval nearly so (95.2-96.5% in that benchmark),
because the width follows the t quantile (4.30 at df=2, not 1.96) instead of collapsing.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

_NEWTON_TOL = 1e-13     # relative step at which the quantile is taken as found
_LARGE_DF = 1e3         # above this the Cornish-Fisher series is exact to ~1e-13 (tail 1e-4)
_NORMAL = NormalDist()


def _betacf(a: np.ndarray, b: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Continued fraction of the incomplete beta function (modified Lentz, Numerical Recipes
    betacf), elementwise; converges fast for x < (a+1)/(a+b+2)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = np.ones_like(x)
    d = 1.0 - qab * x / qap
    d = 1.0 / np.where(np.abs(d) < tiny, tiny, d)
    h = d.copy()
    for m in range(1, 10_000):   # ~sqrt(max(a, b)) terms near the switch point: a few dozen here
        for aa in (m * (b - m) * x / ((qam + 2 * m) * (a + 2 * m)),
                   -(a + m) * (qab + m) * x / ((a + 2 * m) * (qap + 2 * m))):
            d = 1.0 + aa * d
            d = 1.0 / np.where(np.abs(d) < tiny, tiny, d)
            c = 1.0 + aa / c
            c = np.where(np.abs(c) < tiny, tiny, c)
            delta = c * d
            h = h * delta
        if np.all(np.abs(delta - 1.0) < eps):
            break
    return h


def _t_sf(t: np.ndarray, df: np.ndarray, log_norm: np.ndarray) -> np.ndarray:
    """P(T > t) for t >= 0: 0.5 * I_x(df/2, 1/2) with x = df/(df+t^2) (regularized incomplete beta).

    log_norm = lgamma((df+1)/2) - lgamma(df/2) - lgamma(1/2), i.e. -log B(df/2, 1/2)."""
    a, b = df / 2.0, np.full_like(df, 0.5)
    x, y = df / (df + t * t), t * t / (df + t * t)   # y = 1 - x without the cancellation
    with np.errstate(divide="ignore"):
        front = np.exp(log_norm + a * np.log(x) + b * np.log(y))
    # each side of the switch point gets the fraction that converges fast there
    direct = x < (a + 1.0) / (a + b + 2.0)
    ibeta = np.empty_like(x)
    ibeta[direct] = front[direct] * _betacf(a[direct], b[direct], x[direct]) / a[direct]
    flip = ~direct
    ibeta[flip] = 1.0 - front[flip] * _betacf(b[flip], a[flip], y[flip]) / b[flip]
    return 0.5 * ibeta


def t_quantile(p, df):
    """Student-t quantile: the t with P(T <= t) = p for df degrees of freedom (df = inf: normal).

    Accurate to ~1e-12 for df >= 1 (non-integer df included: Welch's are). Elementwise over
    arrays (the analysis asks for one per cell); a float for scalar arguments.

    Method: for p > 1/2, Newton's method on the upper tail P(T > t) = 1 - p, with the tail
    computed from the regularized incomplete beta function (continued fraction). The tail is
    convex in t > 0 and the normal quantile is below the t quantile, so Newton started from the
    normal quantile climbs to the root without overshooting. For df > 1e3 the Cornish-Fisher
    series in 1/df (Abramowitz & Stegun 26.7.5, four terms) is used instead: the continued
    fraction needs ever more terms there.
    """
    p_, df_ = np.broadcast_arrays(np.asarray(p, dtype=float), np.asarray(df, dtype=float))
    p_, df_ = p_.ravel(), df_.ravel()
    upper = p_ >= 0.5
    q = np.where(upper, 1.0 - p_, p_)                  # the tail beyond |t|
    valid = (q > 0) & (df_ > 0) & ~np.isnan(df_)
    uq, back = np.unique(q, return_inverse=True)   # usually one level for many dfs
    z = np.array([_NORMAL.inv_cdf(1.0 - v) if 0 < v <= 0.5 else 0.0 for v in uq])[back.ravel()]
    t = np.full_like(p_, np.nan)

    large = valid & (df_ > _LARGE_DF)
    zl, v = z[large], df_[large]
    t[large] = (zl + (zl**3 + zl) / (4 * v) + (5 * zl**5 + 16 * zl**3 + 3 * zl) / (96 * v**2)
                + (3 * zl**7 + 19 * zl**5 + 17 * zl**3 - 15 * zl) / (384 * v**3)
                + (79 * zl**9 + 776 * zl**7 + 1482 * zl**5 - 1920 * zl**3 - 945 * zl) / (92160 * v**4))

    small = valid & ~large
    if small.any():
        v, qs, ts = df_[small], q[small], z[small].copy()
        lg = np.frompyfunc(math.lgamma, 1, 1)
        log_norm = (lg((v + 1) / 2) - lg(v / 2)).astype(float) - 0.5 * math.log(math.pi)
        todo = np.arange(len(ts))   # the elements still moving: the rest are done
        for _ in range(200):
            vt, tt, nt = v[todo], ts[todo], log_norm[todo]
            pdf = np.exp(nt - (vt + 1) / 2 * np.log1p(tt * tt / vt)) / np.sqrt(vt)
            step = (_t_sf(tt, vt, nt) - qs[todo]) / pdf
            ts[todo] = tt + step
            todo = todo[np.abs(step) > _NEWTON_TOL * np.maximum(ts[todo], 1.0)]
            if not len(todo):
                break
        t[small] = ts

    t[valid & (q == 0.5)] = 0.0
    t[(q == 0) & (df_ > 0)] = np.inf
    t = np.where(upper, t, -t).reshape(np.broadcast(np.asarray(p), np.asarray(df)).shape)
    return float(t) if t.ndim == 0 else t


def _logs(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of a (k, n) array: mean and variance (ddof 1) of the logs, and whether the row is
    usable (every value finite and > 0; a throughput of 0 or below has no log)."""
    rows = np.asarray(rows, dtype=float)
    ok = np.all(np.isfinite(rows) & (rows > 0), axis=1)
    logs = np.log(np.where(ok[:, None], rows, 1.0))   # unusable rows: placeholders, masked by `ok`
    if rows.shape[1] == 0:
        return np.full(len(rows), np.nan), np.full(len(rows), np.nan), ok & False
    var = logs.var(axis=1, ddof=1) if rows.shape[1] > 1 else np.full(len(rows), np.nan)
    return logs.mean(axis=1), var, ok


def log_mean_intervals(rows, level: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """log_mean_interval for each row of a (k, n) array at once: (centers, los, his)."""
    rows = np.atleast_2d(np.asarray(rows, dtype=float))
    n = rows.shape[1]
    mean, var, ok = _logs(rows)
    center = np.where(ok, np.exp(mean), np.nan)
    if n < 2:
        return center, np.full_like(center, np.nan), np.full_like(center, np.nan)
    half = t_quantile(0.5 + level / 2, n - 1) * np.sqrt(var / n)
    return center, np.where(ok, center * np.exp(-half), np.nan), np.where(ok, center * np.exp(half), np.nan)


def log_mean_interval(samples, level: float = 0.95) -> tuple[float, float, float]:
    """(center, lo, hi): the geometric mean of positive samples and its `level` confidence interval.

    One-sample Student-t interval on log(samples) (df = n - 1), exponentiated: center * exp(-+h)
    with h = t_{(1+level)/2, n-1} * sd(log) / sqrt(n). Why on the log scale: timing noise is
    multiplicative, and the interval stays positive. With n < 2 the bounds are NaN; equal samples
    give lo = hi = center; a non-positive or non-finite sample makes all three NaN.
    """
    c, lo, hi = log_mean_intervals(np.asarray(samples, dtype=float).reshape(1, -1), level)
    return float(c[0]), float(lo[0]), float(hi[0])


def relative_half_width(samples, level: float = 0.95) -> float | None:
    """w such that the log_mean_interval is center / (1 + w) .. center * (1 + w): w = sqrt(hi/lo) - 1.

    The relative precision of a throughput measured over these repeats (w = 0.02: known to within
    about +-2%); `repeats: auto` adds repeats until w is within its target. None when there is no
    interval: fewer than 2 samples, or a non-positive or non-finite sample.
    """
    _, lo, hi = log_mean_interval(samples, level)
    return None if math.isnan(lo) else math.sqrt(hi / lo) - 1.0


def log_ratio_intervals(num, den, level: float = 0.95, run_var: float = 0.0,
                        run_df: float = math.inf) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """log_ratio_interval for each row pair of a (k, n_num) and a (k, n_den) array at once
    (vectorised: the analysis computes 100,000 cells' intervals in one call per repeat count).

    `run_var` adds a between-run component to the variance of the log ratio, estimated on `run_df`
    degrees of freedom (`run_noise`): two runs are two draws of the machine's state, which the
    repeats inside each run do not see."""
    ratio, se, df, ok = _welch(num, den, run_var, run_df)
    shape = len(ratio)
    if df is None:   # no spread to estimate on one side
        return ratio, np.full(shape, np.nan), np.full(shape, np.nan)
    spread = ok & (se > 0)
    half = np.zeros(shape)   # both sides constant: the interval is the point
    half[spread] = t_quantile(0.5 + level / 2, df[spread]) * se[spread]
    return ratio, np.where(ok, ratio * np.exp(-half), np.nan), np.where(ok, ratio * np.exp(half), np.nan)


def _welch(num, den, run_var: float, run_df: float):
    """(ratio, se, df, ok) per row pair: the ratio of geometric means, the standard error of the log ratio and its
    Welch-Satterthwaite degrees of freedom (df None where a side has fewer than 2 repeats)."""
    num = np.atleast_2d(np.asarray(num, dtype=float))
    den = np.atleast_2d(np.asarray(den, dtype=float))
    n1, n2 = num.shape[1], den.shape[1]
    m1, s1, ok1 = _logs(num)
    m2, s2, ok2 = _logs(den)
    ok = ok1 & ok2
    ratio = np.where(ok, np.exp(m1 - m2), np.nan)
    if n1 < 2 or n2 < 2:
        return ratio, None, None, ok
    v1, v2 = s1 / n1, s2 / n2
    se = np.sqrt(v1 + v2 + run_var)
    with np.errstate(divide="ignore", invalid="ignore"):
        # Welch-Satterthwaite; where one side has no spread it is the other side's n - 1
        df = (v1 + v2 + run_var) ** 2 / (v1**2 / (n1 - 1) + v2**2 / (n2 - 1) + run_var**2 / run_df)
    return ratio, se, df, ok


def _t_p(t: np.ndarray, df: np.ndarray) -> np.ndarray:
    """Two-sided p of Student t statistics (NaN where t or df is)."""
    p = np.full(len(t), np.nan)
    has = np.isfinite(t) & np.isfinite(df) & (df > 0)
    if has.any():
        lg = np.frompyfunc(math.lgamma, 1, 1)
        v = df[has]
        log_norm = (lg((v + 1) / 2) - lg(v / 2)).astype(float) - 0.5 * math.log(math.pi)
        p[has] = np.minimum(1.0, 2.0 * _t_sf(np.abs(t[has]), v, log_norm))
    return p


def log_ratio_p(num, den, run_var: float = 0.0, run_df: float = math.inf) -> np.ndarray:
    """The two-sided p of Welch's t test that the log ratio is 0, per row pair: the test whose 95% interval
    log_ratio_intervals gives (p < 0.05 exactly where that interval excludes 1). Both sides constant and equal:
    p = 1; constant and different: p = 0; NaN where there is no interval."""
    ratio, se, df, ok = _welch(num, den, run_var, run_df)
    if df is None:
        return np.full(len(ratio), np.nan)
    log_r = np.log(np.where(ok, ratio, 1.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, log_r / np.where(se > 0, se, 1.0), np.where(log_r == 0, 0.0, np.inf))
    p = _t_p(np.where(np.isinf(t), 0.0, t), np.where(se > 0, df, np.where(ok, 1.0, np.nan)))
    p[np.isinf(t)] = 0.0
    return np.where(ok, p, np.nan)


def log_mean_p(rows) -> np.ndarray:
    """The two-sided p of the one-sample t test that the mean log of each row is 0 (the paired ratio's test, the
    one log_mean_intervals' interval inverts); NaN with fewer than 2 values."""
    rows = np.atleast_2d(np.asarray(rows, dtype=float))
    n = rows.shape[1]
    mean, var, ok = _logs(rows)
    if n < 2:
        return np.full(len(rows), np.nan)
    se = np.sqrt(var / n)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, mean / np.where(se > 0, se, 1.0), np.where(mean == 0, 0.0, np.inf))
    p = _t_p(np.where(np.isinf(t), 0.0, t), np.full(len(rows), float(n - 1)))
    p[np.isinf(t)] = 0.0
    return np.where(ok, p, np.nan)


def run_noise(old_rows: list, repeat_rows: list) -> tuple[float, float]:
    """(variance, degrees of freedom) of the between-run part of a log ratio, from configurations run
    twice (a stored run and a repeat of it): per configuration d = mean log(repeat) - mean log(run),
    whose variance is the runs' difference (2 sigma_run^2) plus the repeats' own (s1^2/n1 + s2^2/n2);
    pooled over the k configurations, the within part taken out: max(0, mean(d^2 - within)), on k
    degrees of freedom. That takes each cell's drift as its own (cells run minutes apart): with a
    drift partly shared and partly per cell a 95% interval holds about 95%; a drift shared by every
    cell alone is one draw per pair of runs, and there it holds about 78% (the repeats alone: 17%;
    tests/unit/test_intervals.py). (0, inf) when nothing pairs."""
    terms = []
    for a, b in zip(old_rows, repeat_rows):
        a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        if len(a) < 2 or len(b) < 2 or not (np.all(a > 0) and np.all(b > 0)):
            continue
        la, lb = np.log(a), np.log(b)
        terms.append((lb.mean() - la.mean()) ** 2 - la.var(ddof=1) / len(a) - lb.var(ddof=1) / len(b))
    if not terms:
        return 0.0, math.inf
    return max(0.0, float(np.mean(terms))), float(len(terms))


def log_ratio_interval(num, den, level: float = 0.95) -> tuple[float, float, float]:
    """(ratio, lo, hi): geomean(num) / geomean(den) of two independent samples, with its interval.

    Welch's t interval on mean(log num) - mean(log den): standard error sqrt(s1^2/n1 + s2^2/n2)
    of the logs, Welch-Satterthwaite degrees of freedom, exponentiated. It does not assume the
    two sides are equally noisy (an engine and its baseline seldom are), and at n = 3 per side it
    keeps its nominal coverage where the percentile bootstrap (10 distinct resamples per side)
    covers far less (benchmarks/interval_coverage.py).

    The point estimate here is the ratio of geometric means; the analysis's `speedup` stays
    mean(num)/mean(den) of the cells' output_tok_s and takes lo/hi from here. For timing data
    (a few percent of spread) the two means agree to well within the interval.

    Degenerate cases: n = 1 on either side gives the ratio with NaN bounds (no spread to
    estimate); no spread on both sides gives lo = hi = ratio; a non-positive or non-finite value
    makes all three NaN.
    """
    r, lo, hi = log_ratio_intervals(np.asarray(num, dtype=float).reshape(1, -1),
                                    np.asarray(den, dtype=float).reshape(1, -1), level)
    return float(r[0]), float(lo[0]), float(hi[0])


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(Binomial(n, p) <= k), summed in logs (n is a probe's request count: hundreds at most)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    terms = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
             for i in range(k + 1)]
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def quantile_interval(values, q: float, level: float = 0.95) -> tuple[float, float]:
    """Distribution-free interval for the q-quantile (0 < q < 1) of what `values` were drawn from: the
    order statistics X(l) <= X(u) with P(X(l) <= quantile <= X(u)) >= level, each tail at most
    (1 - level) / 2 (the binomial count of values below the quantile). An end the sample is too small
    to bound is -inf or inf: a p99 needs 368 values before its 95% interval has a finite upper end."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n, tail = len(x), (1 - level) / 2
    if n == 0:
        return -math.inf, math.inf
    # upper: the smallest u with P(Bin(n, q) <= u - 1) >= 1 - tail (X(u), 1-based)
    u = next((u for u in range(1, n + 1) if _binom_cdf(u - 1, n, q) >= 1 - tail), None)
    # lower: the largest l with P(Bin(n, q) <= l - 1) <= tail
    l = next((l for l in range(n, 0, -1) if _binom_cdf(l - 1, n, q) <= tail), None)
    return (float(x[l - 1]) if l else -math.inf), (float(x[u - 1]) if u else math.inf)


def min_values_for_upper_bound(q: float, level: float = 0.95) -> int:
    """The fewest values whose quantile_interval(q, level) has a finite upper end (all below the
    quantile with probability at most (1 - level) / 2: q^n <= tail)."""
    return math.ceil(math.log((1 - level) / 2) / math.log(q))


def wilson_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a share k / n (goodput): better than the normal one near 0 and 1."""
    if n == 0:
        return 0.0, 1.0
    z = _NORMAL.inv_cdf(0.5 + level / 2)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)
