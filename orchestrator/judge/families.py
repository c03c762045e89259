"""The family of a layer's tests: the one place a run's many tests are corrected for their number.

A run judges many cells on one layer (every (cell, task) pair on the task layer): at a per-test level
alpha, about alpha of the tests whose cells changed nothing still say `improved` or `regressed`. So the words
that come from a test are decided by the test's q (its p adjusted over the family, the run's tests of that
layer: scipy.stats.false_discovery_control), not by its p: `q < alpha` controls the false discovery rate of the
family's calls at alpha.

    family(p, alpha, method)   q values, the decision per test, and the per-test level the family held:
                               BH (Benjamini-Hochberg) where the tests are independent or positively dependent
                               (PRDS), BY (Benjamini-Yekutieli) under any dependence; docs/verdicts.md says
                               which layer uses which, and why

A test that could not run (p missing) is no member of the family: its q is NaN and its decision False.
`level` is the per-test level a test the family did not call would have had to beat to be called:
alpha x (R + 1) / m (BH; divided by the harmonic sum of 1..m for BY), R the tests called, m the family's
size; capped at alpha. A "no change" states its power at that level: the smallest change the test could
have seen at it, not at alpha.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

BH, BY = "bh", "by"
NAMES = {BH: "Benjamini-Hochberg", BY: "Benjamini-Yekutieli"}


@dataclass(frozen=True)
class Family:
    q: np.ndarray            # adjusted p per test (NaN where p is missing)
    called: np.ndarray       # q < alpha
    level: float             # the per-test level a test not called had to beat (see the module's docstring)
    size: int                # m: the tests with a p
    n_called: int            # R
    alpha: float
    method: str

    def summary(self) -> str:
        """'2 of 33 tests called at FDR 0.05 (Benjamini-Hochberg)'."""
        return (f"{self.n_called} of {self.size} tests called at FDR {self.alpha:g} ({NAMES[self.method]}; "
                f"a test not called needed p < {self.level:.3g})")


def family(p, alpha: float, method: str = BH) -> Family:
    """The family decision over `p` (one layer's raw p values, NaN / None for a test that did not run)."""
    from scipy.stats import false_discovery_control

    if method not in NAMES:
        raise ValueError(f"unknown correction {method!r}: {', '.join(NAMES)}")
    raw = np.asarray([math.nan if x is None else float(x) for x in p], dtype=np.float64)
    has = np.isfinite(raw)
    q = np.full(len(raw), math.nan)
    if has.any():
        q[has] = false_discovery_control(np.clip(raw[has], 0.0, 1.0), method=method)
    called = np.zeros(len(raw), bool)
    called[has] = q[has] < alpha
    m, r = int(has.sum()), int(called.sum())
    harmonic = float(np.sum(1.0 / np.arange(1, m + 1))) if method == BY and m else 1.0
    level = min(alpha, alpha * (r + 1) / max(m, 1) / harmonic)
    return Family(q=q, called=called, level=level, size=m, n_called=r, alpha=alpha, method=method)
