"""The load generator: one load point of streaming completions against a server, timed on the client.

`run_load` drives a base URL with at most `concurrency` requests in flight, arriving all at once
(`rate` inf: a closed loop, the next request when one ends) or at a constant or Poisson `rate`;
bounded by a request count and a time limit. Every SSE chunk that carries tokens is one entry of
the request's `RequestTiming` (the time the client received it, and how many tokens it carried), so
latency figures come from `adapters.contract.summarize`, as offline ones do. Errors, request
timeouts, requests cut at the time limit and requests never sent are counted, never dropped.

Latency is measured from when a request is sent; a request waiting for a free slot under the
concurrency cap (a rate above what the cap lets through) waits before it is sent, as in `vllm bench
serve --max-concurrency`, and that wait is reported apart (`queue_ms`).

The client shares the host with the server it measures, so its own CPU per chunk is kept small:
parsing happens on the hot path only as far as the chunk's token count needs.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from dataclasses import dataclass
from typing import Literal, Sequence

from adapters.contract import RequestTiming, TimedRun
from adapters.server_process import Prompt, ServerApi, completion_body

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


async def _stream_one(client, url: str, body: dict, res: RequestTiming) -> None:
    import httpx

    res.sent = time.perf_counter()
    try:
        async with client.stream("POST", url.rstrip("/") + "/v1/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                res.error, res.error_kind = f"HTTP {r.status_code}: {text[:300]}", "http"
                return
            done, counted, usage_tokens = False, 0, None   # counted: tokens the usage stats had reported so far
            async for line in r.aiter_lines():
                # the time first: what follows is the client's own work, not the server's
                now = time.perf_counter()
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
                usage = chunk.get("usage") or {}
                n_tok = 0
                for choice in chunk.get("choices") or ():
                    if choice.get("finish_reason"):
                        res.finish_reason = choice["finish_reason"]
                    if usage.get("completion_tokens") is not None:   # continuous usage: exact per chunk
                        n_tok += usage["completion_tokens"] - counted
                    else:                                            # one token per chunk that carries text
                        lp = choice.get("logprobs") or {}
                        n_tok += len(lp.get("tokens") or ()) or (1 if choice.get("text") else 0)
                if n_tok > 0:
                    res.add_chunk(now, n_tok)
                    counted += n_tok
                if usage:
                    usage_tokens = usage.get("completion_tokens", usage_tokens)
                    res.prompt_tokens = usage.get("prompt_tokens", res.prompt_tokens)
            res.end = time.perf_counter()
            # the server's count wins; the chunk times keep what the chunks showed
            res.output_tokens = usage_tokens if usage_tokens is not None else counted
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
                         prompt_tokens: Sequence[int] | None = None) -> TimedRun:
    """Up to profile.requests streaming completions (prompts cycled) under the profile; the sent
    requests in the order they were planned. `prompt_tokens` (per prompt) fills a request's prompt
    length where the stream reports no usage."""
    import httpx

    if not prompts:
        raise ValueError("no prompts")
    limits = httpx.Limits(max_connections=profile.concurrency + 4, max_keepalive_connections=profile.concurrency + 4)
    sent: dict[int, RequestTiming] = {}
    slots = asyncio.Semaphore(profile.concurrency)
    closed = math.isinf(profile.rate)
    async with httpx.AsyncClient(timeout=httpx.Timeout(request_timeout_s, connect=10.0), limits=limits,
                                 headers=headers, trust_env=False) as client:
        start = time.perf_counter()
        deadline = start + profile.time_limit_s

        async def one(i: int, at: float) -> None:
            p = i % len(prompts)
            body = completion_body(api, prompts[p], max_tokens, seed, True, model, ignore_eos=ignore_eos)
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            async with slots:
                if time.perf_counter() >= deadline:
                    return                      # never sent: counted in not_sent
                # a closed loop sends when a slot frees: no queue to count
                res = RequestTiming(sent=0.0, scheduled=None if closed else at,
                                    prompt_tokens=prompt_tokens[p] if prompt_tokens is not None else None)
                sent[i] = res
                try:
                    await asyncio.wait_for(_stream_one(client, url, body, res),
                                           timeout=max(deadline - time.perf_counter(), 0.001))
                except asyncio.TimeoutError:
                    if res.error is None:
                        res.error, res.error_kind = "still running at the profile's time limit", "time_limit"
                if res.end is None:
                    res.end = time.perf_counter()

        offsets = [start + o for o in arrival_offsets(profile, profile.requests, seed)]
        await asyncio.gather(*(one(i, at) for i, at in enumerate(offsets) if at < deadline))
        end = time.perf_counter()
    return TimedRun(start=start, end=end, requests=[sent[i] for i in sorted(sent)],
                    not_sent=profile.requests - len(sent))


def run_load(url: str, api: ServerApi, prompts: Sequence[Prompt], profile: LoadProfile, **kwargs) -> TimedRun:
    return asyncio.run(run_load_async(url, api, prompts, profile, **kwargs))
