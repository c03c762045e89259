"""Engine telemetry (adapters/meters/telemetry.py) and energy (adapters/meters/energy.py), without an engine.

The real engines' figures are checked in the runs that already exist: vLLM's served /metrics and
llama-cpp-python's missing one in tests/e2e/test_serve.py, vLLM's offline counters in tests/e2e/test_vllm.py.
Here: the Prometheus text comes from prometheus_client's own exposition (a real registry served over
real HTTP), and the energy counters, which this machine does not have, from stand-ins named as such:
a directory laid out as the kernel's /sys/class/powercap, and a double of the NVML calls.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server

from adapters.meters import telemetry
from adapters.meters.energy import POWERCAP, EnergyMeter
from adapters.serving.server_process import free_port


def _registry():
    r = CollectorRegistry()
    metrics = {
        "q": Counter("vllm:prefix_cache_queries", "tokens queried", ["engine"], registry=r),
        "h": Counter("vllm:prefix_cache_hits", "tokens hit", ["engine"], registry=r),
        "p": Counter("vllm:num_preemptions", "preemptions", ["engine"], registry=r),
        "kv": Gauge("vllm:kv_cache_usage_perc", "KV share", ["engine"], registry=r),
        "w": Gauge("vllm:num_requests_waiting", "waiting", ["engine"], registry=r),
    }
    return r, metrics


def test_counters_are_differences_and_gauges_the_largest_sample():
    r, m = _registry()
    m["q"].labels("0").inc(300)
    before = telemetry.parse(generate_latest(r).decode())
    # two engines (data parallel): counters and queues add up, a KV share is the fullest engine's
    m["q"].labels("0").inc(600)
    m["q"].labels("1").inc(100)
    m["h"].labels("0").inc(512)
    m["p"].labels("1").inc(2)
    samples = []
    for kv, waiting in ((0.25, 3), (0.5, 1), (0.1, 0)):
        m["kv"].labels("0").set(kv)
        m["kv"].labels("1").set(kv / 2)
        m["w"].labels("0").set(waiting)
        m["w"].labels("1").set(1)
        samples.append(telemetry.parse(generate_latest(r).decode()))
    after = samples[-1]
    assert before["vllm:prefix_cache_queries"] == 300.0     # the _total sample, not its _created timestamp
    values, missing = telemetry.figures(before, after, samples)
    assert missing == {}
    assert values == {"prefix_cache_queries": 700, "prefix_cache_hits": 512, "preemptions": 2,
                      "prefix_cache_hit_rate": 512 / 700, "kv_cache_usage_max": 0.5, "requests_waiting_max": 4,
                      "gauge_samples": 3}


def test_missing_figures_say_why():
    r, m = _registry()
    snap = telemetry.parse(generate_latest(r).decode())
    # no query at all (prefix caching off): no hit rate, and why
    values, missing = telemetry.figures(snap, snap, [])
    assert values["prefix_cache_queries"] == 0 and values["prefix_cache_hit_rate"] is None
    assert "no prefix-cache queries" in missing["prefix_cache_hit_rate"]
    assert "no gauge sample fell inside" in missing["kv_cache_usage_max"] and values["gauge_samples"] == 0
    # a server that exports other metrics (llama.cpp's llama-server has no prefix-cache counter)
    other = CollectorRegistry()
    Gauge("llamacpp:requests_deferred", "deferred", registry=other).set(2)
    snap = telemetry.parse(generate_latest(other).decode())
    values, missing = telemetry.figures(snap, snap, [snap])
    assert values["requests_waiting_max"] == 2 and values["prefix_cache_hits"] is None
    assert missing["prefix_cache_hit_rate"] == "the engine exports none of vllm:prefix_cache_queries"
    # offline: counters only; nothing readable: every figure null with the one reason
    values, missing = telemetry.figures(snap, snap, None, gauges_why=telemetry.OFFLINE_GAUGES)
    assert missing["kv_cache_usage_max"] == missing["gauge_samples"] == telemetry.OFFLINE_GAUGES
    values, missing = telemetry.figures(None, None, None, unavailable="hf: no metrics")
    assert set(values.values()) == {None} and set(missing) == set(telemetry.FIGURES)


def test_scraper_reads_a_real_metrics_endpoint():
    """One snapshot of prometheus_client's own server (the sampling process during timed runs:
    e2e/test_gauge_sampler.py)."""
    r, m = _registry()
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=r)
    try:
        scraper = telemetry.Scraper(f"http://127.0.0.1:{port}", interval_s=0.05)
        assert scraper.unavailable() is None
        before = scraper.snapshot()
        m["w"].labels("0").set(5)
        m["q"].labels("0").inc(10)
        values, missing = telemetry.figures(before, scraper.snapshot(), [scraper.snapshot()])
        assert values["requests_waiting_max"] == 5 and values["prefix_cache_queries"] == 10
        assert values["prefix_cache_hit_rate"] == 0.0 and values["gauge_samples"] == 1
        assert len(scraper.scrape_s) == 4         # unavailable()'s probe and three snapshots
    finally:
        server.shutdown()
    # nothing listening (a server without the endpoint, HTTP 404: llama-cpp-python's, in tests/e2e/test_serve.py)
    dead = telemetry.Scraper(f"http://127.0.0.1:{free_port()}")
    assert dead.unavailable().startswith("GET /metrics on the server failed: ")


# ------------------------------------------------------------------ energy

def test_energy_here_is_measured_or_null_with_the_reason():
    """This machine, as it is: a RAPL package counter that can be read gives joules, none gives the reason."""
    meter = EnergyMeter("cpu")
    zones = sorted(POWERCAP.glob("intel-rapl:*")) if POWERCAP.is_dir() else []
    values, missing = meter.figures(100)
    if not zones:
        assert values["energy_j"] is None and values["energy_j_per_token"] is None
        assert missing["energy_j"] == (f"no RAPL counter under {POWERCAP} (the kernel or this container exposes "
                                      "none): CPU energy not measured")
    elif meter.unavailable:
        assert values["energy_j"] is None and "permission denied" in missing["energy_j"]
    else:
        meter.measure(lambda: sum(i * i for i in range(2_000_000)))
        values, missing = meter.figures(100)
        assert values["energy_j"] > 0 and values["energy_source"].startswith("rapl:") and not missing


def _powercap(root: Path, zones: dict[str, tuple[int, int]]) -> Path:
    """A directory laid out as the kernel's /sys/class/powercap (which this machine lacks): zone -> (uJ, range)."""
    for i, (name, (uj, wrap)) in enumerate(zones.items()):
        z = root / f"intel-rapl:{i}"
        z.mkdir(parents=True)
        (z / "name").write_text(name + "\n")
        (z / "energy_uj").write_text(f"{uj}\n")
        (z / "max_energy_range_uj").write_text(f"{wrap}\n")
        sub = root / f"intel-rapl:{i}:0"        # a subzone (core): inside its package, never added again
        sub.mkdir()
        (sub / "energy_uj").write_text("999999999\n")
    return root


def test_rapl_joules_per_token_and_counter_wrap(tmp_path):
    root = _powercap(tmp_path / "powercap", {"package-0": (1_000_000, 10_000_000), "package-1": (9_500_000, 10_000_000)})
    meter = EnergyMeter("cpu", powercap=root)
    assert meter.unavailable is None and meter.source == "rapl:package-0,package-1"

    def run(uj0: int, uj1: int):
        (root / "intel-rapl:0" / "energy_uj").write_text(f"{uj0}\n")
        (root / "intel-rapl:1" / "energy_uj").write_text(f"{uj1}\n")
        return "out"

    # package 0: +2.5 J; package 1 wraps at 10 J: 9.5 -> 0.5 is +1.0 J
    assert meter.measure(lambda: run(3_500_000, 500_000)) == "out"
    values, missing = meter.figures(output_tokens=35)
    assert values["energy_j"] == pytest.approx(3.5) and values["energy_j_per_token"] == pytest.approx(0.1)
    assert values["energy_source"] == "rapl:package-0,package-1" and missing == {}
    meter.measure(lambda: run(4_000_000, 1_000_000))      # a second timed run adds up
    assert meter.figures(35)[0]["energy_j"] == pytest.approx(4.5)
    meter.reset()
    meter.measure(lambda: run(4_000_100, 1_000_000))
    values, missing = meter.figures(0)
    assert values["energy_j"] == pytest.approx(1e-4) and values["energy_j_per_token"] is None
    assert missing == {"energy_j_per_token": "no output token in the timed runs"}
    # a counter that did not move over the timed runs measured nothing: null with why, never 0 J
    meter.reset()
    meter.measure(lambda: run(4_000_100, 1_000_000))
    values, missing = meter.figures(35)
    assert values == {"energy_j": None, "energy_j_per_token": None, "energy_source": None}
    assert missing["energy_j"].startswith("the energy counters did not advance over 1 timed runs (")
    meter.reset()
    assert "no timed run was measured" in meter.figures(35)[1]["energy_j"]


def test_rapl_permission_denied_is_the_reason(tmp_path, monkeypatch):
    root = _powercap(tmp_path / "powercap", {"package-0": (1, 10)})
    real = Path.read_text

    def refuse(self, *a, **k):   # stands in for the kernel refusing a non-root read (this test runs as root)
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", refuse)
    meter = EnergyMeter("cpu", powercap=root)
    values, missing = meter.figures(10)
    assert values["energy_j"] is None
    assert missing["energy_j"].startswith(f"permission denied reading {root / 'intel-rapl:0' / 'energy_uj'}")


class NvmlDouble:
    """Stands in for pynvml (no GPU here): only the calls adapters/meters/energy.py makes, with counters in mJ."""

    class NotSupported(Exception):
        pass

    def __init__(self, energy_mj: dict[str, int], supported: bool = True):
        self.energy_mj, self.supported = energy_mj, supported
        self.uuids = list(energy_mj)

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.uuids[i]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return uuid

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        if not self.supported:
            raise self.NotSupported("Not Supported")
        return self.energy_mj[handle]


def test_nvml_energy_of_the_visible_gpus(monkeypatch):
    nvml = NvmlDouble({"GPU-a": 1_000_000, "GPU-b": 5_000_000, "GPU-c": 0})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,GPU-c")   # an index and a UUID: GPU-b and GPU-c, not GPU-a
    meter = EnergyMeter("cuda", nvml=nvml)
    assert meter.source == "nvml:2 GPU(s)"

    def work():
        nvml.energy_mj["GPU-a"] += 999_000
        nvml.energy_mj["GPU-b"] += 1_500      # 1.5 J
        nvml.energy_mj["GPU-c"] += 500        # 0.5 J

    meter.measure(work)
    values, missing = meter.figures(output_tokens=40)
    assert values == {"energy_j": pytest.approx(2.0), "energy_j_per_token": pytest.approx(0.05),
                      "energy_source": "nvml:2 GPU(s)"} and missing == {}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert EnergyMeter("cuda", nvml=nvml).source == "nvml:3 GPU(s)"
    old = EnergyMeter("cuda", nvml=NvmlDouble({"GPU-a": 0}, supported=False))
    values, missing = old.figures(10)
    assert values["energy_j"] is None and missing["energy_j"].startswith("NVML has no total-energy counter on this GPU")
