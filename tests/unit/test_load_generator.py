"""The load generator's stream reading, against a real local HTTP server that streams canned SSE.

The server (aiohttp.web on 127.0.0.1, in a thread of this process) answers /v1/completions with the
scenario the request's prompt names: vLLM-shaped chunks with continuous usage or with their token ids
(return_token_ids, the prompt's ids on the first, a usage-only chunk last), chunks of several
tokens without usage, Python-json spacing, CRLF lines and ping comments, a stream cut without
[DONE], a connection dropped mid-body, an HTTP 500, a bad line, a stall. Real sockets, no mocks.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from aiohttp import web

from adapters.contract.openai_api import ServerApi
from adapters.contract.timing import summarize
from adapters.serving import load_generator

API = ServerApi(prompt_ids=True, ids_in_logprobs=True, prompt_logprobs=None, ignore_eos=True, batches=True,
                stream_usage=True)
GAP_S = 0.05   # between writes the client must see apart


def _vllm(i: int, n: int, text: str = " w", finish: str = "length", prompt: int = 32) -> dict:
    """vLLM's chunk with continuous usage stats: token i (0-based) of n."""
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "tiny",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish if i == n - 1 else None,
                         "stop_reason": None, "prompt_token_ids": None, "token_ids": None}],
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt + i + 1, "completion_tokens": i + 1}}


def _vllm_ids(ids: list[int], finish: str | None, first: bool = False, text: str = " w") -> dict:
    """vLLM's chunk with return_token_ids and no continuous usage: the chunk's new token ids (and, on the
    first, the prompt's)."""
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "tiny",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None,
                         "prompt_token_ids": list(range(3, 35)) if first else None, "token_ids": ids}]}


def _compact(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


USAGE_ONLY = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "tiny", "choices": [],
              "usage": {"prompt_tokens": 32, "total_tokens": 36, "completion_tokens": 4}}
DONE = b"data: [DONE]\n\n"


def _scenario(name: str) -> list[bytes] | int:
    """The writes of one response (each a separate write, GAP_S apart), or an HTTP status."""
    if name == "vllm":                      # one token per chunk, usage on every chunk, a usage-only chunk
        return [_compact(_vllm(i, 4)) for i in range(4)] + [_compact(USAGE_ONLY) + DONE]
    if name == "vllm-burst":                # two events in one write: they reach the client together
        return [_compact(_vllm(0, 4)), _compact(_vllm(1, 4)) + _compact(_vllm(2, 4)), _compact(_vllm(3, 4)) + DONE]
    if name == "vllm-multi":                # speculative-style: 1, then 3 tokens in one event
        a, b = _vllm(0, 4), _vllm(3, 4)
        return [_compact(a), _compact(b), DONE]
    if name == "ids":                       # return_token_ids: 1, 3 (speculative), then 0 (text held back), 1 ids
        evs = [_vllm_ids([7], None, first=True), _vllm_ids([8, 9, 10], None), _vllm_ids([], None, text=""),
               _vllm_ids([11], "length", text='"token_ids":[1,2], "completion_tokens":9')]
        usage = {**USAGE_ONLY, "usage": {"prompt_tokens": 32, "total_tokens": 37, "completion_tokens": 5}}
        return [_compact(e) for e in evs] + [_compact(usage) + DONE]
    if name == "ids-spaced":                # the same in Python's json.dumps spacing, no final usage
        evs = [_vllm_ids([7], None, first=True), _vllm_ids([8, 9], None), _vllm_ids([10], "length")]
        return [b"data: " + json.dumps(e).encode() + b"\n\n" for e in evs] + [DONE]
    if name == "quoted":                    # text that quotes the keys read by the fast path
        text = '"completion_tokens":99, "finish_reason":"stop", "choices":[{'
        return [_compact(_vllm(i, 4, text=text)) for i in range(4)] + [DONE]
    if name == "spaced":                    # Python's json.dumps spacing, CRLF lines, a ping comment
        out = [b": ping\r\n\r\n"]
        for i in range(4):
            out.append(b"data: " + json.dumps(_vllm(i, 4, finish="stop")).encode() + b"\r\n\r\n")
        return out + [b"data: [DONE]\r\n\r\n"]
    if name == "text-only":                 # no usage: tokens from logprobs, else one per chunk with text
        chunks = [{"choices": [{"text": "ab", "logprobs": {"tokens": ["a", "b"]}, "finish_reason": None}]},
                  {"choices": [{"text": "", "finish_reason": None}]},            # no text: no token
                  {"choices": [{"text": "c", "finish_reason": None}]},
                  {"choices": [{"text": "d", "finish_reason": "length"}]}]
        return [_compact(c) for c in chunks] + [DONE]
    if name == "text-usage-end":            # no continuous usage; the final usage chunk's count wins
        chunks = [{"choices": [{"text": "a", "finish_reason": None}]},
                  {"choices": [{"text": "b", "finish_reason": "length"}]},
                  {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 4}}]
        return [_compact(c) for c in chunks] + [DONE]
    if name == "null-usage":                # usage present but its count null: parsed in full, text counts
        return [_compact({**_vllm(i, 4), "usage": {"prompt_tokens": 5, "completion_tokens": None}})
                for i in range(4)] + [DONE]
    if name == "no-done":                   # the response ends cleanly, without [DONE]
        return [_compact(_vllm(i, 4)) for i in range(3)]
    if name == "no-finish":                 # [DONE] but no finish_reason
        return [_compact({**_vllm(i, 4), "choices": [{"text": "x", "finish_reason": None}]}) for i in range(4)] + [DONE]
    if name == "error-event":               # the server reports an error inside the stream
        return [_compact(_vllm(0, 4)), _compact({"error": {"message": "boom", "code": 500}}), DONE]
    if name == "abort":
        return [_compact(_vllm(i, 2, finish="abort")) for i in range(2)] + [DONE]
    if name == "short":                     # finish_reason length before max_tokens
        return [_compact(_vllm(i, 2)) for i in range(2)] + [DONE]
    if name == "bad-line":
        return [_compact(_vllm(0, 4)), b"data: {not json\n\n", DONE]
    if name == "http-500":
        return 500
    raise ValueError(name)


async def _completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    name = body["prompt"]
    if name == "http-500":
        return web.Response(status=500, text="engine exploded")
    if name == "stall":                     # headers, one chunk, then nothing for a long time
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_compact(_vllm(0, 4)))
        await asyncio.sleep(5)
        return resp
    if name == "drop":                      # the connection closes mid-body (chunked encoding unfinished)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_compact(_vllm(0, 4)))
        await asyncio.sleep(GAP_S)
        request.transport.close()
        return resp
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for data in _scenario(name):
        await resp.write(data)
        await asyncio.sleep(GAP_S)
    await resp.write_eof()
    return resp


@pytest.fixture(scope="module")
def url():
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/completions", _completions)
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def _one(url: str, scenario: str, max_tokens: int = 4, **kw):
    run = load_generator.run_load(url, API, [scenario], load_generator.LoadProfile(concurrency=1, requests=1),
                                  max_tokens=max_tokens, **kw)
    assert len(run.requests) == 1 and run.not_sent == 0
    return run.requests[0]


@pytest.mark.parametrize("scenario,finish", [("vllm", "length"), ("spaced", "stop"), ("quoted", "length")])
def test_continuous_usage_counts_every_token(url, scenario, finish):
    r = _one(url, scenario)
    assert r.ok, r.error
    assert r.output_tokens == 4 and r.prompt_tokens == 32 and r.finish_reason == finish
    # each event was its own write GAP_S apart: its own chunk, its own time, after the request was sent
    assert r.chunk_tokens == [1, 1, 1, 1]
    assert r.sent < r.chunk_times[0] and all(b > a for a, b in zip(r.chunk_times, r.chunk_times[1:]))
    assert r.chunk_times[-1] <= r.end


def test_events_of_one_read_are_one_chunk(url):
    r = _one(url, "vllm-burst")
    assert r.ok, r.error
    assert r.chunk_tokens == [1, 2, 1] and r.output_tokens == 4
    assert all(b > a for a, b in zip(r.chunk_times, r.chunk_times[1:]))   # never a fake zero gap


def test_multi_token_events(url):
    r = _one(url, "vllm-multi")
    assert r.ok, r.error
    assert r.chunk_tokens == [1, 3] and r.output_tokens == 4


def test_token_ids_count_every_token(url):
    """return_token_ids (vLLM): each chunk's ids are its tokens, several in one chunk included; the prompt's
    ids on the first chunk and keys quoted in the text are not counted; the final usage gives the prompt."""
    r = _one(url, "ids", max_tokens=5)
    assert r.ok, r.error
    # the chunk of no ids (text held back) is no chunk of its own
    assert r.chunk_tokens == [1, 3, 1] and r.output_tokens == 5 and r.prompt_tokens == 32
    assert r.finish_reason == "length"
    r = _one(url, "ids-spaced")
    assert r.ok, r.error
    assert r.chunk_tokens == [1, 2, 1] and r.output_tokens == 4 and r.prompt_tokens is None


def test_streams_without_continuous_usage(url):
    r = _one(url, "text-only")
    assert r.ok, r.error
    assert r.chunk_tokens == [2, 1, 1] and r.output_tokens == 4 and r.prompt_tokens is None
    # the final usage chunk's count wins; the chunk times keep what the chunks showed
    r = _one(url, "text-usage-end")
    assert r.ok, r.error
    assert r.chunk_tokens == [1, 1] and r.output_tokens == 4 and r.prompt_tokens == 7
    r = _one(url, "null-usage")
    assert r.ok, r.error
    assert r.chunk_tokens == [1, 1, 1, 1] and r.output_tokens == 4 and r.prompt_tokens == 5


@pytest.mark.parametrize("scenario,kind,message", [
    ("no-done", "truncated", "stream ended without [DONE] after 3 tokens"),
    ("no-finish", "truncated", "stream ended without a finish_reason"),
    ("error-event", "truncated", "stream ended without a finish_reason"),
    ("abort", "truncated", "finish_reason 'abort'"),
    ("short", "truncated", "finish_reason 'length' after 2 < max_tokens 4 tokens"),
    ("bad-line", "protocol", "bad stream line: {not json"),
    ("http-500", "http", "HTTP 500: engine exploded"),
    ("drop", "connection", ""),
])
def test_errors_are_kept_with_their_kind(url, scenario, kind, message):
    r = _one(url, scenario)
    assert not r.ok and r.error_kind == kind and message in r.error, r.error
    assert r.end is not None


def test_timeouts_and_time_limits(url):
    r = _one(url, "stall", request_timeout_s=0.5)             # nothing read for 0.5 s: the request's timeout
    assert r.error_kind == "timeout" and "request timeout" in r.error, r.error
    assert r.chunk_tokens == [1]
    run = load_generator.run_load(url, API, ["stall"], load_generator.LoadProfile(concurrency=2, requests=3,
                                                                                   time_limit_s=0.6),
                                  max_tokens=4, request_timeout_s=60)
    summary = summarize([run])
    assert [r.error_kind for r in run.requests] == ["time_limit", "time_limit"] and run.not_sent == 1
    assert summary.requests_planned == 3 and summary.errors == 2 and summary.requests == 0


def test_a_load_point_over_the_canned_server(url):
    run = load_generator.run_load(url, API, ["vllm", "vllm-burst", "text-only"],
                                  load_generator.LoadProfile(concurrency=3, requests=9), max_tokens=4)
    summary = summarize([run])
    assert summary.requests == 9 and summary.errors == 0 and summary.output_tokens == 36
    assert summary.tpot_ms_p50 > 0 and summary.output_tok_s > 0


def test_scheduled_and_sent_times_are_recorded(url):
    """A schedule of its own (a trace's gaps) and a rated one: each sent request's planned arrival and the time
    the client sent it, in ms after its run's start; a closed loop has none."""
    from adapters.contract.arrivals import TraceArrival

    gaps = [0.0, 0.05, 0.0, 0.2, 0.1]
    run = load_generator.run_load(url, API, ["vllm"] * 5, load_generator.LoadProfile(
        concurrency=5, arrival=TraceArrival(gaps_s=gaps), requests=5), max_tokens=2)
    summary = summarize([run, run])
    planned = [0.0, 50.0, 50.0, 250.0, 350.0]
    assert summary.scheduled_ms == pytest.approx(planned * 2, abs=1e-6)
    # sent at the planned time (a loaded CI host: within 50 ms), never before it
    late = [s - p for s, p in zip(summary.sent_ms, summary.scheduled_ms)]
    assert all(0 <= d < 50 for d in late), late
    gamma = load_generator.run_load(url, API, ["vllm"], load_generator.LoadProfile(
        concurrency=2, rate=20, arrival={"kind": "gamma", "burstiness": 0.5}, requests=3), max_tokens=2, seed=4)
    want = load_generator.arrival_offsets(load_generator.LoadProfile(rate=20, arrival={"kind": "gamma", "burstiness": 0.5}),
                                          3, seed=4)
    assert summarize([gamma]).scheduled_ms == pytest.approx([1e3 * w for w in want], abs=1e-6)
    ramp = {"kind": "ramp", "start_rate": 10, "end_rate": 30, "duration_s": 0.2}
    run = load_generator.run_load(url, API, ["vllm"], load_generator.LoadProfile(concurrency=4, arrival=ramp, requests=4),
                                  max_tokens=2, seed=1)
    want = load_generator.arrival_offsets(load_generator.LoadProfile(arrival=ramp), 4, seed=1)
    assert summarize([run]).scheduled_ms == pytest.approx([1e3 * w for w in want], abs=1e-6)
    closed = summarize([load_generator.run_load(url, API, ["vllm"], load_generator.LoadProfile(requests=2), max_tokens=2)])
    assert closed.scheduled_ms == [] and closed.sent_ms == []


def test_event_fast_path_agrees_with_a_full_parse():
    for obj in (_vllm(0, 4), _vllm(3, 4, finish="stop"), USAGE_ONLY, _vllm(1, 4, text='"finish_reason":"x"')):
        for data in (json.dumps(obj, separators=(",", ":")).encode(), json.dumps(obj).encode()):
            choices, usage = load_generator._event(data)
            assert usage == {k: obj["usage"][k] for k in ("completion_tokens", "prompt_tokens")}
            assert [c.get("finish_reason") for c in choices] == [c["finish_reason"] for c in obj["choices"]]
    with pytest.raises(ValueError):
        load_generator._event(b"[1, 2]")
