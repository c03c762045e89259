"""`bench diff-endpoints`: the same prompts to two OpenAI-compatible servers, N times each at temperature 0,
or (`--temperature T`) with N seeds each at the sampler settings the deployments serve with.

Serving mode itself (server process, load generator, output capture) lives engine-side in `adapters`, since it
runs in the worker; this module is the driver-side comparison of two endpoints nobody here started.
Requests carry the sampling fields that make every server tried here plainly greedy (temperature 0,
no penalties; llama-cpp-python's repeat_penalty defaults to 1.1 otherwise) and a fixed seed.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from adapters.contract.openai_api import Prompt, ServerApi, completion_body
from adapters.contract.specs import engine_seed

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
    token_logprobs: list[float] | None = None   # each generated token's logprob, as the server reports it


def _output(resp: dict) -> Output:
    c = resp["choices"][0]
    lp = c.get("logprobs") or {}
    return Output(text=c.get("text") or "", tokens=lp.get("tokens"), finish_reason=c.get("finish_reason"),
                  completion_tokens=(resp.get("usage") or {}).get("completion_tokens"),
                  token_logprobs=[x for x in lp.get("token_logprobs") or [] if x is not None] or None)


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
                out[i].append(_output(r.json()))
    return out


def fetch_samples(url: str, prompts: Sequence[Prompt], seeds: int, max_tokens: int, sampler: dict[str, float],
                  timeout_s: float = 120.0, model: str | None = None, first_seed: int = 0) -> list[list[Output]]:
    """outputs[prompt][s]: one seeded sample per (prompt, seed first_seed + s, s < seeds) at the given sampler
    fields (the request's seed: engine_seed(seed, prompt), a random stream of its own per prompt)."""
    import httpx

    out: list[list[Output]] = [[] for _ in prompts]
    with httpx.Client(timeout=timeout_s, trust_env=False) as client:
        for i, p in enumerate(prompts):
            for seed in range(first_seed, first_seed + seeds):
                body = completion_body(GENERIC_API, p, max_tokens, engine_seed(seed, i), False, model, logprobs=1) | sampler
                r = client.post(url.rstrip("/") + "/v1/completions", json=body)
                r.raise_for_status()
                out[i].append(_output(r.json()))
    return out


ECHO_TOP_K = (40, 1000)     # candidates asked a position where a server's echo is shifted: first, then where one is missing


def _echo(client, url: str, text: str, k: int) -> dict:
    body = completion_body(GENERIC_API, text, 1, 0, False, None, logprobs=k) | {"echo": True}
    r = client.post(url.rstrip("/") + "/v1/completions", json=body)
    return (r.json()["choices"][0].get("logprobs") or {}) if r.status_code == 200 else {}


def echo_alignment(url: str, prompts: Sequence[Prompt], timeout_s: float = 120.0) -> tuple[str | None, str]:
    """How the server's echo logprobs line up with the echoed tokens: ("aligned", how) where entry i is
    token i's logprob given the tokens before it (the OpenAI convention: vLLM, llama.cpp on a model with
    BOS), ("shifted", how) where entry i holds the distribution of token i+1 labelled as token i
    (llama-cpp-python on a model without BOS: its token_logprobs are then of the wrong token, and only
    the top_logprobs of entry i-1 hold token i's), or (None, why). Decided against the server's own
    logprob of its greedy next token g after a prompt P (generation logprobs line up everywhere): the
    echo of P + g has it at g's entry (aligned) or in the entry before (shifted)."""
    import httpx

    tried = []
    with httpx.Client(timeout=timeout_s, trust_env=False) as client:
        for p in prompts:
            if not isinstance(p, str):
                continue
            r = client.post(url.rstrip("/") + "/v1/completions",
                            json=completion_body(GENERIC_API, p, 1, 0, False, None, logprobs=1))
            lp = (r.json()["choices"][0].get("logprobs") or {}) if r.status_code == 200 else {}
            if not lp.get("tokens") or lp.get("token_logprobs", [None])[0] is None:
                return None, "the server returns no generation logprobs"
            g, want = lp["tokens"][0], lp["token_logprobs"][0]
            e = _echo(client, url, p + g, 1)
            offsets, toks, vals, tops = (e.get(x) or [] for x in ("text_offset", "tokens", "token_logprobs", "top_logprobs"))
            if not offsets or min(offsets) >= len(p):
                return None, "the server echoes no prompt logprobs"
            j = next((j for j, (o, t) in enumerate(zip(offsets, toks)) if o == len(p) and t == g), None)
            if j is None or j < 1:
                tried.append("its tokenization of prompt + greedy token merges them")
                continue
            gap = {"aligned": abs(vals[j] - want) if vals[j] is not None else math.inf,
                   "shifted": abs(tops[j - 1][g] - want) if tops[j - 1] and g in tops[j - 1] else math.inf}
            best = min(gap, key=gap.get)
            other = max(gap.values())
            if gap[best] < 0.02 and other > 0.1:
                return best, (f"echo entry {'i' if best == 'aligned' else 'i-1'} held token i's logprob "
                              f"(within {gap[best]:.1g} nats of its generation logprob)")
            tried.append(f"echo gaps {gap}")
    return None, "echo logprobs match neither alignment of the server's generation logprobs" + (
        f" ({'; '.join(tried)})" if tried else "")


def score_tokens(url: str, prompt: str, texts: Sequence[str], alignment: str, timeout_s: float = 120.0
                 ) -> list[list[float] | None]:
    """Each text's per-token logprobs after `prompt` under the server at `url` (teacher-forced: prompt +
    text sent with echo; the server's raw logprobs, no sampler), for the tokens that start inside the
    text (by text_offset, so the server's own tokenization of the boundary does not matter); `alignment`
    from `echo_alignment`. Where shifted, a token is looked up among the candidates of the entry before
    it (ECHO_TOP_K: 40, then 1000 where one is missing); one beyond them all gets the least of them (an
    upper bound), a token with no entry before it (after a one-token prompt) is left out. None where
    the server returned no logprobs. Deterministic in the text: the same text gives the same list."""
    import httpx

    out: list[list[float] | None] = []
    lo = len(prompt)
    with httpx.Client(timeout=timeout_s, trust_env=False) as client:
        for text in texts:
            hi = len(prompt) + len(text)
            for k in (ECHO_TOP_K if alignment == "shifted" else (1,)):
                e = _echo(client, url, prompt + text, k)
                offsets, toks, vals, tops = (e.get(x) or [] for x in ("text_offset", "tokens", "token_logprobs",
                                                                      "top_logprobs"))
                inside = [j for j, o in enumerate(offsets) if lo <= o < hi]
                if not offsets:
                    mine, missing = None, False
                elif alignment == "aligned":
                    mine, missing = [vals[j] for j in inside if vals[j] is not None], False
                else:
                    cand = [tops[j - 1] if j >= 1 else None for j in inside]
                    missing = any(c and toks[j] not in c for j, c in zip(inside, cand))
                    mine = [c.get(toks[j], min(c.values())) for j, c in zip(inside, cand) if c]
                if not missing:
                    break
            out.append(mine)
    return out


def next_token_candidates(url: str, prompts: Sequence[Prompt], k: int, timeout_s: float = 120.0,
                          model: str | None = None) -> list[dict[str, float] | None]:
    """Per prompt, the server's top-k next-token logprobs (token string -> logprob), from one greedy
    token with logprobs=k; None where the server returned none."""
    import httpx

    out: list[dict[str, float] | None] = []
    with httpx.Client(timeout=timeout_s, trust_env=False) as client:
        for p in prompts:
            r = client.post(url.rstrip("/") + "/v1/completions",
                            json=completion_body(GENERIC_API, p, 1, 0, False, model, logprobs=k))
            lp = (r.json()["choices"][0].get("logprobs") or {}) if r.status_code == 200 else {}
            top = (lp.get("top_logprobs") or [None])[0]
            out.append(dict(top) if top else None)
    return out


def first_token_against(candidates: list[dict[str, float] | None], outs: list[list[Output]], sampler: dict,
                        order: tuple[str, ...] | None) -> dict[str, Any]:
    """The first-token test (orchestrator/judge/sampling_stats.py) of B's samples against A's next-token
    logprobs after the sampler, matched by token string."""
    import numpy as np

    from orchestrator.judge.sampling_stats import first_token_test, sampler_probs

    if order is None and (sampler.get("top_p", 1.0) < 1.0 or sampler.get("top_k") or sampler.get("min_p")):
        return {"verdict": "n/a", "why": "the order of the sampler's filters is the engine's own: pass --sampler-order"}
    vocab: dict[str, int] = {}
    dists, draws = {}, {}
    for i, (cand, po) in enumerate(zip(candidates, outs)):
        if not cand:
            dists[i] = "A returned no next-token logprobs"
        else:
            ids = np.array([vocab.setdefault(t, len(vocab)) for t in cand])
            kept, q, why = sampler_probs(ids, np.array(list(cand.values())), order=order or (), **sampler)
            dists[i] = why if why else (kept, q)
        if all(o.tokens for o in po):
            draws[i] = np.array([vocab.setdefault(o.tokens[0], len(vocab)) for o in po])
    t = first_token_test(dists, draws)
    if t is None:
        return {"verdict": "n/a", "why": "; ".join(sorted({str(d) for d in dists.values() if isinstance(d, str)}))
                or "B returned no token strings"}
    return {"p_value": t.p_value, "n": t.n, "prompts": t.prompts, "outside": t.outside, "test": t.test,
            "skipped": {str(k): v for k, v in t.skipped.items()}}


def _score_all(url: str, prompts: Sequence[Prompt], outs: dict[str, list[list[Output]]], alignment: str | None,
               timeout_s: float) -> dict[str, list[list[list[float] | None]]] | None:
    """Every sample of both sides scored under `url`, per prompt each distinct text once, in sorted order:
    the scores are a function of the text and of the pooled samples only, never of which side drew a
    text (a stateful server, its prefix cache say, cannot then tell the sides apart)."""
    if alignment is None or not all(isinstance(p, str) for p in prompts):
        return None
    out: dict[str, list[list[list[float] | None]]] = {e: [] for e in outs}
    for i, p in enumerate(prompts):
        texts = sorted({o.text for e in outs for o in outs[e][i]})
        by_text = dict(zip(texts, score_tokens(url, p, texts, alignment, timeout_s)))
        for e in outs:
            out[e].append([by_text[o.text] for o in outs[e][i]])
    return out


def diff_sampled(url_a: str, url_b: str, prompts: Sequence[Prompt], seeds: int, max_tokens: int, temperature: float,
                 top_p: float = 1.0, top_k: int = 0, alpha: float = 0.01, timeout_s: float = 120.0,
                 sampler_order: tuple[str, ...] | None = None, next_top_k: int = 100,
                 first_seed: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    """Seeded samples from both endpoints: per seed, the share of prompts whose outputs differ (the
    classic diff/total; equal seeds promise equal samples only on the same engine and build), A's and
    B's first seed sent again (does a seed repeat?), and the distribution tests of the sampling layer
    (orchestrator/judge/sampling_stats.py), each a seed-level permutation test:
    - two-sample: each sample's mean token logprob under A (both sides' samples scored by A through
      echo: B's samples from another distribution score lower under A, by about KL(B || A) per token),
      or, where A does not echo logprobs, under its own endpoint;
    - likelihood ratio, where both echo: each sample's log p_A(x) - log p_B(x), summed over its tokens,
      both sides' samples scored under both servers (raw logprobs, no sampler): the Neyman-Pearson
      statistic for A against B; its expected gap is -(KL(A||B) + KL(B||A)) per token x tokens. It is 0
      for every sample where both servers compute the same logprobs (a sampler change alone): the
      two-sample test is there for that;
    - first token: B's first tokens against A's next-token logprobs after the sampler.
    The verdict is `different` when any p < alpha / the tests run (Bonferroni). `first_seed` (A's, B's):
    the seeds each side draws start there (different seeds on identical servers: the tests' false alarms)."""
    import numpy as np

    from adapters.contract.seed_power import seeds_to_detect
    from orchestrator.judge.sampling_stats import permutation_test

    sampler = {"temperature": temperature, "top_p": top_p, "top_k": top_k}
    urls = {"A": url_a, "B": url_b}
    start = dict(zip(("A", "B"), first_seed))
    outs = {e: fetch_samples(u, prompts, seeds, max_tokens, sampler, timeout_s, first_seed=start[e]) for e, u in urls.items()}
    again = {e: fetch_samples(u, prompts, 1, max_tokens, sampler, timeout_s, first_seed=start[e]) for e, u in urls.items()}
    report: dict[str, Any] = {"endpoints": {"A": url_a, "B": url_b}, "prompts": len(prompts), "seeds": seeds,
                              "first_seed": start, "max_tokens": max_tokens, "sampler": sampler, "per_seed": [],
                              "differences": []}
    for seed in range(seeds):
        differing = sum(_first_divergence(outs["A"][i][seed], outs["B"][i][seed]) is not None for i in range(len(prompts)))
        report["per_seed"].append({"seed": seed, "differing": differing, "total": len(prompts)})
    report["repeatable"] = {e: sum(_first_divergence(outs[e][i][0], again[e][i][0]) is None for i in range(len(prompts)))
                            / len(prompts) for e in outs}
    differing = sum(x["differing"] for x in report["per_seed"])
    # equal seeds promise equal samples where both endpoints repeat their own seeds (the same engine
    # and build, say): then any difference is one; otherwise only the distribution can be compared
    report["seed_by_seed"] = ("n/a: A and B drew different seeds" if start["A"] != start["B"] else
                              "n/a: a seed does not repeat on " + " and ".join(e for e, v in report["repeatable"].items()
                                                                               if v < 1.0)
                              if min(report["repeatable"].values()) < 1.0
                              else "identical" if differing == 0 else f"differ ({differing} of {seeds * len(prompts)})")
    report["echo"] = {e: dict(zip(("alignment", "how"), echo_alignment(u, prompts, timeout_s))) for e, u in urls.items()}
    scored = {e: _score_all(u, prompts, outs, report["echo"][e]["alignment"], timeout_s) for e, u in urls.items()}
    under_a = scored["A"] is not None and all(v is not None for e in outs for po in scored["A"][e] for v in po)
    stats = {e: [(i, s, float(np.mean(scored["A"][e][i][s] or [0.0])) if under_a else float(np.mean(o.token_logprobs)))
                 for i, po in enumerate(outs[e]) for s, o in enumerate(po) if under_a or o.token_logprobs]
             for e in outs}
    first = report["first_token"] = first_token_against(next_token_candidates(url_a, prompts, next_top_k, timeout_s),
                                                        outs["B"], sampler, sampler_order)
    # the likelihood ratio: where both servers score every sample
    if not under_a:
        lr: dict[str, Any] = {"verdict": "n/a", "why": "A does not score text: " + (report["echo"]["A"]["how"]
                                                                                   if scored["A"] is None else
                                                                                   "a sample got no echo logprobs")}
    elif scored["B"] is None or any(v is None for e in outs for po in scored["B"][e] for v in po):
        lr = {"verdict": "n/a", "why": "B does not score text: " + (report["echo"]["B"]["how"] if scored["B"] is None
                                                                   else "a sample got no echo logprobs")}
    else:
        rows = {e: [(i, s, sum(scored["A"][e][i][s]) - sum(scored["B"][e][i][s]), len(scored["A"][e][i][s]))
                    for i in range(len(prompts)) for s in range(seeds)] for e in outs}
        (ia, da, la, ta), (ib, db, lb, tb) = (tuple(np.array(x) for x in zip(*rows[e])) for e in ("A", "B"))
        t = permutation_test(la, ia, da, lb, ib, db)
        tokens = float(np.mean(np.concatenate([ta, tb]))) or 1.0
        lr = {"test": "seed-level permutation (per-sample log p_A - log p_B, summed over its tokens, both scored "
                      "under both servers; centred per prompt)", "p_value": t.p_value, "shift": t.shift,
              "shift_per_token": t.shift / tokens, "n_a": t.n_base, "n_b": t.n_cell, "values": la, "prompts_of": ia,
              "seeds_of": da}
    report["likelihood_ratio"] = lr
    if stats["A"] and stats["B"]:
        (ia, da, sa), (ib, db, sb) = (tuple(np.array(x) for x in zip(*stats[e])) for e in ("A", "B"))
        t = permutation_test(sa, ia, da, sb, ib, db)
        need = seeds_to_detect(sa, ia, da, 0.05, alpha)
        ps = [t.p_value] + [x["p_value"] for x in (first, lr) if "p_value" in x]
        level = alpha / len(ps)      # Bonferroni over the tests run: the verdict's false-alarm rate stays alpha
        if "p_value" in lr:
            v, pr, sd = lr.pop("values"), lr.pop("prompts_of"), lr.pop("seeds_of")
            lr["seeds_for_observed_shift"] = seeds_to_detect(v, pr, sd, abs(lr["shift"]), level) if lr["shift"] else None
        report["distribution"] = {"seeds_to_detect_0.05_nats": need,
                                  "seeds_for_observed_shift": seeds_to_detect(sa, ia, da, abs(t.shift), level)
                                  if t.shift else None, "test": t.test.replace("raw logprob", "logprob under A" if under_a
                                                         else "logprob under its own endpoint"),
                                  "p_value": t.p_value, "shift": t.shift, "n_a": t.n_base, "n_b": t.n_cell,
                                  "alpha": alpha, "tests": len(ps), "level_each": level,
                                  "verdict": "different" if min(ps) < level else "same distribution"}
    else:
        report["distribution"] = {"verdict": "n/a", "why": "a server returned no token logprobs"}
        for k in ("values", "prompts_of", "seeds_of"):
            lr.pop(k, None)
    return report


def format_sampled_report(report: dict[str, Any]) -> str:
    s = report["sampler"]
    differing = sum(x["differing"] for x in report["per_seed"])
    total = sum(x["total"] for x in report["per_seed"])
    lines = [f"A = {report['endpoints']['A']}", f"B = {report['endpoints']['B']}",
             f"{report['prompts']} prompts x {report['seeds']} seeds, max_tokens {report['max_tokens']}, temperature "
             f"{s['temperature']:g}, top_p {s['top_p']:g}, top_k {s['top_k']}",
             f"  A vs B, same seed: {differing}/{total} differing outputs ({differing / max(total, 1):.1%}); per seed: "
             + ", ".join(f"{x['differing']}/{x['total']}" for x in report["per_seed"]),
             "  a seed sent again gives the same output: " + ", ".join(f"{e} {v:.0%}" for e, v in report["repeatable"].items()),
             f"  seed by seed: {report['seed_by_seed']}"]
    d = report["distribution"]
    if d["verdict"] == "n/a":
        lines.append(f"  distribution: n/a ({d['why']})")
    else:
        lines.append(f"  distribution: {d['verdict']} (alpha {d['alpha']:g} over {d['tests']} test(s)); two-sample "
                     f"p={d['p_value']:.3g}, shift "
                     f"{d['shift']:+.4f} nats/token; {d['n_a']} vs {d['n_b']} samples; {d['test']}); seeds per prompt "
                     f"to find a 0.05-nat shift: {d['seeds_to_detect_0.05_nats']}")
        if d["verdict"] == "same distribution":
            lines.append(f"    no difference detected at n={d['n_b']} ({report['seeds']} seeds a prompt)"
                         + (f"; ~{d['seeds_for_observed_shift']} seeds a prompt needed to detect a shift of this size"
                            if d.get("seeds_for_observed_shift") else ""))
        if d["level_each"] < d["alpha"]:
            lines.append(f"    each test at {d['level_each']:.3g} (Bonferroni over {d['tests']} tests)")
    lr = report.get("likelihood_ratio") or {}
    if "p_value" in lr:
        lines.append(f"  likelihood ratio log p_A - log p_B (both sides' samples scored under both servers): "
                     f"p={lr['p_value']:.3g}, shift {lr['shift']:+.4f} nats/sample ({lr['shift_per_token']:+.4f}/token), "
                     f"{lr['n_a']} vs {lr['n_b']} samples; {lr['test']}"
                     + (f"; ~{lr['seeds_for_observed_shift']} seeds a prompt for a shift of this size"
                        if lr.get("seeds_for_observed_shift") and lr["p_value"] >= d.get("level_each", 0) else ""))
    elif lr:
        lines.append(f"  likelihood ratio: n/a ({lr['why']})")
    f = report.get("first_token") or {}
    if "p_value" in f:
        lines.append(f"  first token of B against A's next-token logprobs: p={f['p_value']:.3g}, {f['n']} draws over "
                     f"{f['prompts']} prompt(s)" + (f", {f['outside']} outside A's kept tokens" if f["outside"] else "")
                     + f"; {f['test']}" + (f"; not tested: {f['skipped']}" if f["skipped"] else ""))
    elif f:
        lines.append(f"  first token: n/a ({f['why']})")
    return "\n".join(lines)


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
