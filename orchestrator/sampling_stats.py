"""The sampling layer's statistics: a two-sample test on seeded samples, and the seeds it needs.

The per-sample statistic is the mean raw logprob of the sample's tokens (each engine's log-softmax of
its raw logits at the token it drew): a sampler that keeps more of the tail (a higher temperature, a
larger top-p) draws tokens of lower logprob, one that keeps less draws higher ones, and an engine whose
logits moved moves it too. Samples of one prompt are exchangeable between two cells that draw from the
same distribution, so the test permutes the cell labels within each prompt (a stratified permutation
test): its false-alarm rate is its level by construction, whatever the statistic's distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

N_PERM = 5000
SEED = 0


@dataclass
class DistributionTest:
    n_base: int
    n_cell: int
    shift: float                  # mean over prompts of (cell's mean statistic - baseline's), nats per token
    p_value: float
    test: str = "stratified permutation (per-sample mean raw logprob, within prompts)"


def permutation_test(base: np.ndarray, base_prompt: np.ndarray, cell: np.ndarray, cell_prompt: np.ndarray,
                     n_perm: int = N_PERM, seed: int = SEED) -> DistributionTest:
    """Two-sided: how often do relabelled samples (within each prompt) shift as far as the observed?"""
    rng = np.random.default_rng(seed)
    prompts = np.intersect1d(np.unique(base_prompt), np.unique(cell_prompt))
    observed, null = 0.0, np.zeros(n_perm)
    for p in prompts:
        a, b = base[base_prompt == p], cell[cell_prompt == p]
        pooled = np.concatenate([a, b])
        observed += b.mean() - a.mean()
        # each row a random relabelling: the first len(b) of a permutation are "cell"
        order = np.argsort(rng.random((n_perm, len(pooled))), axis=1)
        perm = pooled[order]
        null += perm[:, :len(b)].mean(axis=1) - perm[:, len(b):].mean(axis=1)
    k = max(len(prompts), 1)
    observed, null = observed / k, null / k
    p = (np.sum(np.abs(null) >= abs(observed) - 1e-12) + 1) / (n_perm + 1)
    return DistributionTest(n_base=int(np.isin(base_prompt, prompts).sum()), n_cell=int(np.isin(cell_prompt, prompts).sum()),
                            shift=float(observed), p_value=float(p))


def seeds_to_detect(values: np.ndarray, prompts: np.ndarray, shift: float, alpha: float, power: float = 0.8) -> int | None:
    """Seeds per prompt (each side) for the test to find a `shift` of the mean statistic with `power`
    at level `alpha` (normal approximation, the pooled within-prompt variance of `values`)."""
    from scipy.stats import norm

    groups = [values[prompts == p] for p in np.unique(prompts)]
    dof = sum(len(g) - 1 for g in groups)
    if dof <= 0 or shift <= 0:
        return None
    var = sum(float(((g - g.mean()) ** 2).sum()) for g in groups) / dof
    z = norm.ppf(1 - alpha / 2) + norm.ppf(power)
    return max(2, math.ceil(2 * var * z * z / (len(groups) * shift * shift)))
