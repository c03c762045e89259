"""An engine's own Prometheus metrics around a cell's timed runs: the figures that explain its speed.

Counters (prefix-cache queries and hits, preemptions) are read before the first timed run and after
the last: a cell's figure is their difference, so whatever ran before (load, warm-up, other cells)
is not counted. vLLM counts prefix-cache queries and hits in tokens (hits in whole KV blocks), so
the hit rate is hit tokens / queried tokens. Gauges (KV-cache usage, requests waiting) are worth
nothing before or after a load point (the queue is empty then): a served cell samples them every
`GAUGE_INTERVAL_S` during its timed runs and keeps the largest, from a process of its own (`python -m
adapters.meters.telemetry`: a sampling thread in the load generator's process took its GIL for the
~50 KB parse of every scrape, 300 ms a scrape on a busy 2-core host, and delayed the very chunk times
it stood beside); an offline cell does not sample them (a sampling thread in the engine's process
costs the engine it measures: adapters/meters/memory.py).

One parser (prometheus_client's) and one definition of every figure (`figures`), for the served
/metrics text and the offline engine's in-process registry alike (vLLM's `LLM.get_metrics()`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

# figure -> the metric families that give it, per server (the first one present is used).
# vLLM: vllm/v1/metrics/loggers.py (PrometheusStatLogger). llama.cpp's own llama-server with
# --metrics: tools/server/server.cpp (no prefix-cache or preemption counters; kv_cache_usage_ratio
# only in older builds).
COUNTERS = {
    "prefix_cache_queries": ("vllm:prefix_cache_queries",),
    "prefix_cache_hits": ("vllm:prefix_cache_hits",),
    "preemptions": ("vllm:num_preemptions",),
}
GAUGES = {
    "kv_cache_usage_max": ("vllm:kv_cache_usage_perc", "llamacpp:kv_cache_usage_ratio"),   # a share, 0-1
    "requests_waiting_max": ("vllm:num_requests_waiting", "llamacpp:requests_deferred"),
}
FIGURES = (*COUNTERS, "prefix_cache_hit_rate", *GAUGES, "gauge_samples")
# each scrape of vLLM's /metrics (~50 KB) costs its API server a few ms of CPU (60 ms wall on a busy
# 2-core machine): once a second is a small share of it, and enough for load points of seconds
GAUGE_INTERVAL_S = 1.0

# why an offline cell has no gauge figures
OFFLINE_GAUGES = ("offline: gauges are not sampled during a batch (a sampling thread in the engine's process "
                  "costs the engine it measures)")

Snapshot = dict[str, float]   # metric family -> value, summed over its label sets


# a share per engine: the fullest engine's, not a sum over engines
_SHARES = {"vllm:kv_cache_usage_perc", "llamacpp:kv_cache_usage_ratio"}


def parse(text: str) -> Snapshot:
    """Prometheus text -> {family: value} for counters and gauges (a counter's `_total` sample; its
    `_created` timestamp is not a value), summed over label sets (engines, models); shares: the largest."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Snapshot = {}
    for fam in text_string_to_metric_families(text):
        if fam.type not in ("counter", "gauge"):
            continue
        if fam.type == "counter":   # declared, no label set counted yet: nothing counted
            out.setdefault(fam.name, 0.0)
        want = (fam.name, fam.name + "_total")   # a counter's value is its _total sample
        for s in fam.samples:
            if s.name in want:
                v = float(s.value)
                out[fam.name] = max(out.get(fam.name, v), v) if fam.name in _SHARES else out.get(fam.name, 0.0) + v
    return out


def from_engine(metrics) -> Snapshot:
    """vLLM's `LLM.get_metrics()` (vllm.v1.metrics.reader: Counter and Gauge objects named by family)."""
    out: Snapshot = {}
    for m in metrics:
        value = getattr(m, "value", None)
        if isinstance(value, (int, float)):
            out[m.name] = out.get(m.name, 0.0) + float(value)
    return out


def _first(snap: Snapshot, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if n in snap), None)


def figures(before: Snapshot | None, after: Snapshot | None, gauges: list[Snapshot] | None,
            unavailable: str | None = None, gauges_why: str | None = None) -> tuple[dict, dict[str, str]]:
    """The one definition of every telemetry figure: (values, missing). Counters: after - before;
    the hit rate: hits / queries (null with no query: prefix caching off, or no prompt reached it);
    gauges: the largest of the samples taken during the timed runs."""
    values: dict = dict.fromkeys(FIGURES)
    missing: dict[str, str] = {}
    if unavailable or before is None or after is None:
        return values, dict.fromkeys(FIGURES, unavailable or "the engine's metrics could not be read")
    for key, names in COUNTERS.items():
        name = _first(after, names)
        if name is None:
            missing[key] = f"the engine exports none of {', '.join(names)}"
        else:
            values[key] = int(round(after[name] - before.get(name, 0.0)))
    q, h = values["prefix_cache_queries"], values["prefix_cache_hits"]
    if q is None or h is None:
        missing["prefix_cache_hit_rate"] = missing.get("prefix_cache_queries") or missing["prefix_cache_hits"]
    elif q == 0:
        missing["prefix_cache_hit_rate"] = "no prefix-cache queries in the timed runs (prefix caching off?)"
    else:
        values["prefix_cache_hit_rate"] = h / q
    for key, names in GAUGES.items():
        if gauges_why:
            missing[key] = gauges_why
            continue
        seen = [s[n] for s in gauges or () if (n := _first(s, names)) is not None]
        if seen:
            values[key] = max(seen)
        elif gauges:
            missing[key] = f"the engine exports none of {', '.join(names)}"
        else:
            missing[key] = f"no gauge sample fell inside the timed runs (one every {GAUGE_INTERVAL_S:g} s)"
    if gauges_why:
        missing["gauge_samples"] = gauges_why
    else:
        values["gauge_samples"] = len(gauges or ())
    if values["requests_waiting_max"] is not None:
        values["requests_waiting_max"] = int(round(values["requests_waiting_max"]))
    return values, missing


_GAUGE_FAMILIES = {n for names in GAUGES.values() for n in names}


def fetch(url: str, headers: dict | None) -> tuple[Snapshot, float]:
    """GET a /metrics URL and parse it: (snapshot, seconds it took)."""
    import httpx

    t0 = time.perf_counter()
    r = httpx.get(url, headers=headers, timeout=10.0, trust_env=False)
    if r.status_code != 200:
        raise RuntimeError(f"HTTP {r.status_code}")
    snap = parse(r.text)
    return snap, time.perf_counter() - t0


class Scraper:
    """A server's GET /metrics: one snapshot now, and a process of its own that samples gauges during
    timed runs (started and stopped around them; its samples come back through a file)."""

    def __init__(self, url: str, headers: dict | None = None, path: str = "/metrics",
                 interval_s: float = GAUGE_INTERVAL_S):
        self.url, self.headers, self.path, self.interval_s = url.rstrip("/"), headers, path, interval_s
        self.samples: list[Snapshot] = []
        self.scrape_s: list[float] = []        # the snapshots' own, and the sampling process's scrapes
        self.sampler_pid: int | None = None
        self._proc: subprocess.Popen | None = None
        self._out: str | None = None

    def unavailable(self) -> str | None:
        """Why this server's metrics cannot be read (None: they can), checked once before a cell."""
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            return "prometheus_client is not installed in this engine environment (pip install prometheus-client)"
        try:
            self.snapshot()
        except Exception as err:   # a server without the endpoint (llama-cpp-python's: HTTP 404)
            return f"GET {self.path} on the server failed: {err}"
        return None

    def snapshot(self) -> Snapshot:
        snap, took = fetch(self.url + self.path, self.headers)
        self.scrape_s.append(took)
        return snap

    def start_sampling(self) -> None:
        from adapters.contract.processes import die_with_parent

        fd, self._out = tempfile.mkstemp(prefix="bench-gauges-", suffix=".jsonl")
        os.close(fd)
        self.samples = []
        # the headers (an API key, maybe) go through stdin, never the command line
        self._proc = subprocess.Popen([sys.executable, "-m", "adapters.meters.telemetry", self.url + self.path,
                                       str(self.interval_s), self._out], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
        self._proc.stdin.write(json.dumps(self.headers or {}).encode())
        self._proc.stdin.close()
        self.sampler_pid = self._proc.pid
        # its start (an interpreter, httpx, the parser) is over before the first timed run begins
        self._proc.stdout.readline()

    def stop_sampling(self) -> list[Snapshot]:
        if self._proc is None:
            return self.samples
        self._proc.terminate()
        try:
            self._proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
        try:
            with open(self._out) as f:
                lines = [json.loads(line) for line in f if line.endswith("\n")]   # a torn last line: not a sample
        finally:
            os.unlink(self._out)
        self.samples = [x["gauges"] for x in lines]
        self.scrape_s += [x["scrape_s"] for x in lines]
        return self.samples


def _sample_forever(url: str, interval_s: float, out: str, headers: dict) -> None:
    """The sampling process: every interval, the gauge families of GET url, one JSON line each."""
    import httpx  # noqa: F401  (imported before it says it is ready)
    from prometheus_client import parser  # noqa: F401

    print("ready", flush=True)
    with open(out, "a") as f:
        while True:
            time.sleep(interval_s)
            try:
                snap, took = fetch(url, headers)
            except Exception:   # a missed sample is a smaller sample count, stated with the figure
                continue
            f.write(json.dumps({"gauges": {k: v for k, v in snap.items() if k in _GAUGE_FAMILIES},
                                "scrape_s": took}) + "\n")
            f.flush()


if __name__ == "__main__":   # python -m adapters.meters.telemetry URL INTERVAL_S OUT_FILE  (headers: JSON on stdin)
    import signal

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    _sample_forever(sys.argv[1], float(sys.argv[2]), sys.argv[3], json.loads(sys.stdin.read() or "{}"))
