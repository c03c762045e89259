"""The served cells' gauge sampler (adapters/meters/telemetry.py Scraper.start_sampling / stop_sampling): a
process of its own, not a thread in the load generator's process (whose GIL its parse of every scrape
took: 300 ms a scrape on a busy host, beside the very chunk times the client was taking), against a real
HTTP server on loopback that serves Prometheus text and checks the request's headers."""

from __future__ import annotations

import http.server
import os
import threading
import time

import psutil
import pytest

from adapters.meters.telemetry import Scraper, figures

TOKEN = "Bearer not-a-real-key"
TEXT = ("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting {w}\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc {u}\n"
        "# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total 10.0\n"
        "# TYPE unrelated gauge\nunrelated 7\n")


@pytest.fixture
def server():
    hits = {"n": 0, "auth": set()}

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path != "/metrics":
                self.send_error(404)
                return
            hits["n"] += 1
            hits["auth"].add(self.headers.get("Authorization"))
            body = TEXT.format(w=hits["n"], u=hits["n"] / 100).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", hits
    srv.shutdown()


def test_gauges_are_sampled_by_a_process_of_their_own(server):
    url, hits = server
    scraper = Scraper(url, headers={"Authorization": TOKEN}, interval_s=0.1)
    before = scraper.snapshot()
    scraper.start_sampling()
    pid = scraper.sampler_pid
    assert pid and pid != os.getpid()
    child = psutil.Process(pid)
    assert child.ppid() == os.getpid() and TOKEN not in " ".join(child.cmdline())   # the key never on a command line
    time.sleep(0.65)
    gauges = scraper.stop_sampling()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    # about one sample every 0.1 s, each only the gauge families, in the order they were taken
    assert 3 <= len(gauges) <= 7, gauges
    assert all(set(g) == {"vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"} for g in gauges)
    waiting = [g["vllm:num_requests_waiting"] for g in gauges]
    assert waiting == sorted(waiting) and waiting[0] >= 2
    assert hits["auth"] == {TOKEN}
    # every scrape's own time is kept (the snapshot's and the sampler's)
    assert len(scraper.scrape_s) == 1 + len(gauges) and all(0 < s < 5 for s in scraper.scrape_s)
    values, missing = figures(before, scraper.snapshot(), gauges)
    assert values["requests_waiting_max"] == int(max(waiting)) and values["gauge_samples"] == len(gauges)
    assert values["kv_cache_usage_max"] == pytest.approx(max(waiting) / 100)


def test_a_scrape_that_fails_is_a_missing_sample_not_an_error(server):
    url, _ = server
    scraper = Scraper(url, path="/nothing-here", interval_s=0.05)
    scraper.start_sampling()
    time.sleep(0.3)
    assert scraper.stop_sampling() == []
