"""The task layer's statistics: a metric's interval, and the paired change of one cell against another.

    score interval   binary metrics: Wilson's 95% interval; continuous ones: the bootstrap percentile
                     interval of the mean (10,000 resamples, seeded)
    paired change    over the items both sides scored: the change of the mean (cell - baseline) and the
                     ratio of the means (cell / baseline, MLPerf's accuracy ratio), each with a 95% paired
                     bootstrap interval (items resampled together); the test: McNemar's exact test for
                     0/1 metrics (a two-sided binomial test on the discordant items), else a paired
                     bootstrap test (the per-item differences centred on 0, resampled)
    verdict          'regressed' / 'improved' where p < alpha, else 'no change': a change inside the
                     noise of the items is reported as none
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

N_BOOT = 10_000
SEED = 0


def _boot_index(n: int, n_boot: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def score_interval(scores: np.ndarray, binary: bool, n_boot: int = N_BOOT, seed: int = SEED) -> tuple[float, float]:
    """95% interval of the mean score."""
    scores = np.asarray(scores, dtype=np.float64)
    n = len(scores)
    if not n:
        return math.nan, math.nan
    if binary:
        from scipy.stats import binomtest

        ci = binomtest(int(round(scores.sum())), n).proportion_ci(0.95, method="wilson")
        return float(ci.low), float(ci.high)
    means = scores[_boot_index(n, n_boot, seed)].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


@dataclass
class PairedChange:
    n_paired: int
    base_score: float
    cell_score: float
    change: float                 # cell - baseline, over the paired items
    change_lo: float
    change_hi: float
    ratio: float                  # cell / baseline (nan when the baseline's mean is 0)
    ratio_lo: float
    ratio_hi: float
    test: str                     # mcnemar-exact | paired-bootstrap
    p_value: float
    worse: int                    # items the baseline got right and the cell wrong (binary), or scored lower
    better: int
    verdict: str                  # no change | regressed | improved

    def as_dict(self) -> dict:
        return asdict(self)


def paired_change(base: np.ndarray, cell: np.ndarray, binary: bool, alpha: float = 0.05,
                  n_boot: int = N_BOOT, seed: int = SEED) -> PairedChange:
    """`base[i]` and `cell[i]` score the same item."""
    a, b = np.asarray(base, dtype=np.float64), np.asarray(cell, dtype=np.float64)
    n = len(a)
    d = b - a
    worse, better = int((d < 0).sum()), int((d > 0).sum())
    idx = _boot_index(n, n_boot, seed)
    ma, mb = a[idx].mean(axis=1), b[idx].mean(axis=1)
    change_lo, change_hi = (float(x) for x in np.percentile(mb - ma, [2.5, 97.5]))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = mb / ma
    base_mean, cell_mean = float(a.mean()), float(b.mean())
    if base_mean > 0 and np.isfinite(ratios).all():
        ratio = cell_mean / base_mean
        ratio_lo, ratio_hi = (float(x) for x in np.percentile(ratios, [2.5, 97.5]))
    else:   # a baseline scoring 0 (or resamples of it that do) has no ratio
        ratio = ratio_lo = ratio_hi = math.nan
    if binary:
        from scipy.stats import binomtest

        test = "mcnemar-exact"
        p = 1.0 if worse + better == 0 else float(binomtest(better, worse + better, 0.5).pvalue)
    else:
        test = "paired-bootstrap"
        if not d.any():
            p = 1.0
        else:   # the differences shifted to mean 0 (the null), resampled: how often is the mean as far out?
            centred = (d - d.mean())[idx].mean(axis=1)
            p = float((np.abs(centred) >= abs(d.mean()) - 1e-15).sum() + 1) / (n_boot + 1)
    verdict = "no change" if p >= alpha else ("regressed" if cell_mean < base_mean else "improved")
    return PairedChange(n_paired=n, base_score=base_mean, cell_score=cell_mean, change=cell_mean - base_mean,
                        change_lo=change_lo, change_hi=change_hi, ratio=ratio, ratio_lo=ratio_lo, ratio_hi=ratio_hi,
                        test=test, p_value=p, worse=worse, better=better, verdict=verdict)
