"""How many seeds the sampling layer's two-sample test needs: one definition, read by the worker (a
`seeds: auto` cell draws until it has them) and by the judge (orchestrator/judge/sampling_stats.py:
"seeds needed", and the shift a test could have seen).

The unit is the seed: each sample's statistic (its mean raw logprob) centred per prompt and averaged
over the prompts of one seed, since one seed's samples of different prompts are dependent.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

POWER = 0.8          # the power every "could have seen" and "seeds needed" figure is sized for


def sample_statistic(logprobs) -> float:
    """What the two-sample test compares per sample: the mean raw logprob of its sampled tokens."""
    return float(np.mean(logprobs)) if len(logprobs) else math.nan


def seed_units(values: np.ndarray, prompts: np.ndarray, seeds: np.ndarray, centre: dict) -> np.ndarray:
    """Per seed: the mean over its prompts of (value - that prompt's centre)."""
    y = values - np.array([centre[p] for p in prompts])
    order = np.unique(seeds)
    return np.array([y[seeds == s].mean() for s in order])


def z_sum(level: float, power: float = POWER) -> float:
    """z(1 - level/2) + z(power): a two-sided test at `level` finding a shift with `power`."""
    n = NormalDist()
    return n.inv_cdf(1 - level / 2) + n.inv_cdf(power)


def seeds_to_detect(values: np.ndarray, prompts: np.ndarray, seeds: np.ndarray, shift: float, alpha: float,
                    power: float = POWER) -> int | None:
    """Seeds (each side, every prompt sampled with each) for the two-sample test to find a `shift` of the
    mean statistic with `power` at level `alpha`: normal approximation with the variance of the
    per-seed means of `values` (centred per prompt), which carries the dependence across prompts."""
    values, prompts, seeds = np.asarray(values, float), np.asarray(prompts), np.asarray(seeds)
    centre = {p: float(values[prompts == p].mean()) for p in np.unique(prompts)}
    units = seed_units(values, prompts, seeds, centre)
    if len(units) < 2 or not shift > 0:
        return None
    z = z_sum(alpha, power)
    return max(2, math.ceil(2 * float(units.var(ddof=1)) * z * z / (shift * shift)))
