"""Serving mode, engine side: an engine's own OpenAI-compatible server, load against it, its outputs.

It runs inside the worker (the framework's interpreter), so it needs only httpx and numpy besides
this package. The pieces:

- `ServerProcess` starts the command an adapter gives (`Adapter.server`) on a free loopback port,
  in the worker's process group and dying with the worker (so a timeout's kill of the group takes
  the server and its children too), waits until its health path answers, and stops it.
- `run_load` drives one load point against a base URL: `concurrency` requests at most in flight,
  arriving all at once (`rate` inf: a closed loop, the next request when one ends) or at a constant
  or Poisson `rate`; bounded by a request count and a time limit. Streaming completions, timed on the
  client: TTFT is the first chunk that carries a token, then every chunk's tokens and the end.
  Errors, request timeouts, requests cut at the time limit and requests never sent are counted,
  never dropped (`summarize`).
- `capture` asks for greedy completions with logprobs (and teacher-forced prompt logprobs where the
  server offers them) and returns `TokenScores` by token id, as the offline adapters do, so served
  and offline cells land in the same logprobs table and compare position by position.

Each server's protocol differs in a few facts, declared by its adapter as a `ServerApi`: whether a
prompt may be token ids, how token ids come back, how prompt logprobs are asked for, whether EOS can
be ignored, and which sampling fields make its completion greedy and unpenalised.

Latency is measured from when a request is sent; a request waiting for a free slot under the
concurrency cap (a rate above what the cap lets through) waits before it is sent, as in `vllm bench
serve --max-concurrency`, and that wait is reported apart (`queue_ms`).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import math
import os
import random
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence, Union

import numpy as np

from adapters.base import TokenScores

Prompt = Union[str, list[int]]


@dataclass(frozen=True)
class ServerApi:
    """What a server's /v1/completions does, where OpenAI's API leaves it open."""

    prompt_ids: bool                 # takes `prompt` as a list of token ids (else: text)
    ids_in_logprobs: bool            # `return_tokens_as_token_ids`: tokens come back as "token_id:<id>"
    prompt_logprobs: Literal["prompt_logprobs", "echo"] | None   # how teacher-forced logprobs are asked for
    ignore_eos: bool                 # honours `ignore_eos` (else a completion may stop early at EOS)
    batches: bool                    # runs concurrent requests together (else one at a time: batch_mode sequential)
    greedy_fields: dict = field(default_factory=dict)    # sampling fields that make temperature 0 plain greedy
    stream_usage: bool = False       # honours stream_options.continuous_usage_stats (exact tokens per chunk)
    tokenize_path: str | None = None  # the server's own tokenizer endpoint, to check text prompts' ids
    health_path: str = "/v1/models"
    logprobs: bool = True            # returns logprobs at all (else outputs are not captured)


@dataclass
class ServerLaunch:
    """The command an adapter gives for its server, and the facts stored with its cells."""

    argv: list[str]
    model_name: str                  # the `model` field requests must carry
    env: dict[str, str] = field(default_factory=dict)
    engine_args: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    to_id: Callable[[str], int] | None = None   # token string -> id, where the server returns strings
    reset_path: str | None = None    # POST here empties the server's prefix cache (before every timed run)


class ServerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def die_with_parent() -> None:
    """In a child, before exec: the kernel kills it when its parent dies (it must not outlive it)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class ServerProcess:
    """One server child on 127.0.0.1:port. Its output goes to `log_path`."""

    def __init__(self, launch: ServerLaunch, port: int, log_path: str, startup_timeout_s: float = 600.0,
                 health_path: str = "/v1/models"):
        self.launch, self.port, self.log_path = launch, port, log_path
        self.startup_timeout_s, self.health_path = startup_timeout_s, health_path
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - chars))
                return f.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    def exit_description(self) -> str | None:
        code = self.proc.poll() if self.proc else None
        if code is None:
            return None
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"

    def start(self) -> "ServerProcess":
        import httpx

        log = open(self.log_path, "ab")
        # same process group as the worker (no new session): killing the worker's group kills the server
        self.proc = subprocess.Popen(self.launch.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=os.environ | self.launch.env, preexec_fn=die_with_parent)
        log.close()
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            how = self.exit_description()
            if how:
                raise ServerError(f"the server {how} before it answered GET {self.health_path}; "
                                  f"its last output:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + self.health_path, timeout=2.0, trust_env=False).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise ServerError(f"the server did not answer GET {self.health_path} within "
                                  f"{self.startup_timeout_s:g}s; its last output:\n{tail}")
            time.sleep(0.25)

    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc else []

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the server and its children, SIGKILL to whatever is left after the grace period."""
        import psutil

        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        except psutil.Error:
            procs = []
        for p in procs:
            try:
                p.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=grace_s)
        self.proc.poll()


def post(url: str, path: str, headers: dict | None = None, timeout_s: float = 30.0) -> None:
    import httpx

    httpx.post(url.rstrip("/") + path, headers=headers, timeout=timeout_s, trust_env=False).raise_for_status()


def get_json(url: str, path: str, headers: dict | None = None, timeout_s: float = 10.0) -> Any:
    import httpx

    r = httpx.get(url.rstrip("/") + path, headers=headers, timeout=timeout_s, trust_env=False)
    r.raise_for_status()
    return r.json()


def served_model_name(url: str, headers: dict | None = None) -> str | None:
    """The first model id GET /v1/models lists (what an already-running server expects in `model`)."""
    data = get_json(url, "/v1/models", headers).get("data") or []
    return data[0].get("id") if data else None


# ------------------------------------------------------------------------------------------------
# load


@dataclass
class LoadProfile:
    """One load point: at most `concurrency` requests in flight; arrivals all at once (rate inf, a
    closed loop), evenly spaced (constant) or with exponential gaps (poisson) at `rate` per second."""

    concurrency: int = 1
    rate: float = math.inf
    arrival: Literal["constant", "poisson"] = "poisson"
    requests: int = 16                 # at most this many requests
    time_limit_s: float = 60.0         # no request sent or still running after this

    @property
    def name(self) -> str:
        if math.isinf(self.rate):
            return f"concurrency={self.concurrency}"
        return f"{self.arrival}-rate={self.rate:g}/s max-concurrency={self.concurrency}"


@dataclass
class RequestResult:
    index: int
    prompt_index: int
    scheduled: float = 0.0                    # perf_counter of its arrival time
    start: float = 0.0                        # perf_counter when sent (after waiting for a free slot)
    first_token: float | None = None
    token_times: list[float] = field(default_factory=list)
    end: float | None = None
    text: str = ""
    output_tokens: int = 0                    # usage.completion_tokens where the stream gives it, else token chunks
    usage_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None                  # None when ok
    error_kind: str | None = None             # http, timeout, time_limit, connection, truncated, protocol

    @property
    def ok(self) -> bool:
        return self.error is None


def completion_body(api: ServerApi, prompt: Prompt, max_tokens: int, seed: int, stream: bool, model: str | None,
                    logprobs: int | None = None, ignore_eos: bool = True, prompt_logprobs: bool = False) -> dict:
    body: dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "seed": seed, "stream": stream,
                            "temperature": 0.0, **api.greedy_fields}
    if model:
        body["model"] = model
    if stream:
        body["stream_options"] = {"include_usage": True, **({"continuous_usage_stats": True} if api.stream_usage else {})}
    if ignore_eos and api.ignore_eos:
        body["ignore_eos"] = True
    if logprobs is not None:
        body["logprobs"] = logprobs
        if api.ids_in_logprobs:
            body["return_tokens_as_token_ids"] = True
    if prompt_logprobs and logprobs is not None:
        if api.prompt_logprobs == "prompt_logprobs":
            body["prompt_logprobs"] = logprobs
        elif api.prompt_logprobs == "echo":
            body["echo"] = True
    return body


async def _stream_one(client, url: str, body: dict, res: RequestResult) -> None:
    import httpx

    res.start = time.perf_counter()
    try:
        async with client.stream("POST", url.rstrip("/") + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                res.error, res.error_kind = f"HTTP {r.status_code}: {text[:300]}", "http"
                return
            done, counted = False, 0   # counted: tokens the usage stats had reported so far
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue              # blank separators, ": ping" comments
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    res.error, res.error_kind = f"bad stream line: {data[:200]}", "protocol"
                    return
                now = time.perf_counter()
                usage = chunk.get("usage") or {}
                choices = chunk.get("choices") or []
                for choice in choices:
                    text = choice.get("text") or ""
                    if choice.get("finish_reason"):
                        res.finish_reason = choice["finish_reason"]
                    res.text += text
                    if usage.get("completion_tokens") is not None:   # continuous usage: exact per chunk
                        n_tok = usage["completion_tokens"] - counted
                    else:                                            # one token per chunk that carries text
                        lp = choice.get("logprobs") or {}
                        n_tok = len(lp.get("tokens") or []) or (1 if text else 0)
                    if n_tok > 0:
                        if res.first_token is None:
                            res.first_token = now
                        res.token_times.extend([now] * n_tok)
                        res.output_tokens += n_tok
                        counted += n_tok
                if usage:
                    res.usage_tokens = usage.get("completion_tokens", res.usage_tokens)
                    res.prompt_tokens = usage.get("prompt_tokens", res.prompt_tokens)
            res.end = time.perf_counter()
            if res.usage_tokens is not None and res.usage_tokens != res.output_tokens:
                # the server's count wins; the token times keep what the chunks showed
                res.output_tokens = res.usage_tokens
            if not done or res.finish_reason is None:
                res.error = (f"stream ended without {'[DONE]' if not done else 'a finish_reason'} after "
                             f"{res.output_tokens} tokens")
                res.error_kind = "truncated"
            elif res.finish_reason not in ("stop", "length"):
                res.error, res.error_kind = f"finish_reason {res.finish_reason!r}", "truncated"
            elif res.finish_reason == "length" and res.output_tokens < body["max_tokens"]:
                res.error = f"finish_reason 'length' after {res.output_tokens} < max_tokens {body['max_tokens']} tokens"
                res.error_kind = "truncated"
    except httpx.TimeoutException as err:
        res.error, res.error_kind = f"request timeout ({type(err).__name__})", "timeout"
    except httpx.HTTPError as err:
        res.error, res.error_kind = f"{type(err).__name__}: {err}", "connection"


def arrival_offsets(profile: LoadProfile, n: int, seed: int = 0) -> list[float]:
    """Seconds after the start at which each request arrives."""
    if math.isinf(profile.rate):
        return [0.0] * n
    if profile.arrival == "constant":
        return [i / profile.rate for i in range(n)]
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(profile.rate)
    return out


async def run_load_async(url: str, api: ServerApi, prompts: Sequence[Prompt], profile: LoadProfile, *,
                         max_tokens: int, ignore_eos: bool = True, seed: int = 0, request_timeout_s: float = 60.0,
                         model: str | None = None, headers: dict | None = None,
                         prompt_tokens: Sequence[int] | None = None) -> dict[str, Any]:
    """Up to profile.requests streaming completions (prompts cycled) under the profile.
    `prompt_tokens` (per prompt) fills a request's prompt length where the stream reports no usage.
    Returns {"profile", "results": [RequestResult...], "start", "end", "not_sent"}."""
    import httpx

    if not prompts:
        raise ValueError("no prompts")
    limits = httpx.Limits(max_connections=profile.concurrency + 4, max_keepalive_connections=profile.concurrency + 4)
    results: list[RequestResult] = []
    slots = asyncio.Semaphore(profile.concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(request_timeout_s, connect=10.0), limits=limits,
                                 headers=headers, trust_env=False) as client:
        start = time.perf_counter()
        deadline = start + profile.time_limit_s

        async def one(i: int, at: float) -> None:
            res = RequestResult(index=i, prompt_index=i % len(prompts), scheduled=at)
            if prompt_tokens is not None:
                res.prompt_tokens = prompt_tokens[res.prompt_index]
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            async with slots:
                if time.perf_counter() >= deadline:
                    return                      # never sent: counted in not_sent
                if closed:                      # a closed loop sends when a slot frees: no queue to count
                    res.scheduled = time.perf_counter()
                results.append(res)
                body = completion_body(api, prompts[res.prompt_index], max_tokens, seed, True, model,
                                       ignore_eos=ignore_eos)
                try:
                    await asyncio.wait_for(_stream_one(client, url, body, res),
                                           timeout=max(deadline - time.perf_counter(), 0.001))
                except asyncio.TimeoutError:
                    if res.error is None:
                        res.error, res.error_kind = "still running at the profile's time limit", "time_limit"
                if res.end is None:
                    res.end = time.perf_counter()

        closed = math.isinf(profile.rate)
        offsets = [start + o for o in arrival_offsets(profile, profile.requests, seed)]
        await asyncio.gather(*(one(i, at) for i, at in enumerate(offsets) if at < deadline))
        end = time.perf_counter()
    return {"profile": profile, "results": sorted(results, key=lambda r: r.index), "start": start, "end": end,
            "not_sent": profile.requests - len(results)}


def run_load(url: str, api: ServerApi, prompts: Sequence[Prompt], profile: LoadProfile, **kwargs) -> dict[str, Any]:
    return asyncio.run(run_load_async(url, api, prompts, profile, **kwargs))


def _pcts(values: list[float], prefix: str) -> dict[str, float | None]:
    arr = np.asarray(values, dtype=np.float64)
    return {f"{prefix}_p{q}": (float(np.percentile(arr, q)) if arr.size else None) for q in (50, 90, 99)}


def _tpot_ms(r: RequestResult) -> float | None:
    if r.output_tokens > 1 and r.token_times:
        return (r.token_times[-1] - r.first_token) * 1e3 / (r.output_tokens - 1)
    return None


def summarize(runs: list[dict[str, Any]], ttft_slo_ms: float | None = None,
              tpot_slo_ms: float | None = None) -> dict[str, Any]:
    """One cell's numbers over its timed runs of one load point: latency percentiles (ms) of the ok
    requests, throughput per run over the run's wall time (mean in output_tok_s), goodput over every
    request the runs meant to send (an error or a request never sent meets no SLO)."""
    ttft, tpot, itl, e2e, queue, tok_s, total_s, req_s, good_s = [], [], [], [], [], [], [], [], []
    errors: dict[str, int] = {}
    first_errors: list[str] = []
    planned = sent = ok_n = good = out_total = prompt_total = 0
    for run in runs:
        results: list[RequestResult] = run["results"]
        elapsed = max(run["end"] - run["start"], 1e-9)
        ok = [r for r in results if r.ok and r.first_token is not None]
        run_good = 0
        for r in ok:
            t, p = (r.first_token - r.start) * 1e3, _tpot_ms(r)
            ttft.append(t)
            e2e.append((r.end - r.start) * 1e3)
            queue.append(max(0.0, r.start - r.scheduled) * 1e3)
            if p is not None:
                tpot.append(p)
            itl.extend((np.diff(r.token_times) * 1e3).tolist())
            if (ttft_slo_ms is None or t <= ttft_slo_ms) and (tpot_slo_ms is None or (p or 0.0) <= tpot_slo_ms):
                run_good += 1
        for r in results:
            if not r.ok:
                errors[r.error_kind or "error"] = errors.get(r.error_kind or "error", 0) + 1
                if len(first_errors) < 3:
                    first_errors.append(r.error)
        out_tokens = sum(r.output_tokens for r in ok)
        in_tokens = sum(r.prompt_tokens or 0 for r in ok)
        tok_s.append(out_tokens / elapsed)
        total_s.append((out_tokens + in_tokens) / elapsed)
        req_s.append(len(ok) / elapsed)
        good_s.append(run_good / elapsed)
        planned += len(results) + run["not_sent"]
        sent += len(results)
        ok_n += len(ok)
        good += run_good
        out_total += out_tokens
        prompt_total += in_tokens
    out = {"ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e, "output_tok_s_runs": tok_s,
           "output_tok_s": float(np.mean(tok_s)) if tok_s else None,
           "total_tok_s": float(np.mean(total_s)) if total_s else None,
           "req_s": float(np.mean(req_s)) if req_s else None, "requests": ok_n,
           "requests_planned": planned, "requests_sent": sent, "errors": sum(errors.values()),
           "errors_by_kind": json.dumps(errors, sort_keys=True), "first_errors": first_errors,
           "goodput": good / planned if planned else None, "goodput_req_s": float(np.mean(good_s)) if good_s else None,
           "slo_ttft_ms": ttft_slo_ms, "slo_tpot_ms": tpot_slo_ms,
           "output_tokens": out_total, "prompt_tokens": prompt_total}
    for name, values in (("ttft_ms", ttft), ("tpot_ms", tpot), ("itl_ms", itl), ("e2e_ms", e2e), ("queue_ms", queue)):
        out.update(_pcts(values, name))
    return out


# ------------------------------------------------------------------------------------------------
# output capture


def _token_id(token: str, api: ServerApi, to_id: Callable[[str], int] | None) -> int:
    if api.ids_in_logprobs and token.startswith("token_id:"):
        return int(token[len("token_id:"):])
    return to_id(token) if to_id else -1


def _topk(pairs: list[tuple[int, float]], k: int) -> tuple[list[int], list[float]]:
    """(id, logprob) pairs -> the k most likely by (logprob desc, id asc): the offline adapters' tie rule.
    Ids that could not be resolved (-1) are dropped: they name no token."""
    ranked = sorted(((lp, tid) for tid, lp in pairs if tid >= 0), key=lambda x: (-x[0], x[1]))[:k]
    return [t for _, t in ranked], [lp for lp, _ in ranked]


def _scores(rows: list[tuple[int, float, list[tuple[int, float]]]], k: int) -> TokenScores:
    """Rows of (token id, its logprob, candidate pairs) -> TokenScores; short top-k lists are padded
    with id -1 / logprob -inf so every row has k entries (the store's lists are fixed per cell)."""
    n = len(rows)
    ids = np.full((n, k), -1, np.int32)
    lps = np.full((n, k), -np.inf, np.float32)
    for i, (_, _, pairs) in enumerate(rows):
        top_ids, top_lps = _topk(pairs, k)
        ids[i, :len(top_ids)], lps[i, :len(top_lps)] = top_ids, top_lps
    return TokenScores(token_ids=np.array([r[0] for r in rows], np.int32),
                       logprobs=np.array([r[1] for r in rows], np.float32), topk_ids=ids, topk_logprobs=lps)


def _openai_rows(lp: dict, api: ServerApi, to_id, lo: int, hi: int | None = None) -> list:
    """Rows lo..hi of an OpenAI `logprobs` object (tokens, token_logprobs, top_logprobs)."""
    tokens = lp.get("tokens") or []
    hi = len(tokens) if hi is None else hi
    token_lps, tops = lp.get("token_logprobs") or [], lp.get("top_logprobs") or []
    rows = []
    for j in range(lo, hi):
        tlp = token_lps[j] if j < len(token_lps) else None
        top = (tops[j] if j < len(tops) else None) or {}
        rows.append((_token_id(tokens[j], api, to_id), math.nan if tlp is None else float(tlp),
                     [(_token_id(s, api, to_id), float(v)) for s, v in top.items()]))
    return rows


def _vllm_prompt_rows(plps: list, prompt_ids: list[int]) -> list:
    """vLLM's `prompt_logprobs`: per prompt position None (the first) or {id: {logprob, rank, ...}}."""
    rows = []
    for pos, tid in zip(plps[1:], prompt_ids[1:]):
        pos = {int(k): (v["logprob"] if isinstance(v, dict) else float(v)) for k, v in (pos or {}).items()}
        rows.append((tid, float(pos.get(tid, math.nan)), list(pos.items())))
    return rows


@dataclass
class Captured:
    """One scoring prompt as the server answered it."""

    prompt_ids: list[int]            # the prompt as the server tokenized it
    prompt: TokenScores | None       # teacher-forced rows (scores of prompt tokens 1..n-1), where offered
    generation: TokenScores          # greedy rows
    usage: dict
    finish_reason: str | None


def _capture_one(resp: dict, api: ServerApi, to_id, prompt_ids: list[int] | None, k: int,
                 want_prompt: bool) -> Captured:
    choice = resp["choices"][0]
    lp = choice.get("logprobs") or {}
    usage = resp.get("usage") or {}
    n_prompt = usage.get("prompt_tokens")
    prompt_rows = None
    if want_prompt and api.prompt_logprobs == "prompt_logprobs" and choice.get("prompt_logprobs") is not None:
        ids = list(prompt_ids) if prompt_ids is not None else [int(t) for t in resp.get("prompt_token_ids") or []]
        prompt_rows = _vllm_prompt_rows(choice["prompt_logprobs"], ids)
        gen_rows = _openai_rows(lp, api, to_id, 0)
    elif want_prompt and api.prompt_logprobs == "echo":
        # echo: the prompt's tokens come first (the first has no logprob), then the generated ones
        n_prompt = n_prompt if n_prompt is not None else len(prompt_ids or [])
        prompt_rows = _openai_rows(lp, api, to_id, 1, n_prompt)
        gen_rows = _openai_rows(lp, api, to_id, n_prompt)
        if prompt_ids is None:
            prompt_ids = [_token_id(t, api, to_id) for t in (lp.get("tokens") or [])[:n_prompt]]
    else:
        gen_rows = _openai_rows(lp, api, to_id, 0)
    if prompt_ids is None:
        prompt_ids = []
    if prompt_rows is not None:   # a teacher-forced row scores the prompt's own token at that position
        prompt_rows = [(tid, lp_, pairs) for (_, lp_, pairs), tid in zip(prompt_rows, prompt_ids[1:])]
    return Captured(prompt_ids=list(prompt_ids), prompt=_scores(prompt_rows, k) if prompt_rows is not None else None,
                    generation=_scores(gen_rows, k), usage=usage, finish_reason=choice.get("finish_reason"))


async def _capture_async(url: str, api: ServerApi, prompts: Sequence[Prompt], prompt_ids: Sequence[list[int] | None],
                         *, max_tokens: int, top_k: int, concurrency: int, seed: int, model: str | None,
                         to_id, headers: dict | None, timeout_s: float, want_prompt: bool) -> list[Captured]:
    import httpx

    out: list[Captured | None] = [None] * len(prompts)
    slots = asyncio.Semaphore(max(1, concurrency))
    async with httpx.AsyncClient(timeout=timeout_s, headers=headers, trust_env=False) as client:
        async def one(i: int) -> None:
            body = completion_body(api, prompts[i], max_tokens, seed, False, model, logprobs=top_k,
                                   prompt_logprobs=want_prompt)
            async with slots:
                r = await client.post(url.rstrip("/") + "/v1/completions", json=body)
            if r.status_code != 200:
                raise ServerError(f"capture request {i}: HTTP {r.status_code}: {r.text[:500]}")
            out[i] = _capture_one(r.json(), api, to_id, prompt_ids[i], top_k, want_prompt)

        await asyncio.gather(*(one(i) for i in range(len(prompts))))
    return out  # type: ignore[return-value]


def capture(url: str, api: ServerApi, prompts: Sequence[Prompt], prompt_ids: Sequence[list[int] | None], *,
            max_tokens: int, top_k: int, concurrency: int = 1, seed: int = 0, model: str | None = None,
            to_id: Callable[[str], int] | None = None, headers: dict | None = None, timeout_s: float = 120.0,
            want_prompt: bool = True) -> list[Captured]:
    """Greedy completions with logprobs (and prompt logprobs where offered), `concurrency` at a time.
    `prompt_ids[i]` is prompt i as token ids where known (sent as ids, or checked against the server's
    tokenizer); None: taken from the server's answer."""
    return asyncio.run(_capture_async(url, api, prompts, prompt_ids, max_tokens=max_tokens, top_k=top_k,
                                      concurrency=concurrency, seed=seed, model=model, to_id=to_id,
                                      headers=headers, timeout_s=timeout_s, want_prompt=want_prompt))


def decoded_vocab(source: str, trust_remote_code: bool = False) -> Callable[[str], int]:
    """Token string -> id for a server that keys logprobs by `tokenizer.decode([id])`; a string several
    ids decode to is ambiguous (-1)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    ids: dict[str, list[int]] = {}
    for i in range(len(tok)):
        ids.setdefault(tok.decode([i]), []).append(i)
    table = {s: (v[0] if len(v) == 1 else -1) for s, v in ids.items()}
    return lambda s: table.get(s, -1)


def tokenize_remote(url: str, api: ServerApi, text: str, model: str | None = None,
                    headers: dict | None = None, timeout_s: float = 30.0) -> list[int] | None:
    """The server's own tokenization of a text prompt, where it has a tokenizer endpoint."""
    import httpx

    if not api.tokenize_path:
        return None
    body = {"input": text} if api.tokenize_path == "/extras/tokenize" else {"prompt": text, "model": model}
    try:
        r = httpx.post(url.rstrip("/") + api.tokenize_path, json=body, headers=headers, timeout=timeout_s,
                       trust_env=False)
    except httpx.HTTPError:
        return None
    return r.json().get("tokens") if r.status_code == 200 else None
