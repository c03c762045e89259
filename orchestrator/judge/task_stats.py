"""The task layer's statistics: a metric's interval, and the paired change of one cell against another.

A task's figure is its items' scores aggregated as lm-eval aggregates them (orchestrator/inputs/task_metrics.py:
the mean, or a perplexity over per-item loglikelihoods and their words or bytes).

    score interval   binary means: Wilson's 95% interval; other figures: the bootstrap percentile interval
                     (10,000 resamples of the items, seeded)
    paired change    over the items both sides scored: the change of the figure (cell - baseline) and the
                     ratio (cell / baseline, MLPerf's accuracy ratio), each with a 95% paired bootstrap
                     interval (items resampled together; resamples whose baseline figure is 0 have no ratio and
                     are left out of its interval, with their count); the test: McNemar's exact test for 0/1
                     means (a two-sided binomial test on the discordant items), a paired bootstrap test for
                     other means (the per-item differences centred on 0, resampled), and a paired permutation
                     test for the perplexities (each item's two scores swapped at random: the null's spread)
    power            the smallest change the test could see: (z(1 - alpha/2) + z(0.8)) x the bootstrap
                     standard error of the change (80% power), as a share of the baseline's figure
    verdict          'regressed' / 'improved' where q < alpha (q: p adjusted over the run's task tests,
                     orchestrator/judge/families.py; a lone test's q is its p); else 'no change' where that
                     smallest change, at the level the family held, is within `tolerance` (relative), and
                     'not distinguishable' where it is not: the items could not have shown a change of the
                     size that matters; which way is worse follows the metric's higher_is_better (a
                     perplexity's items are loglikelihoods: higher is better for them). paired_change decides
                     as a family of one; PairedChange.at_level decides again at the family's q and level
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from orchestrator.inputs.task_metrics import aggregate

N_BOOT = 10_000
SEED = 0
POWER = 0.8
TOLERANCE = 0.02   # orchestrator.matrix.models.Tolerances.task_tolerance's default, for direct callers


def _boot_index(n: int, n_boot: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def score_interval(scores: np.ndarray, binary: bool, n_boot: int = N_BOOT, seed: int = SEED,
                   aggregation: str | None = None, weights: np.ndarray | None = None) -> tuple[float, float]:
    """95% interval of the task figure."""
    scores = np.asarray(scores, dtype=np.float64)
    n = len(scores)
    if not n:
        return math.nan, math.nan
    if binary and aggregation in (None, "mean"):
        from scipy.stats import binomtest

        ci = binomtest(int(round(scores.sum())), n).proportion_ci(0.95, method="wilson")
        return float(ci.low), float(ci.high)
    idx = _boot_index(n, n_boot, seed)
    figures = aggregate(aggregation, scores[idx], None if weights is None else np.asarray(weights, np.float64)[idx])
    lo, hi = np.percentile(figures, [2.5, 97.5])
    return float(lo), float(hi)


@dataclass
class PairedChange:
    n_paired: int
    base_score: float
    cell_score: float
    change: float                 # cell - baseline, over the paired items
    change_lo: float
    change_hi: float
    ratio: float                  # cell / baseline (nan when the baseline's figure is 0)
    ratio_lo: float
    ratio_hi: float
    ratio_dropped: int            # resamples left out of the ratio's interval: their baseline figure is 0
    test: str                     # mcnemar-exact | paired-bootstrap | paired-permutation
    p_value: float
    worse: int                    # items the baseline got right and the cell wrong (binary), or scored lower
    better: int
    q_value: float                # p adjusted over the family (see at_level); p itself for a family of one
    change_se: float              # the bootstrap standard error of the change
    mde: float                    # the smallest change the test could see (80% power), in the figure's units
    mde_rel: float                # the same as a share of the baseline's figure (inf where that is 0)
    items_needed: int | None      # about how many paired items would bring mde_rel within the tolerance
    verdict: str                  # no change | not distinguishable | regressed | improved
    cell_worse: bool              # the cell's figure is worse than the baseline's (not a column)

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "cell_worse"}

    def at_level(self, q: float, level: float, alpha: float, tolerance: float = TOLERANCE) -> PairedChange:
        """This change decided within a family: called where q < alpha, its power stated at `level` (the per-test
        level the family held, orchestrator/judge/families.py)."""
        return _decided(self, q, level, alpha, tolerance)


def _decided(c: PairedChange, q: float, level: float, alpha: float, tolerance: float) -> PairedChange:
    from dataclasses import replace

    from scipy.stats import norm

    mde = float((norm.ppf(1 - level / 2) + norm.ppf(POWER)) * c.change_se)
    base = abs(c.base_score)
    mde_rel = mde / base if base else (0.0 if mde == 0 else math.inf)
    # the standard error shrinks as 1/sqrt(n): the items that would bring the smallest change within tolerance
    needed = int(math.ceil(c.n_paired * (mde_rel / tolerance) ** 2)) \
        if math.isfinite(mde_rel) and mde_rel > tolerance else None
    if q < alpha:
        verdict = "regressed" if c.cell_worse else "improved"
    else:
        verdict = "no change" if mde_rel <= tolerance else "not distinguishable"
    return replace(c, q_value=q, mde=mde, mde_rel=mde_rel, items_needed=needed, verdict=verdict)


def paired_change(base: np.ndarray, cell: np.ndarray, binary: bool, alpha: float = 0.05,
                  n_boot: int = N_BOOT, seed: int = SEED, aggregation: str | None = None,
                  base_weights: np.ndarray | None = None, cell_weights: np.ndarray | None = None,
                  higher_is_better: bool = True, tolerance: float = TOLERANCE) -> PairedChange:
    """`base[i]` and `cell[i]` score the same item (the weights: a perplexity's words or bytes per item)."""
    a, b = np.asarray(base, dtype=np.float64), np.asarray(cell, dtype=np.float64)
    wa = np.ones_like(a) if base_weights is None else np.asarray(base_weights, dtype=np.float64)
    wb = np.ones_like(b) if cell_weights is None else np.asarray(cell_weights, dtype=np.float64)
    mean = aggregation in (None, "mean")
    n = len(a)
    d = b - a
    # a perplexity's per-item scores are loglikelihoods: an item is worse when its loglikelihood fell
    item_up = higher_is_better if mean else True
    worse, better = (int((d < 0).sum()), int((d > 0).sum())) if item_up else (int((d > 0).sum()), int((d < 0).sum()))
    idx = _boot_index(n, n_boot, seed)
    ma, mb = aggregate(aggregation, a[idx], wa[idx]), aggregate(aggregation, b[idx], wb[idx])
    change_lo, change_hi = (float(x) for x in np.percentile(mb - ma, [2.5, 97.5]))
    base_figure, cell_figure = float(aggregate(aggregation, a, wa)), float(aggregate(aggregation, b, wb))
    has_ratio = (ma != 0) & np.isfinite(ma)
    if base_figure != 0 and has_ratio.any():   # only a baseline figure of 0 itself has no ratio
        ratio = cell_figure / base_figure
        ratio_lo, ratio_hi = (float(x) for x in np.percentile(mb[has_ratio] / ma[has_ratio], [2.5, 97.5]))
    else:
        ratio = ratio_lo = ratio_hi = math.nan
    if binary and mean:
        from scipy.stats import binomtest

        test = "mcnemar-exact"
        p = 1.0 if worse + better == 0 else float(binomtest(better, worse + better, 0.5).pvalue)
    elif not d.any() and (wa == wb).all():
        test, p = ("paired-bootstrap" if mean else "paired-permutation"), 1.0
    elif mean:   # the differences shifted to mean 0 (the null), resampled: how often is the mean as far out?
        test = "paired-bootstrap"
        centred = (d - d.mean())[idx].mean(axis=1)
        p = float((np.abs(centred) >= abs(d.mean()) - 1e-15).sum() + 1) / (n_boot + 1)
    else:   # under the null the two scores of an item are exchangeable: swap each pair at random
        test = "paired-permutation"
        swap = np.random.default_rng(seed + 1).random((n_boot, n)) < 0.5
        sa, sb = np.where(swap, b, a), np.where(swap, a, b)
        swa, swb = np.where(swap, wb, wa), np.where(swap, wa, wb)
        null = aggregate(aggregation, sb, swb) - aggregate(aggregation, sa, swa)
        p = float((np.abs(null) >= abs(cell_figure - base_figure) - 1e-12).sum() + 1) / (n_boot + 1)
    cell_worse = cell_figure < base_figure if higher_is_better else cell_figure > base_figure
    one = PairedChange(n_paired=n, base_score=base_figure, cell_score=cell_figure, change=cell_figure - base_figure,
                        change_lo=change_lo, change_hi=change_hi, ratio=ratio, ratio_lo=ratio_lo, ratio_hi=ratio_hi,
                        ratio_dropped=int(n_boot - has_ratio.sum()) if math.isfinite(ratio) else 0,
                        test=test, p_value=p, worse=worse, better=better, q_value=p,
                        change_se=float(np.std(mb - ma)), mde=math.nan, mde_rel=math.nan, items_needed=None,
                        verdict="", cell_worse=bool(cell_worse))
    return one.at_level(p, alpha, alpha, tolerance)   # a family of one: q = p, its level alpha
