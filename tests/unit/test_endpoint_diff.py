"""`bench diff-endpoints`' own logic without a server process: the likelihood ratio's scoring on fake
servers in process (httpx's MockTransport; echo aligned, shifted or absent), and its prompt files.
(Against real llama.cpp servers: e2e/test_serve.py.)"""

from __future__ import annotations

import json

import pytest

from orchestrator.endpoints.diff import read_prompts


def _fake_server(kind: str):
    """A one-character-a-token OpenAI completions server over the vocabulary "abc" whose next-token
    logprobs are a fixed function of the prefix: echo "aligned" (OpenAI's convention), "shifted"
    (llama-cpp-python's on a model without BOS) or "none" (no echo)."""
    import httpx
    import numpy as np

    def dist(prefix: str) -> dict[str, float]:
        z = np.array([len(prefix) % 3, ord(prefix[-1]) % 2 if prefix else 0, 0.5]) * 1.5
        return dict(zip("abc", (z - np.log(np.exp(z).sum())).tolist()))

    def handler(request):
        body = json.loads(request.content)
        p, k = body["prompt"], body.get("logprobs") or 1
        rng = np.random.default_rng(body["seed"])
        text = ""
        for _ in range(body["max_tokens"]):
            d = dist(p + text)
            text += (max(d, key=d.get) if not body.get("temperature")
                     else rng.choice(list(d), p=np.exp(list(d.values()))))
        top = lambda d: dict(sorted(d.items(), key=lambda x: -x[1])[:k])  # noqa: E731
        full = p + text
        if body.get("echo") and kind != "none":
            pos = range(len(full))
            if kind == "aligned":
                vals = [None] + [dist(full[:i])[full[i]] for i in pos][1:]
                tops = [None] + [top(dist(full[:i])) for i in pos][1:]
            else:     # entry i: the distribution of token i+1, labelled as token i
                vals = [None] + [dist(full[:i + 1])[full[i]] for i in pos][1:]
                tops = [None] + [top(dist(full[:i + 1])) for i in pos][1:]
            lp = {"tokens": list(full), "text_offset": list(pos), "token_logprobs": vals, "top_logprobs": tops}
            text = full
        else:
            lp = {"tokens": list(text), "text_offset": [len(p) + i for i in range(len(text))],
                  "token_logprobs": [dist(p + text[:i])[c] for i, c in enumerate(text)],
                  "top_logprobs": [top(dist(p + text[:i])) for i in range(len(text))]}
        return httpx.Response(200, json={"choices": [{"text": text, "logprobs": lp, "finish_reason": "length"}],
                                         "usage": {"completion_tokens": body["max_tokens"]}})
    return handler, dist


def test_likelihood_ratio_scores_either_echo_and_says_why_not(monkeypatch):
    """The likelihood ratio's scoring on fake servers: echo found aligned or shifted against the server's
    own generation logprobs, each read to the true per-token logprobs; a server without echo leaves the
    test n/a with the reason, the other tests run."""
    import httpx

    from orchestrator.endpoints import diff as ed

    handlers = {kind: _fake_server(kind) for kind in ("aligned", "shifted", "none")}
    real = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real(transport=httpx.MockTransport(
        lambda r: handlers[r.url.host][0](r)), **kw))
    dist = handlers["aligned"][1]
    want = [[dist("ab" + t[:i])[c] for i, c in enumerate(t)] for t in ("cab", "", "bb")]
    for kind in ("aligned", "shifted"):
        assert ed.echo_alignment(f"http://{kind}", ["ab"])[0] == kind
        got = ed.score_tokens(f"http://{kind}", "ab", ["cab", "", "bb"], kind)
        assert got == [pytest.approx(w) for w in want], (kind, got)
    assert ed.echo_alignment("http://none", ["ab"]) == (None, "the server echoes no prompt logprobs")
    r = ed.diff_sampled("http://aligned", "http://none", ["ab", "ca"], seeds=4, max_tokens=3, temperature=1.0)
    assert r["likelihood_ratio"] == {"verdict": "n/a", "why": "B does not score text: the server echoes no prompt logprobs"}
    assert r["distribution"]["tests"] == 2 and "under A" in r["distribution"]["test"]
    r = ed.diff_sampled("http://aligned", "http://shifted", ["ab", "ca"], seeds=4, max_tokens=3, temperature=1.0)
    # the same model behind both: every sample's log p_A - log p_B is 0, and so is the shift
    assert r["likelihood_ratio"]["p_value"] == 1.0 and r["likelihood_ratio"]["shift"] == 0.0
    assert r["distribution"]["tests"] == 3 and "likelihood ratio" in ed.format_sampled_report(r)


def test_read_prompts_text_and_jsonl(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text('hello world\n\n{"prompt": "from json"}\nplain {not json\n')
    assert read_prompts(f) == ["hello world", "from json", "plain {not json"]



def test_seed_offset_draws_other_seeds_on_b(monkeypatch, tmp_path):
    """`bench diff-endpoints --temperature 1 --seed-offset N`: B's seeds start at N, A's at 0 (two identical
    servers on other seeds: the false alarms of the distribution tests); seed by seed is then n/a."""
    import httpx
    from typer.testing import CliRunner

    from orchestrator.cli import app

    handler, _ = _fake_server("aligned")
    seen: dict[str, set] = {"a": set(), "b": set()}

    def record(request):
        body = json.loads(request.content)
        if body.get("temperature"):
            seen[request.url.host].add(body["seed"])
        return handler(request)

    real = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real(transport=httpx.MockTransport(record), **kw))
    prompts = tmp_path / "p.txt"
    prompts.write_text("ab\nca\n")
    args = ["diff-endpoints", "http://a", "http://b", "--prompts", str(prompts), "--temperature", "1", "--seeds", "4",
            "--max-tokens", "3", "--json"]
    same = json.loads(CliRunner().invoke(app, args, catch_exceptions=False).stdout)
    assert same["first_seed"] == {"A": 0, "B": 0} and seen["a"] == seen["b"]
    seen = {"a": set(), "b": set()}
    other = json.loads(CliRunner().invoke(app, [*args, "--seed-offset", "1000"], catch_exceptions=False).stdout)
    assert other["first_seed"] == {"A": 0, "B": 1000}
    assert seen["a"] and seen["b"] and not seen["a"] & seen["b"]       # no seed drawn on both sides
    assert other["seed_by_seed"] == "n/a: A and B drew different seeds"
