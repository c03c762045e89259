"""When each request of a load point arrives: seconds after the run's start, per shape
(adapters/contract/arrivals.py). The first request arrives at 0 in every shape.

gamma follows `vllm bench serve`'s get_request: gaps drawn from a gamma distribution of shape
`burstiness` and scale 1 / (rate x burstiness), then scaled so that they sum to exactly what the rate
asks (vLLM: the last arrival at requests / rate; here, the first arriving at 0, the last at
(requests - 1) / rate: the mean gap is 1 / rate exactly); the draws are numpy's generator seeded with
the cell's seed. vLLM's first request waits one gap; here it does not, as in the other shapes.

ramp: vLLM's `--ramp-up-strategy linear` steps the rate per request index over the run's requests;
here the rate is a function of time, rate(t) = start + (end - start) t / duration up to duration_s and
end_rate after, and the arrivals are that inhomogeneous process exactly: unit-mean gamma gaps (shape
`burstiness`; 1: Poisson) are summed and mapped through the inverse of the expected count
Lambda(t) = integral of rate (the time-rescaling theorem). With burstiness .inf the i-th request
arrives where Lambda(t) = i.
"""

from __future__ import annotations

import math
import random

import numpy as np

from adapters.contract.arrivals import RATED, Arrival, RampArrival


def unit_gaps(n: int, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """n gaps of mean 1: gamma of shape `burstiness` (coefficient of variation 1 / sqrt(burstiness)); .inf: all 1."""
    if math.isinf(burstiness):
        return np.ones(n)
    return rng.gamma(shape=burstiness, scale=1.0 / burstiness, size=n)


def ramp_rate(ramp: RampArrival, t: float) -> float:
    """The ramp's rate at t seconds after the start."""
    if t >= ramp.duration_s:
        return ramp.end_rate
    return ramp.start_rate + (ramp.end_rate - ramp.start_rate) * max(t, 0.0) / ramp.duration_s


def ramp_time(ramp: RampArrival, count: float) -> float:
    """The inverse of the ramp's expected count Lambda(t): the time by which `count` requests are expected."""
    s, e, d = ramp.start_rate, ramp.end_rate, ramp.duration_s
    by_end = d * (s + e) / 2
    if count <= 0:
        return 0.0
    if count > by_end:
        return d + (count - by_end) / e
    a = (e - s) / (2 * d)    # Lambda(t) = a t^2 + s t on [0, d]; the stable root of a t^2 + s t - count = 0
    return 2 * count / (s + math.sqrt(s * s + 4 * a * count))


def offsets(arrival: Arrival, rate: float, n: int, seed: int = 0) -> list[float]:
    """Seconds after the start at which each of n requests arrives (rate: the cell's, for the rated shapes;
    .inf: all at once, a closed loop)."""
    if n <= 0:
        return []
    kind = arrival.kind
    if kind in RATED and math.isinf(rate):
        return [0.0] * n
    if kind == "constant":
        return [i / rate for i in range(n)]
    if kind == "poisson":
        rng, t, out = random.Random(seed), 0.0, []
        for _ in range(n):
            out.append(t)
            t += rng.expovariate(rate)
        return out
    if kind == "gamma":
        gaps = unit_gaps(n - 1, arrival.burstiness, np.random.default_rng(seed)) / rate
        if n > 1 and gaps.sum() > 0:
            gaps *= (n - 1) / rate / gaps.sum()    # vLLM's normalisation: the run's mean rate is the rate asked
        return [0.0] + np.cumsum(gaps).tolist()
    if kind == "ramp":
        counts = np.concatenate([[0.0], np.cumsum(unit_gaps(n - 1, arrival.burstiness, np.random.default_rng(seed)))])
        return [ramp_time(arrival, float(c)) for c in counts]
    if kind == "trace":
        if n > len(arrival.gaps_s):
            raise ValueError(f"a trace schedule of {len(arrival.gaps_s)} requests cannot time {n}")
        return [0.0] + np.cumsum(arrival.gaps_s[1:n]).tolist()
    raise ValueError(f"unknown arrival kind {kind!r}")
