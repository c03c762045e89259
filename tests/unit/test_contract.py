"""The measurement contract (adapters/contract/): one top-k rule through every capture path, one
`summarize` for every latency figure, typed messages across the process boundary. Which module may
import which: tests/unit/test_layout.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
from pydantic import ValidationError

from adapters.base import log_softmax
from adapters.contract.events import Loaded, LoadFacts, parse_event
from adapters.contract.records import LOGPROB_COLUMNS, CellRecord, topk_dense, topk_sparse
from adapters.contract.specs import GroupSpec
from adapters.contract.timing import CellMetrics, RequestTiming, TimedRun, summarize
from adapters.engines.lmdeploy import adapter as lmd
from adapters.engines.vllm.adapter import VllmAdapter
from adapters.serving.capture import _capture_one
from orchestrator.store.schema import CELLS_SCHEMA, LOGPROBS_SCHEMA

# ------------------------------------------------------------------ one top-k rule

K = 8          # more than the vocabulary: every list is padded
VOCAB = 6
# two positions with ties (ids 1, 2 and 4 share a logprob at row 0; 0 and 5 at row 1)
PROBS = np.array([[0.1, 0.2, 0.2, 0.15, 0.2, 0.15],
                  [0.25, 0.1, 0.05, 0.2, 0.15, 0.25]])
LOGPROBS = np.log(PROBS).astype(np.float32)
ACTUAL = [3, 0]
WANT_IDS = [[1, 2, 4, 3, 5, 0, -1, -1], [0, 5, 3, 4, 1, 2, -1, -1]]


def _paths() -> dict[str, object]:
    """The same rows as every capture path receives them, in the shape its engine or server returns."""
    pairs = [[(i, float(LOGPROBS[r, i])) for i in range(VOCAB)] for r in range(2)]
    out = {}
    # hf, llama.cpp, TensorRT-LLM and LMDeploy TurboMind: full-vocabulary raw logits, log-softmaxed here
    out["dense (hf, llama.cpp, TensorRT-LLM, TurboMind)"] = topk_dense(log_softmax(LOGPROBS), ACTUAL, K)
    # vLLM offline: per position {id: Logprob(logprob, rank, decoded_token)}, ids in whatever order
    positions = [{i: SimpleNamespace(logprob=lp, rank=None) for i, lp in reversed(p)} for p in pairs]
    out["vllm offline"] = VllmAdapter._scores(positions, ACTUAL, K)
    # vLLM served: "token_id:<id>" keys in top_logprobs (return_tokens_as_token_ids)
    api = VllmAdapter.server_api
    resp = {"choices": [{"finish_reason": "length", "logprobs": {
        "tokens": [f"token_id:{t}" for t in ACTUAL],
        "token_logprobs": [float(LOGPROBS[r, t]) for r, t in enumerate(ACTUAL)],
        "top_logprobs": [{f"token_id:{i}": lp for i, lp in p} for p in pairs]}}], "usage": {"prompt_tokens": 4}}
    out["vllm served"] = _capture_one(resp, api, None, [9, 9, 9, 9], K, want_prompt=False).generation
    # llama.cpp served: token strings, mapped back through the vocabulary
    from adapters.engines.llamacpp.adapter import LlamacppAdapter

    names = {f"<{i}>": i for i in range(VOCAB)}
    resp = {"choices": [{"finish_reason": "length", "logprobs": {
        "tokens": [f"<{t}>" for t in ACTUAL],
        "token_logprobs": [float(LOGPROBS[r, t]) for r, t in enumerate(ACTUAL)],
        "top_logprobs": [{f"<{i}>": lp for i, lp in p} for p in pairs]}}], "usage": {}}
    out["llama.cpp served"] = _capture_one(resp, LlamacppAdapter.server_api, names.get, [9, 9], K,
                                           want_prompt=False).generation
    # LMDeploy PyTorch engine: per step {id: logprob}
    out["lmdeploy pytorch"] = lmd._scores_from_steps([dict(p) for p in pairs], np.asarray(ACTUAL), K)
    return out


def test_every_capture_path_gives_the_same_id_lists():
    for name, s in _paths().items():
        assert s.topk_ids.tolist() == WANT_IDS, name
        assert s.token_ids.tolist() == ACTUAL, name
        np.testing.assert_allclose(s.logprobs, [LOGPROBS[0, 3], LOGPROBS[1, 0]], rtol=1e-6, err_msg=name)
        assert np.isneginf(s.topk_logprobs[:, VOCAB:]).all(), name    # padded one way: -1 / -inf
        np.testing.assert_allclose(s.topk_logprobs[:, :VOCAB], np.take_along_axis(LOGPROBS, np.array(WANT_IDS)[:, :VOCAB], 1),
                                   rtol=1e-6, err_msg=name)


def test_sparse_rule_drops_unmapped_ids_and_keeps_a_missing_logprob_null():
    s = topk_sparse([(-1, None, [(-1, -0.1), (4, -1.0), (2, -1.0)])], 3)
    assert s.topk_ids.tolist() == [[2, 4, -1]] and s.token_ids.tolist() == [-1] and np.isnan(s.logprobs[0])


# ------------------------------------------------------------------ one summarize

def _run(chunks: list[list[tuple[float, int]]], start=0.0, end=1.0, **kw) -> TimedRun:
    reqs = []
    for c in chunks:
        r = RequestTiming(sent=start, end=end, prompt_tokens=4)
        for t, n in c:
            r.add_chunk(t, n)
        r.output_tokens = sum(n for _, n in c)
        reqs.append(r)
    return TimedRun(start=start, end=end, requests=reqs, **kw)


def test_multi_token_chunks_are_one_itl_gap_never_zeros():
    # a speculative step (or a server) that brings 3 tokens at once: one gap, not two zeros
    m = summarize([_run([[(0.1, 1), (0.2, 3), (0.4, 1)]])])
    assert m.itl_samples == 2 and m.itl_ms_p50 == pytest.approx(150.0) and min(m.itl_ms_p50, m.itl_ms_p90) > 0
    assert m.ttft_ms == [pytest.approx(100.0)] and m.e2e_ms == [pytest.approx(400.0)]
    assert m.tpot_ms == [pytest.approx(300.0 / 4)] and m.chunk_tokens_mean == pytest.approx(5 / 3)
    assert m.output_tokens == 5 and m.output_tok_s == pytest.approx(5.0)
    # every token of a reply in one chunk (a server that buffered the stream): no time per token was
    # measured, so no TPOT, never a zero
    one = summarize([_run([[(0.1, 4)], [(0.1, 2), (0.3, 2)]])])
    assert one.tpot_ms == [pytest.approx(200.0 / 3)] and one.tpot_ms_p50 == pytest.approx(200.0 / 3)
    none = summarize([_run([[(0.1, 4)]])])
    assert none.tpot_ms_p50 is None and "more than one chunk" in none.missing["tpot_ms"]


def test_unmeasured_times_are_null_with_a_reason_never_a_number():
    run = _run([[(0.1, 1), (0.2, 1)], []], missing={"token_times": "vLLM internals moved"})
    run.requests[1].output_tokens = 2        # tokens came back, their times did not
    m = summarize([run])
    for name in ("ttft", "tpot", "itl", "e2e"):
        assert getattr(m, f"{name}_ms_p50") is None and "1 of 2 requests unmeasured: vLLM internals moved" in m.missing[
            f"{name}_ms"]
    assert m.ttft_ms == [] and m.goodput is None and "goodput" in m.missing
    assert m.output_tok_s == pytest.approx(4.0)     # the throughput was measured: it stays
    assert "engine_ttft_ms" in m.missing and m.engine_ttft_agrees is None


def test_engine_ttft_is_stored_beside_ours_and_compared_with_the_stated_margin():
    run = _run([[(0.100, 1), (0.2, 1)], [(0.100, 1), (0.3, 1)]])
    run.requests[0].engine_ttft_s, run.requests[1].engine_ttft_s = 0.0995, 0.0996
    m = summarize([run])
    assert m.engine_ttft_ms == pytest.approx([99.5, 99.6]) and m.engine_ttft_agrees is True
    run.requests[0].engine_ttft_s = run.requests[1].engine_ttft_s = 0.080    # 20 ms apart: over 10% of 100 ms
    assert summarize([run]).engine_ttft_agrees is False


def test_served_errors_queue_and_goodput():
    ok = _run([[(0.3, 1), (0.5, 1)]])
    ok.requests[0].scheduled = -0.1
    bad = RequestTiming(sent=0.0, error="HTTP 500", error_kind="http")
    run = TimedRun(start=0.0, end=1.0, requests=[*ok.requests, bad], not_sent=1)
    m = summarize([run], slo_ttft_ms=250.0)
    assert (m.requests, m.requests_sent, m.requests_planned, m.errors) == (1, 2, 3, 1)
    assert m.errors_by_kind == {"http": 1} and m.queue_ms_p50 == pytest.approx(100.0)
    assert m.goodput == 0.0                       # its TTFT of 300 ms misses the 250 ms SLO
    assert summarize([run], slo_ttft_ms=400.0).goodput == pytest.approx(1 / 3)


# ------------------------------------------------------------------ typed messages, and the store derived from them

def test_events_and_specs_are_typed():
    ev = parse_event(Loaded(load_s=1.5, load_peak_mem_bytes=None, mem_source="none",
                            facts=LoadFacts(notes=["x"])).model_dump_json())
    assert isinstance(ev, Loaded) and ev.facts.notes == ["x"]
    with pytest.raises(ValidationError):
        parse_event('{"event": "cell_done"}')              # no cell id
    with pytest.raises(ValidationError):
        parse_event('{"event": "exploded", "cell_id": "a"}')
    spec = {"load": {"framework": "hf", "model": {"name": "m", "source": "/m"}, "quantization": "fp32"},
            "cells": [{"cell_id": "c", "batch_size": 1, "output_len": 4, "warmup": 0, "repeats": 1,
                       "timing_prompts": [[1, 2]]}]}
    assert GroupSpec.model_validate(spec).cells[0].ignore_eos
    with pytest.raises(ValidationError, match="batchsize"):
        GroupSpec.model_validate(spec | {"cells": [spec["cells"][0] | {"batchsize": 2}]})


def test_store_schemas_come_from_the_contract():
    assert LOGPROBS_SCHEMA.names == ["run_id", "cell_id"] + [n for n, _, _ in LOGPROB_COLUMNS]
    for name, dtype, is_list in LOGPROB_COLUMNS:
        t = LOGPROBS_SCHEMA.field(name).type
        assert pa.types.is_list(t) == is_list
    # every figure a worker writes has its column (the launcher adds the load facts)
    record_fields = set(CellRecord.model_fields) | set(CellMetrics.model_fields)
    assert record_fields - set(CELLS_SCHEMA.names) == set()
