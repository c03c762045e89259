"""The load generator: one load point of streaming completions against a server, timed on the client.

A prompt is text or token ids (/v1/completions), or a chat's messages (/v1/chat/completions, the server's
chat template; a chat chunk's text is `delta.content`).

`run_load` drives a base URL with at most `concurrency` requests in flight, arriving all at once
(`rate` inf: a closed loop, the next request when one ends) or on an arrival schedule (constant,
Poisson or gamma gaps at `rate`, a ramp, a trace's times: adapters/serving/arrivals.py);
bounded by a request count and a time limit. Every SSE chunk that carries tokens is one entry of
the request's `RequestTiming` (the time the client received it, and how many tokens it carried), so
latency figures come from `adapters.contract.timing.summarize`, as offline ones do. Errors, request
timeouts, requests cut at the time limit and requests never sent are counted, never dropped.

Latency is measured from when a request is sent; a request waiting for a free slot under the
concurrency cap (a rate above what the cap lets through) waits before it is sent, as in `vllm bench
serve --max-concurrency`, and that wait is reported apart (`queue_ms`).

The client shares the host with the server it measures, so every millisecond of its CPU is taken
from the server: it is aiohttp (a C HTTP parser; httpx's pure-Python HTTP/1.1 stack cost 3x the CPU
per chunk), it splits the raw bytes into SSE lines itself, and it reads events that carry their token
ids or a usage count (every vLLM chunk) with regular expressions instead of a full JSON parse
(benchmarks/README.md, "The load generator's own cost"). It asks the server for no more than an exact
count needs (`openai_api.stream_count`): each chunk's token ids where the server gives them (vLLM's
`return_token_ids`), usage on every chunk only where it gives nothing else. A chunk's time is taken when its bytes
arrive, before any parsing; events that arrive in one read are one chunk (they reached the client
together: no fake near-zero gap between them).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from dataclasses import dataclass
from typing import Sequence

from pydantic import TypeAdapter

from adapters.contract.arrivals import RATED, Arrival
from adapters.contract.openai_api import Prompt, ServerApi, completion_body, completion_path
from adapters.contract.timing import RequestTiming, TimedRun
from adapters.serving import arrivals

# what a chunk with its token ids or continuous usage stats is read for (keys only: a quote inside a JSON
# string is escaped, and "prompt_token_ids" has no quote before its "token_ids")
_IDS = re.compile(rb'"token_ids":\s*\[([\d,\s]*)\]')
_COMPLETION = re.compile(rb'"completion_tokens":\s*(\d+)')
_PROMPT = re.compile(rb'"prompt_tokens":\s*(\d+)')
_FINISH = re.compile(rb'"finish_reason":\s*"([^"]+)"')
_A_CHOICE = re.compile(rb'"choices":\s*\[\s*\{')


def _event(data: bytes) -> tuple[tuple | list, dict]:
    """(choices, usage) of one SSE event's JSON. An event with its token ids or a usage count is read with
    the regular expressions above (its token count comes from those, so only the finish reasons and counts
    are needed; one choice: the load generator asks for n=1; a choice's "n_ids" is how many token ids it
    carried); anything else is parsed in full. Raises ValueError on a line that is no JSON object."""
    ids = _IDS.search(data)
    tokens = _COMPLETION.search(data)
    if (ids or tokens) and data[:1] == b"{" and data[-1:] == b"}":
        usage = {"completion_tokens": int(tokens[1])} if tokens else {}
        if tokens and (prompt := _PROMPT.search(data)):
            usage["prompt_tokens"] = int(prompt[1])
        finish = _FINISH.search(data)
        choices = ({"finish_reason": finish and finish[1].decode()},) if _A_CHOICE.search(data) else ()
        if ids and choices:
            choices[0]["n_ids"] = len(ids[1].split(b",")) if ids[1].strip() else 0
        return choices, usage
    chunk = json.loads(data)
    if not isinstance(chunk, dict):
        raise ValueError("not a JSON object")
    return chunk.get("choices") or (), chunk.get("usage") or {}


@dataclass
class LoadProfile:
    """One load point: at most `concurrency` requests in flight; arrivals all at once (rate inf, a
    closed loop), or on the schedule of `arrival` (adapters/contract/arrivals.py: evenly spaced, Poisson
    or gamma gaps at `rate` per second, a ramp, a trace's own times)."""

    concurrency: int = 1
    rate: float = math.inf
    arrival: Arrival | str = "poisson"   # a shape, or its plain name (constant, poisson)
    requests: int = 16                 # at most this many requests
    time_limit_s: float = 60.0         # no request sent or still running after this

    def __post_init__(self):
        self.arrival = _ARRIVAL.validate_python(self.arrival)

    @property
    def closed(self) -> bool:
        """A closed loop: a rated shape at rate inf (the next request when one ends)."""
        return self.arrival.kind in RATED and math.isinf(self.rate)

    @property
    def name(self) -> str:
        if self.closed:
            return f"concurrency={self.concurrency}"
        if self.arrival.kind not in RATED:
            return f"{self.arrival.kind} max-concurrency={self.concurrency}"
        return f"{self.arrival.kind}-rate={self.rate:g}/s max-concurrency={self.concurrency}"


_ARRIVAL = TypeAdapter(Arrival)


async def _stream_one(session, url: str, body: dict, res: RequestTiming) -> None:
    import aiohttp

    res.sent = time.perf_counter()
    try:
        async with session.post(url.rstrip("/") + completion_path(body), json=body) as r:
            if r.status != 200:
                text = (await r.read()).decode(errors="replace")
                res.error, res.error_kind = f"HTTP {r.status}: {text[:300]}", "http"
                return
            done, counted, usage_tokens = False, 0, None   # counted: tokens the usage stats had reported so far
            pending = b""                 # the start of a line whose end has not arrived
            async for data in r.content.iter_any():
                # the time first: what follows is the client's own work, not the server's
                now = time.perf_counter()
                *lines, pending = (pending + data).split(b"\n")
                n_tok = 0
                for line in lines:
                    if not line.startswith(b"data:"):
                        continue              # blank separators, ": ping" comments
                    line = line[5:].strip()
                    if line == b"[DONE]":
                        done = True
                        break
                    try:
                        choices, usage = _event(line)
                    except ValueError:
                        res.error, res.error_kind = f"bad stream line: {line[:200].decode(errors='replace')}", "protocol"
                        return
                    ev_tok = 0
                    for choice in choices:
                        if choice.get("finish_reason"):
                            res.finish_reason = choice["finish_reason"]
                        ids = choice["n_ids"] if "n_ids" in choice else choice.get("token_ids")
                        if ids is not None:                              # its token ids: exact per chunk
                            ev_tok += ids if isinstance(ids, int) else len(ids)
                        elif usage.get("completion_tokens") is not None:   # continuous usage: exact per chunk
                            ev_tok += usage["completion_tokens"] - counted
                        else:                                            # one token per chunk that carries text
                            lp = choice.get("logprobs") or {}   # (a chat chunk's text is its delta's content)
                            text = choice.get("text") or (choice.get("delta") or {}).get("content")
                            ev_tok += len(lp.get("tokens") or ()) or (1 if text else 0)
                    if ev_tok > 0:
                        n_tok += ev_tok
                        counted += ev_tok
                    if usage:
                        usage_tokens = usage.get("completion_tokens", usage_tokens)
                        res.prompt_tokens = usage.get("prompt_tokens", res.prompt_tokens)
                res.add_chunk(now, n_tok)     # the events of one read arrived together: one chunk
                if done:
                    break
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
    except asyncio.TimeoutError as err:    # aiohttp's connect and read timeouts
        res.error, res.error_kind = f"request timeout ({type(err).__name__})", "timeout"
    except aiohttp.ClientError as err:
        res.error, res.error_kind = f"{type(err).__name__}: {err}", "connection"


async def _within(coro, seconds: float):
    """Await coro, cancelled after `seconds` (asyncio.TimeoutError). Inline where Python has asyncio.timeout
    (3.11+): the request goes out in the loop step its arrival wakes, not a step later, as wait_for's task
    does (every ready stream's chunks are read in between)."""
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(seconds):
            return await coro
    return await asyncio.wait_for(coro, seconds)


def arrival_offsets(profile: LoadProfile, n: int, seed: int = 0) -> list[float]:
    """Seconds after the start at which each request arrives."""
    return arrivals.offsets(profile.arrival, profile.rate, n, seed)


async def run_load_async(url: str, api: ServerApi, prompts: Sequence[Prompt], profile: LoadProfile, *,
                         max_tokens: int | Sequence[int], ignore_eos: bool = True, seed: int = 0,
                         request_timeout_s: float = 60.0, model: str | None = None, headers: dict | None = None,
                         prompt_tokens: Sequence[int] | None = None, follows: Sequence[int] | None = None,
                         think_time_s: float = 0.0) -> TimedRun:
    """Up to profile.requests streaming completions (prompts cycled) under the profile; the sent
    requests in the order they were planned. `prompt_tokens` (per prompt) fills a request's prompt
    length where the stream reports no usage; `max_tokens` is one for all or one per prompt.
    Multi-turn: `follows[p]` = k > 0 makes request p the next turn of request p - k: it arrives
    `think_time_s` after that one has ended (not on the profile's schedule), as a user answering."""
    import aiohttp

    if not prompts:
        raise ValueError("no prompts")
    if follows is not None and profile.requests > len(prompts):
        raise ValueError("multi-turn requests are not cycled: give as many prompts as requests")
    sent: dict[int, RequestTiming] = {}
    ended = {i: asyncio.Event() for i in range(profile.requests)} if follows else {}
    slots = asyncio.Semaphore(profile.concurrency)
    closed = profile.closed
    connector = aiohttp.TCPConnector(limit=profile.concurrency + 4)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=request_timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as client:
        start = time.perf_counter()
        deadline = start + profile.time_limit_s

        async def one(i: int, at: float | None) -> None:
            try:
                await _one(i, at)
            finally:
                if i in ended:
                    ended[i].set()

        async def _one(i: int, at: float | None) -> None:
            p = i % len(prompts)
            n_max = max_tokens if isinstance(max_tokens, int) else max_tokens[p]
            body = completion_body(api, prompts[p], n_max, seed, True, model, ignore_eos=ignore_eos)
            if at is None:                      # the next turn: when the previous one has ended, plus think time
                before = i - follows[p]
                await ended[before].wait()
                if before not in sent:
                    return                      # the conversation was cut: this turn is never sent either
                at = sent[before].end + think_time_s
            if at >= deadline:
                return                          # arrives after the time limit: never sent
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            async with slots:
                if time.perf_counter() >= deadline:
                    return                      # never sent: counted in not_sent
                # a closed loop sends when a slot frees: no queue to count
                res = RequestTiming(sent=0.0, scheduled=None if closed else at,
                                    prompt_tokens=prompt_tokens[p] if prompt_tokens is not None else None)
                sent[i] = res
                try:
                    await _within(_stream_one(client, url, body, res), max(deadline - time.perf_counter(), 0.001))
                except asyncio.TimeoutError:
                    if res.error is None:
                        res.error, res.error_kind = "still running at the profile's time limit", "time_limit"
                if res.end is None:
                    res.end = time.perf_counter()

        # first turns (every request, without multi-turn) arrive on the profile's schedule, in order
        firsts = [i for i in range(profile.requests) if not (follows and follows[i % len(prompts)] > 0)]
        arrive_at = dict(zip(firsts, (start + o for o in arrival_offsets(profile, len(firsts), seed))))
        await asyncio.gather(*(one(i, arrive_at.get(i)) for i in range(profile.requests)))
        end = time.perf_counter()
    return TimedRun(start=start, end=end, requests=[sent[i] for i in sorted(sent)],
                    not_sent=profile.requests - len(sent))


def run_load(url: str, api: ServerApi, prompts: Sequence[Prompt], profile: LoadProfile, **kwargs) -> TimedRun:
    return asyncio.run(run_load_async(url, api, prompts, profile, **kwargs))
