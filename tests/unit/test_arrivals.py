"""Arrival schedules (adapters/serving/arrivals.py): gamma's gaps against their shape, a ramp's rate at each
moment, a trace's times as scaled; the shapes typed (adapters/contract/arrivals.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError

from adapters.contract.arrivals import Arrival, GammaArrival, MatrixArrival, RampArrival, TraceArrival
from adapters.serving import load_generator
from adapters.serving.arrivals import offsets, ramp_rate, ramp_time

N = 20_000


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_the_rate_mean_and_the_shape_cv(burstiness):
    rate = 8.0
    gaps = np.diff(offsets(GammaArrival(burstiness=burstiness), rate, N + 1, seed=3))
    assert len(gaps) == N and (gaps >= 0).all()
    # vLLM's normalisation: the mean gap is exactly 1 / rate
    assert gaps.mean() == pytest.approx(1 / rate, rel=1e-9)
    # the coefficient of variation of a gamma of shape k is 1 / sqrt(k); its sample CV's standard error is
    # about cv * sqrt((1 + 2 cv^2) / (2 N)) (a gamma's kurtosis): within 4 of them
    cv = 1 / math.sqrt(burstiness)
    se = cv * math.sqrt((1 + 2 * cv ** 2) / (2 * N))
    assert gaps.std() / gaps.mean() == pytest.approx(cv, abs=4 * se)


def test_gamma_is_seeded_and_starts_at_zero():
    a = offsets(GammaArrival(burstiness=0.5), 4.0, 50, seed=7)
    assert a == offsets(GammaArrival(burstiness=0.5), 4.0, 50, seed=7)
    assert a != offsets(GammaArrival(burstiness=0.5), 4.0, 50, seed=8)
    assert a[0] == 0.0 and a[-1] == pytest.approx(49 / 4.0)
    # burstiness .inf: evenly spaced, as constant
    assert offsets(GammaArrival(burstiness=math.inf), 4.0, 5) == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])
    # a rated shape at rate inf: a closed loop
    assert offsets(GammaArrival(burstiness=0.5), math.inf, 3) == [0.0] * 3


def test_ramp_instantaneous_rate():
    ramp = RampArrival(start_rate=2, end_rate=10, duration_s=20, burstiness=math.inf)
    assert [ramp_rate(ramp, t) for t in (0, 5, 10, 20, 30)] == [2, 4, 6, 10, 10]
    t = np.array(offsets(ramp, math.inf, 400))        # a ramp's rates are its own: the cell's rate is unused
    assert t[0] == 0 and (np.diff(t) > 0).all()
    # the deterministic ramp: the i-th request where the expected count reaches i
    assert ramp_time(ramp, 15) == pytest.approx(5.0)   # Lambda(5) = 2 * 5 + (8 / 40) * 5^2 = 15
    mids, rates = (t[1:] + t[:-1]) / 2, 1 / np.diff(t)
    expect = np.array([ramp_rate(ramp, m) for m in mids])
    assert rates == pytest.approx(expect, rel=0.02)
    # after duration_s, end_rate exactly
    after = np.diff(t[t > 21])
    assert after == pytest.approx(1 / 10)


def test_ramp_poisson_counts_follow_the_rate():
    ramp = RampArrival(start_rate=0, end_rate=20, duration_s=10)     # burstiness 1: Poisson at each moment
    seeds = 200
    counts = np.zeros(5)
    for seed in range(seeds):
        t = np.array(offsets(ramp, math.inf, 150, seed=seed))
        counts += np.histogram(t, bins=[0, 2, 4, 6, 8, 10])[0]
    # expected per 2-s window: the integral of rate(t) = 2t, i.e. 4, 12, 20, 28, 36 (the first request at 0
    # counts in the first window)
    expect = np.array([4, 12, 20, 28, 36]) * seeds
    assert counts == pytest.approx(expect + np.array([seeds, 0, 0, 0, 0]), rel=0.05)


def test_ramp_down_and_from_zero():
    down = RampArrival(start_rate=10, end_rate=2, duration_s=10, burstiness=math.inf)
    assert ramp_time(down, 60) == pytest.approx(10.0)          # Lambda(10) = 10 * (10 + 2) / 2
    assert ramp_time(down, 62) == pytest.approx(11.0)          # then 2/s
    zero = RampArrival(start_rate=0, end_rate=4, duration_s=2, burstiness=math.inf)
    assert ramp_time(zero, 0) == 0 and ramp_time(zero, 1) == pytest.approx(1.0)   # Lambda(t) = t^2


def test_trace_times_are_its_gaps():
    trace = TraceArrival(gaps_s=[0.0, 0.5, 0.25, 1.0])
    assert offsets(trace, math.inf, 4) == pytest.approx([0, 0.5, 0.75, 1.75])
    assert offsets(trace, 8.0, 2) == pytest.approx([0, 0.5])   # the rate is not used
    with pytest.raises(ValueError, match="cannot time 5"):
        offsets(trace, math.inf, 5)


def test_the_plain_names_and_the_typed_shapes():
    t = TypeAdapter(MatrixArrival)
    assert t.validate_python("poisson").kind == "poisson" and t.validate_python("constant").kind == "constant"
    assert t.validate_python({"kind": "gamma", "burstiness": 0.5}) == GammaArrival(burstiness=0.5)
    with pytest.raises(ValidationError, match="burstiness"):
        t.validate_python({"kind": "gamma"})
    with pytest.raises(ValidationError, match="end_rate"):
        t.validate_python({"kind": "ramp", "start_rate": 1, "end_rate": -1, "duration_s": 5})
    with pytest.raises(ValidationError, match="does not match"):
        t.validate_python({"kind": "trace", "gaps_s": [0.0]})      # a trace's schedule is its workload's
    assert TypeAdapter(Arrival).validate_python({"kind": "trace", "gaps_s": [0.0]}).kind == "trace"


def test_load_profile_takes_a_shape_or_a_name():
    assert load_generator.LoadProfile(rate=4, arrival="constant").name == "constant-rate=4/s max-concurrency=1"
    gamma = load_generator.LoadProfile(rate=4, arrival={"kind": "gamma", "burstiness": 0.5}, concurrency=2)
    assert gamma.name == "gamma-rate=4/s max-concurrency=2" and not gamma.closed
    ramp = load_generator.LoadProfile(arrival=RampArrival(start_rate=1, end_rate=2, duration_s=3))
    assert not ramp.closed and ramp.name == "ramp max-concurrency=1"     # rate inf, yet not a closed loop
    assert load_generator.LoadProfile().closed


def test_an_infinite_burstiness_crosses_to_the_worker():
    from adapters.contract.specs import ServeSpec

    for arrival in (GammaArrival(burstiness=math.inf), RampArrival(start_rate=1, end_rate=2, duration_s=3,
                                                                   burstiness=math.inf)):
        spec = ServeSpec(requests=1, time_limit_s=1, arrival=arrival, request_timeout_s=1)
        assert ServeSpec.model_validate_json(spec.model_dump_json()).arrival == arrival
