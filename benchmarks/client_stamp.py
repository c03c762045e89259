"""Where the two clients' TTFT differs with no engine at all: our load generator and `vllm bench serve`'s
request function against one canned SSE server.

The server (aiohttp, a process of its own) answers every /v1/completions with vLLM-shaped chunks
(return_token_ids: the prompt's 32 ids on the first): 10 ms after the request reaches its handler the
first chunk, then 15 more 2 ms apart, the final usage and [DONE]. It logs, per request, when the request
reached the handler (recv) and when it wrote the first chunk (write); perf_counter is CLOCK_MONOTONIC,
one clock for every process here. Each client runs `--requests` requests at a concurrency in a process of
its own and reports, per request, when it took its start (sent) and its first chunk's time (stamp):

  ours           adapters/serving/load_generator.run_load (a served cell's client)
  theirs         vllm.benchmarks.lib.endpoint_request_func.async_request_openai_completions with the session
                 `vllm bench serve` makes (its TCPConnector arguments, trust_env=True), under a semaphore
  theirs:noenv   the same with trust_env=False: aiohttp then skips its per-request proxy and .netrc look-up

Per request (sorted by start, so paired in order): the client's part of its TTFT = (stamp - sent) -
(write - recv), split into sent -> recv (building and sending the request, until the server's handler has
it) and write -> stamp (the first chunk's way back, and the parsing before the client takes its time).
The server's own 10 ms is the same for every client and drops out. Medians over requests, per round.

    .venv/bin/python benchmarks/client_stamp.py                  # 3 rounds, concurrency 1 and 4 (~1 min)
    .venv/bin/python benchmarks/client_stamp.py --quick          # 1 round, concurrency 2, 8 requests (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VLLM_PY = ROOT / ".venvs" / "vllm" / "bin" / "python"

SERVER = r"""
import asyncio, json, sys, time
from aiohttp import web
LOG = []
def chunk(i, n):
    c = {"id": "c", "object": "text_completion", "created": 1, "model": "tiny",
         "choices": [{"index": 0, "text": " w", "logprobs": None, "finish_reason": "length" if i == n - 1 else None,
                      "stop_reason": None, "prompt_token_ids": list(range(32)) if i == 0 else None,
                      "token_ids": [i + 5]}]}
    return b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n"
async def comp(req):
    recv = time.perf_counter()
    n = (await req.json())["max_tokens"]
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(req)
    await asyncio.sleep(0.010)
    for i in range(n):
        t = time.perf_counter()
        await resp.write(chunk(i, n))
        if i == 0:
            LOG.append((recv, t))
        await asyncio.sleep(0.002)
    u = {"id": "c", "object": "text_completion", "created": 1, "model": "tiny", "choices": [],
         "usage": {"prompt_tokens": 32, "completion_tokens": n, "total_tokens": 32 + n}}
    await resp.write(b"data: " + json.dumps(u).encode() + b"\n\ndata: [DONE]\n\n")
    await resp.write_eof()
    return resp
async def log(req):
    out = list(LOG)
    LOG.clear()
    return web.json_response(out)
app = web.Application()
app.router.add_post("/v1/completions", comp)
app.router.add_get("/log", log)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""

OURS = r"""
import json, sys
sys.path.insert(0, sys.argv[4])
from adapters.engines.vllm.adapter import VllmAdapter
from adapters.serving import load_generator as lg
url, conc, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
run = lg.run_load(url, VllmAdapter.server_api, ["p"] * n, lg.LoadProfile(concurrency=conc, requests=n, time_limit_s=60),
                  max_tokens=16, model="tiny")
assert all(r.ok for r in run.requests), [r.error for r in run.requests][:2]
print(json.dumps([(r.sent, r.chunk_times[0]) for r in run.requests]))
"""

THEIRS = r"""
import asyncio, json, sys
import aiohttp
from vllm.benchmarks.lib.endpoint_request_func import RequestFuncInput, async_request_openai_completions
url, conc, n, trust_env = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "1"
async def main():
    sem = asyncio.Semaphore(conc)
    # vllm/benchmarks/serve.py's session, but trust_env where asked
    conn = aiohttp.TCPConnector(limit=conc, limit_per_host=conc, ttl_dns_cache=300, use_dns_cache=True,
                                keepalive_timeout=60, enable_cleanup_closed=True, force_close=False)
    async with aiohttp.ClientSession(connector=conn, trust_env=trust_env,
                                     timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)) as s:
        async def one():
            async with sem:
                return await async_request_openai_completions(RequestFuncInput(
                    prompt="p", api_url=url + "/v1/completions", prompt_len=1, output_len=16, model="tiny"), s)
        return await asyncio.gather(*(one() for _ in range(n)))
outs = asyncio.run(main())
assert all(o.success for o in outs), outs[0].error
print(json.dumps([(o.start_time, o.start_time + o.ttft) for o in outs]))
"""


def _get_log(url: str) -> list:
    import urllib.request

    return json.loads(urllib.request.urlopen(url + "/log").read())


def one_side(side: str, url: str, conc: int, n: int) -> dict[str, float]:
    _get_log(url)   # empty the server's log
    if side == "ours":
        argv = [sys.executable, "-c", OURS, url, str(conc), str(n), str(ROOT)]
    else:
        argv = [str(VLLM_PY), "-c", THEIRS, url, str(conc), str(n), "1" if side == "theirs" else "0"]
    out = subprocess.run(argv, capture_output=True, text=True, env=os.environ | {"VLLM_TARGET_DEVICE": "cpu"})
    if out.returncode:
        raise RuntimeError(f"{side}: {out.stderr[-2000:]}")
    client = sorted(json.loads(out.stdout.splitlines()[-1]))
    server = sorted(_get_log(url))
    us = lambda xs: 1e6 * statistics.median(xs)  # noqa: E731
    return {"client part": us([(st - s) - (w - r) for (s, st), (r, w) in zip(client, server)]),
            "sent->recv": us([r - s for (s, _), (r, _) in zip(client, server)]),
            "write->stamp": us([st - w for (_, st), (_, w) in zip(client, server)])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--quick", action="store_true", help="one round, concurrency 2, 8 requests, for CI")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.concurrency, args.requests = 1, "2", 8
    sys.path.insert(0, str(ROOT))
    from adapters.serving.server_process import free_port

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    sides = ["ours", "theirs", "theirs:noenv"]
    rows: dict[tuple[int, str], list[dict]] = {}
    try:
        for _ in range(100):
            try:
                _get_log(url)
                break
            except OSError:
                time.sleep(0.1)
        for rnd in range(args.rounds):
            for conc in (int(c) for c in args.concurrency.split(",")):
                for side in sides if rnd % 2 == 0 else sides[::-1]:
                    rows.setdefault((conc, side), []).append(one_side(side, url, conc, args.requests))
    finally:
        server.terminate()
        server.wait(10)
    print(f"canned SSE server, {args.requests} requests of 16 chunks per run, {args.rounds} rounds; "
          f"load avg {os.getloadavg()[0]:.2f}; medians over rounds of the per-run medians, microseconds\n")
    head = f"{'conc':>4} {'client':<13} | {'client part of TTFT':>18} {'sent->recv':>10} {'write->stamp':>12}"
    print(head + "\n" + "-" * len(head))
    for (conc, side), rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"{conc:>4} {side:<13} | {med['client part']:>18.0f} {med['sent->recv']:>10.0f} "
              f"{med['write->stamp']:>12.0f}")


if __name__ == "__main__":
    main()
