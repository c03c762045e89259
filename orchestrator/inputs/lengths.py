"""Seeded request lengths: fixed, uniform, normal and log-normal, drawn once per workload and cell.

A draw depends only on the distribution, its seed and how many lengths are asked for, so request i
has the same lengths in every engine and batch size of a run. Lengths are integers clipped to
[min, max]; the clipping is part of the distribution the matrix names (its `min`/`max`), never a
silent repair, and `describe` says what the clipped draw looks like.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


class LengthDist(BaseModel):
    """One length distribution. fixed: `value`; uniform: integers in [min, max]; normal: `mean`, `std`;
    lognormal: `mean` and `std` of the lengths themselves (not of their log, as vLLM's and most
    production traces are reported), with a median below the mean."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["fixed", "uniform", "normal", "lognormal"]
    value: int | None = Field(None, ge=1, description="fixed: the length")
    mean: float | None = Field(None, gt=0, description="normal, lognormal: mean length")
    std: float | None = Field(None, ge=0, description="normal, lognormal: standard deviation of the lengths")
    min: int = Field(1, ge=1, description="Shortest length (draws below are clipped to it)")
    max: int | None = Field(None, ge=1, description="Longest length (draws above are clipped to it); "
                            "uniform: the upper bound")

    @model_validator(mode="after")
    def _fields_of_kind(self) -> "LengthDist":
        need = {"fixed": ("value",), "uniform": ("max",), "normal": ("mean", "std"), "lognormal": ("mean", "std")}
        missing = [f for f in need[self.kind] if getattr(self, f) is None]
        if missing:
            raise ValueError(f"a {self.kind} length distribution needs {', '.join(missing)}")
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max {self.max} is below min {self.min}")
        return self

    @property
    def nominal(self) -> int:
        """The length a cell's row names (input_len / output_len): the distribution's mean, rounded."""
        if self.kind == "fixed":
            return self.value
        if self.kind == "uniform":
            return round((self.min + self.max) / 2)
        return max(self.min, round(self.mean))

    @property
    def upper(self) -> int:
        """The longest length a draw can have (what the model's context must hold)."""
        if self.kind == "fixed":
            return self.value
        if self.max is not None:
            return self.max
        return int(np.ceil(self.mean + 6 * self.std))   # no max: 6 sigma (the context check uses it)


def sample(dist: LengthDist, n: int, seed: int | list[int]) -> list[int]:
    """n lengths, the same for the same (dist, n, seed)."""
    rng = np.random.default_rng(seed)
    if dist.kind == "fixed":
        x = np.full(n, dist.value, dtype=np.float64)
    elif dist.kind == "uniform":
        x = rng.integers(dist.min, dist.max + 1, n).astype(np.float64)
    elif dist.kind == "normal":
        x = rng.normal(dist.mean, dist.std, n)
    else:
        # log-normal with the lengths' own mean m and std s: sigma^2 = ln(1 + s^2/m^2), mu = ln m - sigma^2/2
        sigma2 = np.log1p((dist.std / dist.mean) ** 2)
        x = rng.lognormal(np.log(dist.mean) - sigma2 / 2, np.sqrt(sigma2), n)
    return np.clip(np.rint(x), dist.min, dist.max if dist.max is not None else np.inf).astype(int).tolist()


def describe(lengths: list[int]) -> str:
    """What a list of lengths looks like, for a row's notes: n, mean, p50/p90/p99, min-max."""
    a = np.asarray(lengths, dtype=np.float64)
    if not a.size:
        return "n=0"
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return (f"n={a.size} mean {a.mean():.1f} p50 {p50:.0f} p90 {p90:.0f} p99 {p99:.0f} "
            f"min {a.min():.0f} max {a.max():.0f}")
