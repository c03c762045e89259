"""`bench diff-endpoints`: the same prompts to two OpenAI-compatible servers, N times each at temperature 0.

Serving mode itself (server process, load generator, output capture) lives engine-side in `adapters`, since it
runs in the worker; this module is the driver-side comparison of two endpoints nobody here started.
Requests carry the sampling fields that make every server tried here plainly greedy (temperature 0,
no penalties; llama-cpp-python's repeat_penalty defaults to 1.1 otherwise) and a fixed seed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from adapters.server_process import Prompt, ServerApi, completion_body

# any OpenAI-compatible server: text prompts, token strings back, the neutral sampler fields llama.cpp needs
GENERIC_API = ServerApi(prompt_ids=False, ids_in_logprobs=False, prompt_logprobs=None, ignore_eos=False, batches=True,
                        greedy_fields={"top_p": 1.0, "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0,
                                       "presence_penalty": 0.0, "frequency_penalty": 0.0})


def read_prompts(path: str | os.PathLike) -> list[str]:
    """Text lines (blank lines skipped), or JSONL with a "prompt" field per line."""
    out = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                out.append(json.loads(line)["prompt"])
                continue
            except (json.JSONDecodeError, KeyError):
                pass
        out.append(line)
    return out


@dataclass
class Output:
    text: str
    tokens: list[str] | None          # token strings where the server returned logprobs
    finish_reason: str | None
    completion_tokens: int | None


def _first_divergence(a: Output, b: Output) -> dict[str, Any] | None:
    """None when equal; else the first differing token index (where both have tokens) and char index."""
    if a.text == b.text and (a.tokens is None or b.tokens is None or a.tokens == b.tokens):
        return None
    char = next((i for i, (x, y) in enumerate(zip(a.text, b.text)) if x != y), min(len(a.text), len(b.text)))
    tok = None
    if a.tokens is not None and b.tokens is not None:
        tok = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y),
                   min(len(a.tokens), len(b.tokens)))
        char = len("".join(a.tokens[:tok]))
    lo = max(0, char - 20)
    return {"token_index": tok, "char_index": char, "a_context": a.text[lo:char + 30], "b_context": b.text[lo:char + 30]}


def fetch_outputs(url: str, prompts: Sequence[Prompt], repeats: int, max_tokens: int, seed: int = 0,
                  timeout_s: float = 120.0, model: str | None = None) -> list[list[Output]]:
    """outputs[prompt][repeat]: greedy completions, with logprobs=1 for the token strings."""
    import httpx

    out: list[list[Output]] = [[] for _ in prompts]
    with httpx.Client(timeout=timeout_s, trust_env=False) as client:
        for _ in range(repeats):
            for i, p in enumerate(prompts):
                r = client.post(url.rstrip("/") + "/v1/completions",
                                json=completion_body(GENERIC_API, p, max_tokens, seed, False, model, logprobs=1))
                r.raise_for_status()
                resp = r.json()
                c = resp["choices"][0]
                lp = c.get("logprobs") or {}
                out[i].append(Output(text=c.get("text") or "", tokens=lp.get("tokens"),
                                     finish_reason=c.get("finish_reason"),
                                     completion_tokens=(resp.get("usage") or {}).get("completion_tokens")))
    return out


def diff_endpoints(url_a: str, url_b: str, prompts: Sequence[Prompt], repeats: int = 2, max_tokens: int = 32,
                   seed: int = 0, timeout_s: float = 120.0) -> dict[str, Any]:
    """Shares of differing outputs: within A's repeats and B's (each repeat against repeat 0), and A vs B
    (repeat r of A against repeat r of B); every differing pair with where it first differs."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    outs = {"A": fetch_outputs(url_a, prompts, repeats, max_tokens, seed, timeout_s),
            "B": fetch_outputs(url_b, prompts, repeats, max_tokens, seed, timeout_s)}
    report: dict[str, Any] = {"endpoints": {"A": url_a, "B": url_b}, "prompts": len(prompts), "repeats": repeats,
                              "max_tokens": max_tokens, "comparisons": {}, "differences": []}
    for name, pairs in (("within A", [("A", i, 0, "A", i, r) for i in range(len(prompts)) for r in range(1, repeats)]),
                        ("within B", [("B", i, 0, "B", i, r) for i in range(len(prompts)) for r in range(1, repeats)]),
                        ("A vs B", [("A", i, r, "B", i, r) for i in range(len(prompts)) for r in range(repeats)])):
        differing = 0
        for ea, i, ra, eb, _, rb in pairs:
            d = _first_divergence(outs[ea][i][ra], outs[eb][i][rb])
            if d is not None:
                differing += 1
                report["differences"].append({"comparison": name, "prompt_index": i, "a": f"{ea}[{ra}]",
                                              "b": f"{eb}[{rb}]", **d})
        report["comparisons"][name] = {"pairs": len(pairs), "differing": differing,
                                       "share": differing / len(pairs) if pairs else None}
    report["token_strings"] = all(o.tokens is not None for e in outs.values() for po in e for o in po)
    return report


def format_diff_report(report: dict[str, Any], limit: int = 20) -> str:
    lines = [f"A = {report['endpoints']['A']}", f"B = {report['endpoints']['B']}",
             f"{report['prompts']} prompts x {report['repeats']} repeats, max_tokens {report['max_tokens']}, temperature 0"]
    for name, c in report["comparisons"].items():
        share = "n/a (one repeat)" if c["share"] is None else f"{c['share']:.1%}"
        lines.append(f"  {name:9s} differing outputs: {c['differing']}/{c['pairs']} ({share})")
    diffs = report["differences"]
    if diffs:
        lines.append("first divergence (token index; text around it):")
        for d in diffs[:limit]:
            where = f"token {d['token_index']}" if d["token_index"] is not None else f"char {d['char_index']}"
            lines.append(f"  [{d['comparison']}] prompt {d['prompt_index']} {d['a']} vs {d['b']}: {where}")
            lines.append(f"      {d['a']}: {d['a_context']!r}")
            lines.append(f"      {d['b']}: {d['b_context']!r}")
        if len(diffs) > limit:
            lines.append(f"  ... and {len(diffs) - limit} more")
    return "\n".join(lines)
