"""Serving mode against llama-cpp-python's real OpenAI server on the tiny model (CPU, 127.0.0.1 only).

Every load is bounded (8 requests, max_tokens 8, a time limit); timeouts are generous for a busy machine.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from orchestrator import serve
from tests.conftest import ROOT, bench_cmd

pytestmark = pytest.mark.skipif(serve.server_available() is not None, reason=str(serve.server_available()))

PROMPTS = ["The river ran", "Once upon a time", "In the morning the", "She said that",
           "The old clock", "At night the wind"]
MAX_TOKENS = 8
KV_F32 = {"type_k": "f32", "type_v": "f32", "flash_attn": False}


@pytest.fixture(scope="module")
def ggufs(tiny_model, cache_dir):
    from adapters.gguf_convert import gguf_for

    return {q: str(gguf_for(str(tiny_model), q, cache_dir)[0]) for q in ("fp32", "q4_0")}


def _server(path, tmp_path_factory, name):
    log = tmp_path_factory.mktemp("serve") / f"{name}.log"
    srv = serve.LlamaCppServer(path, n_threads=1, n_ctx=256, log_path=log, startup_timeout_s=180, **KV_F32)
    srv.start()
    return srv


@pytest.fixture(scope="module")
def servers(ggufs, tmp_path_factory):
    started = []
    try:
        for name, q in (("f32_a", "fp32"), ("f32_b", "fp32"), ("q4_0", "q4_0")):
            started.append((name, _server(ggufs[q], tmp_path_factory, name)))
        yield dict(started)
    finally:
        for _, srv in started:
            srv.stop()
        for _, srv in started:
            assert srv.proc.poll() is not None  # stopped: nothing left listening


@pytest.fixture(scope="module")
def captured(servers, ggufs):
    vocab = serve.VocabMap(ggufs["fp32"])
    table, notes, raw = serve.capture_rows(servers["f32_a"].url, PROMPTS, max_tokens=MAX_TOKENS, top_k=4,
                                           vocab=vocab, run_id="r", cell_id="c")
    return table, notes, raw


def test_load_profiles_count_tokens_and_latencies(servers, captured):
    url = servers["f32_a"].url
    _, _, raw = captured
    served_tokens = [r["usage"]["completion_tokens"] for r in raw]
    prompt_tokens = [r["usage"]["prompt_tokens"] for r in raw]
    profiles = [serve.LoadProfile("concurrency", concurrency=1, requests=8, time_limit_s=120),
                serve.LoadProfile("concurrency", concurrency=4, requests=8, time_limit_s=120),
                serve.LoadProfile("rate", rate=8.0, requests=8, time_limit_s=120)]
    for profile in profiles:
        run = serve.run_load(url, PROMPTS, profile, max_tokens=MAX_TOKENS, seed=0, request_timeout_s=60,
                             prompt_tokens=prompt_tokens)
        summary = serve.summarize(run, ttft_slo_ms=60_000, tpot_slo_ms=60_000)
        assert summary["planned"] == 8 and summary["sent"] == 8 and summary["not_sent"] == 0, summary
        assert summary["errors"] == 0, summary["first_errors"]
        assert summary["goodput"] == 1.0
        for res in run["results"]:
            # streamed token count == what the server reports for the same greedy request
            assert res.output_tokens == served_tokens[res.prompt_index], (profile.name, res)
            assert res.finish_reason in ("length", "stop")
            assert res.start < res.first_token <= res.token_times[-1] <= res.end
            assert (res.first_token - res.start) < (res.end - res.start)
            assert len(res.token_times) == res.output_tokens
        assert summary["output_tokens"] == sum(served_tokens[r.prompt_index] for r in run["results"])
        assert summary["ttft_ms_p50"] < summary["e2e_ms_p50"]
        assert summary["total_tok_s"] > summary["output_tok_s"] > 0


def test_errors_and_limits_are_counted(servers):
    dead = f"http://127.0.0.1:{serve.free_port()}"  # nothing listens there
    run = serve.run_load(dead, PROMPTS, serve.LoadProfile("concurrency", concurrency=2, requests=4, time_limit_s=60),
                         max_tokens=4, request_timeout_s=10)
    summary = serve.summarize(run, ttft_slo_ms=1e9)
    assert summary["sent"] == 4 and summary["errors"] == 4 and summary["ok"] == 0
    assert summary["errors_by_kind"] == {"connection": 4} and summary["goodput"] == 0.0

    # an impossible SLO: every request ok, none good
    run = serve.run_load(servers["f32_a"].url, PROMPTS, serve.LoadProfile("rate", rate=50, requests=3, time_limit_s=60),
                         max_tokens=4, request_timeout_s=60)
    summary = serve.summarize(run, ttft_slo_ms=0.0)
    assert summary["ok"] == 3 and summary["goodput"] == 0.0

    # a time limit shorter than the load: what was not sent, or was cut, is counted, nothing vanishes
    run = serve.run_load(servers["f32_a"].url, PROMPTS, serve.LoadProfile("rate", rate=2, requests=5, time_limit_s=1.2),
                         max_tokens=4, request_timeout_s=60)
    summary = serve.summarize(run)
    assert summary["planned"] == 5 and summary["not_sent"] >= 2
    assert summary["ok"] + summary["errors"] == summary["sent"]


def test_capture_rows_match_usage(captured):
    table, notes, raw = captured
    df = table.to_pandas()
    assert set(df["kind"]) == {"generation"}
    for i, r in enumerate(raw):
        rows = df[df["prompt_index"] == i]
        assert len(rows) == r["usage"]["completion_tokens"]
        assert list(rows["position"]) == list(range(r["usage"]["prompt_tokens"],
                                                    r["usage"]["prompt_tokens"] + len(rows)))
    assert (df["token_id"] >= 0).all()                       # every generated token string mapped to one id
    assert all(ids[0] == t for ids, t in zip(df["topk_ids"], df["token_id"]))  # greedy: the top-1 is the token
    assert any("token strings" in n for n in notes)


def test_served_greedy_equals_offline_adapter(servers, captured, ggufs):
    from adapters.base import LoadSpec, ModelSpec
    from adapters.llamacpp import LlamacppAdapter

    table, _, raw = captured
    df = table.to_pandas()
    prompt_ids = [serve.tokenize_remote(servers["f32_a"].url, p) for p in PROMPTS]
    assert all(ids for ids in prompt_ids)
    assert [len(ids) for ids in prompt_ids] == [r["usage"]["prompt_tokens"] for r in raw]
    adapter = LlamacppAdapter()
    adapter.load(LoadSpec(framework="llamacpp", model=ModelSpec(name="tiny", source=ggufs["fp32"]),
                          quantization="gguf", device="cpu",
                          options={"type_k": "f32", "type_v": "f32", "flash_attn": "off", "n_threads": 1}))
    try:
        offline = adapter.greedy(prompt_ids, MAX_TOKENS, 4)
    finally:
        adapter.close()
    vocab = serve.VocabMap(ggufs["fp32"])
    for i, (scores, r) in enumerate(zip(offline, raw)):
        served = df[df["prompt_index"] == i]["token_id"].tolist()
        n = len(served)
        assert served == scores.token_ids[:n].tolist(), (PROMPTS[i], served, scores.token_ids.tolist())
        if r["choices"][0]["finish_reason"] == "stop":  # the server stopped at EOS; offline ignores EOS
            assert n < MAX_TOKENS
        # the served text is the detokenized offline tokens
        text = "".join(next(s for s, t in vocab.ids.items() if t == tid) for tid in scores.token_ids[:n].tolist())
        assert r["choices"][0]["text"] == text


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
    report = serve.diff_endpoints(servers["f32_a"].url, servers["q4_0"].url, PROMPTS, repeats=2,
                                  max_tokens=MAX_TOKENS, timeout_s=120)
    assert report["comparisons"]["within A"]["differing"] == 0
    assert report["comparisons"]["within B"]["differing"] == 0
    cross = report["comparisons"]["A vs B"]
    assert cross["differing"] > 0, report
    d = next(d for d in report["differences"] if d["comparison"] == "A vs B")
    assert d["token_index"] is not None and 0 <= d["token_index"] < MAX_TOKENS
    assert d["a_context"] != d["b_context"]
    text = serve.format_diff_report(report)
    assert "A vs B" in text and "token" in text


def test_server_start_failure_is_reported(tmp_path):
    bad = tmp_path / "missing.gguf"
    srv = serve.LlamaCppServer(bad, log_path=tmp_path / "bad.log", startup_timeout_s=120)
    with pytest.raises(serve.ServerError):
        srv.start()
    assert srv.proc.poll() is not None


def test_read_prompts_text_and_jsonl(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text('hello world\n\n{"prompt": "from json"}\nplain {not json\n')
    assert serve.read_prompts(f) == ["hello world", "from json", "plain {not json"]
