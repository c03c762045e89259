"""Load shapes in the matrix: a trace workload (Mooncake JSONL, BurstGPT CSV: orchestrator/inputs/traces.py), serve.arrival's
gamma and ramp; how they expand into cells and what validation says of them, with YAML paths."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orchestrator.execution.engine_child.prompts import Tokenizer, timing_requests
from orchestrator.execution.engine_child.spec import load_kind
from orchestrator.inputs import traces
from orchestrator.matrix.cells import expand, load_label, serve_settings
from orchestrator.matrix.validate import parse_matrix
from tests.helpers import ROOT, problems

TRACE = str(ROOT / "tests" / "data" / "mooncake_trace.jsonl")
BURSTGPT = ROOT / "tests" / "data" / "burstgpt_trace.csv"
BASE = {
    "models": {"tiny": "builtin:tiny"},
    "axes": {"framework": ["vllm"], "model": ["tiny"], "mode": ["serve"], "batch_size": [4], "input_len": [128],
             "output_len": [16]},
}


def matrix(**top):
    return json.loads(json.dumps(BASE)) | top


@pytest.fixture(scope="module")
def tok(tiny_model):
    return Tokenizer(str(tiny_model))


def test_the_shipped_trace():
    recs = traces.read_trace(TRACE).records
    assert 40 <= len(recs) <= 60
    assert all(r.input_length <= 128 and r.output_length <= 16 for r in recs)   # fits the tiny model
    ts = [r.timestamp for r in recs]
    assert ts == sorted(ts) and ts[0] == 0
    ids = [h for r in recs for h in r.hash_ids]
    assert len(set(ids)) < len(ids)             # blocks shared between requests


def test_trace_gaps_are_its_timestamps_scaled():
    recs = traces.read_trace(TRACE).records
    ts = np.array([r.timestamp for r in recs]) / 1e3
    for scale in (1.0, 0.25):
        gaps = traces.gaps_s(recs, len(recs), scale)
        assert gaps[0] == 0 and np.cumsum(gaps) == pytest.approx(ts * scale)
    # cycled: the trace again after its mean gap
    more = traces.gaps_s(recs, 2 * len(recs), 0.5)
    assert more[len(recs)] == pytest.approx(0.5 * ts[-1] / (len(recs) - 1))
    assert more[len(recs) + 1:] == pytest.approx(more[1:len(recs)])


def test_trace_requests_share_their_blocks(tok):
    recs = traces.read_trace(TRACE).records
    req = timing_requests(parse_matrix(matrix(workload={"kind": "trace", "path": TRACE, "block_size": 16})).workload,
                          tok, len(recs), 128, 16, "serve")
    assert [len(p) for p in req.prompts] == [r.input_length for r in recs]
    assert req.output_lens == [r.output_length for r in recs]
    assert np.cumsum(req.gaps_s) * 1e3 == pytest.approx([r.timestamp for r in recs])
    block = {}
    for p, r in zip(req.prompts, recs):
        for k, h in enumerate(r.hash_ids):
            piece = p[16 * k:16 * (k + 1)]
            if len(piece) == 16:     # a whole block: the same tokens wherever its id is
                assert block.setdefault(h, piece) == piece
    # requests with different first blocks differ from the start
    firsts = {r.hash_ids[0]: p[:16] for p, r in zip(req.prompts, recs)}
    assert len({tuple(v) for v in firsts.values()}) == len(firsts) > 1
    assert "trace: 48 requests over" in req.notes[0] and "blocks of 16 tokens" in req.notes[0]
    # capped at the input_len axis
    short = timing_requests(parse_matrix(matrix(workload={"kind": "trace", "path": TRACE, "block_size": 16})).workload,
                            tok, 5, 20, 4, "serve")
    assert max(len(p) for p in short.prompts) == 20 and max(short.output_lens) == 4
    assert not any("not replayed" in n for n in req.notes)
    # offline cells get the trace's requests, not its times, and say so; stream cells replay its times
    for mode in ("offline", "stream"):
        other = timing_requests(parse_matrix(matrix(workload={"kind": "trace", "path": TRACE, "block_size": 16}))
                                .workload, tok, 5, 20, 4, mode)
        assert other.prompts == short.prompts and other.gaps_s == short.gaps_s
        assert ("trace times not replayed: offline cells" in other.notes[-1]) == (mode == "offline")


def test_trace_blocks_shorter_than_the_length_are_topped_up(tmp_path, tok):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 40, "output_length": 2, "hash_ids": [1]}\n'
                    '{"timestamp": 10, "input_length": 40, "output_length": 2, "hash_ids": [1]}\n')
    w = parse_matrix(matrix(workload={"kind": "trace", "path": str(path), "block_size": 16})).workload
    req = timing_requests(w, tok, 2, 128, 16, "serve")
    a, b = req.prompts
    assert len(a) == len(b) == 40 and a[:16] == b[:16] and a[16:] != b[16:]
    assert "2 requests' blocks were shorter" in req.notes[0]


def test_serve_cells_of_the_new_shapes():
    gamma = parse_matrix(matrix(axes=BASE["axes"] | {"request_rate": [4.0]},
                                serve={"arrival": {"kind": "gamma", "burstiness": 0.5}}))
    (cell,) = expand(gamma)
    assert cell.request_rate == 4.0 and load_kind(gamma, cell) == "gamma"
    assert load_label("serve", 4, 4.0, "gamma") == "gamma 4/s, c<=4"
    ramp = parse_matrix(matrix(serve={"arrival": {"kind": "ramp", "start_rate": 1, "end_rate": 8, "duration_s": 30}}))
    (cell,) = expand(ramp)
    assert cell.request_rate is None and load_kind(ramp, cell) == "ramp"
    assert load_label("serve", 4, None, "ramp") == "ramp, c<=4"
    trace = parse_matrix(matrix(workload={"kind": "trace", "path": TRACE},
                                axes=BASE["axes"] | {"mode": ["offline", "serve"]}))
    cells = {c.mode: c for c in expand(trace)}
    assert cells["serve"].request_rate is None and load_kind(trace, cells["serve"]) == "trace"
    assert load_kind(trace, cells["offline"]) == "batch"
    # the plain names keep their place in serve cell ids
    plain = parse_matrix(matrix(serve={"arrival": "constant"}))
    assert serve_settings(plain)["arrival"] == "constant"
    assert serve_settings(parse_matrix(matrix()))["arrival"] == "poisson"
    assert serve_settings(ramp)["arrival"]["kind"] == "ramp"
    assert len({c.cell_id for m in (gamma, ramp, plain) for c in expand(m)}) == 3


def test_stream_cells_follow_the_shapes(cache_dir):
    """A stream cell takes the request_rate axis in serve.arrival's shape, a ramp's rates or a trace's times,
    named in its load and its id; a stream at rate inf is submitted at once, with the id it always had. The
    worker's spec carries the shape (serve cells get theirs from the group's ServeSpec)."""
    stream = BASE["axes"] | {"mode": ["stream"]}
    at_once = parse_matrix(matrix(axes=stream))
    (plain,) = expand(at_once)
    assert plain.request_rate is None and load_kind(at_once, plain) == "stream"
    rated = parse_matrix(matrix(axes=stream | {"request_rate": [float("inf"), 4.0]},
                                serve={"arrival": {"kind": "gamma", "burstiness": 0.5}}))
    both = {c.request_rate: c for c in expand(rated)}
    assert set(both) == {None, 4.0} and both[None].cell_id == plain.cell_id
    assert load_kind(rated, both[4.0]) == "gamma"
    assert load_label("stream", 4, 4.0, "gamma") == "stream, gamma 4/s, c<=4"
    assert load_label("stream", 4, None, "stream") == "stream c<=4"
    ramp = parse_matrix(matrix(axes=stream, serve={"arrival": RAMP}))
    (rc,) = expand(ramp)
    assert rc.request_rate is None and load_kind(ramp, rc) == "ramp" and rc.cell_id != plain.cell_id
    assert load_label("stream", 4, None, "ramp") == "stream, ramp, c<=4"
    trace = parse_matrix(matrix(axes=stream, workload={"kind": "trace", "path": TRACE}))
    (tc,) = expand(trace)
    assert load_kind(trace, tc) == "trace"
    assert len({plain.cell_id, both[4.0].cell_id, rc.cell_id, tc.cell_id}) == 4


RAMP = {"kind": "ramp", "start_rate": 1, "end_rate": 8, "duration_s": 30}


@pytest.mark.parametrize("top, expected", [
    ({"workload": {"kind": "trace", "path": "/nowhere/trace.jsonl"}},
     "workload.path: /nowhere/trace.jsonl: no such file (mark it cluster_only: true"),
    ({"workload": {"kind": "trace", "path": TRACE, "time_scale": 0}},
     "workload.time_scale: Input should be greater than 0"),
    ({"workload": {"kind": "trace", "path": TRACE, "block_size": 0}},
     "workload.block_size: Input should be greater than or equal to 1"),
    ({"serve": {"arrival": RAMP | {"end_rate": -1}}}, "serve.arrival.end_rate: Input should be greater than 0"),
    ({"serve": {"arrival": RAMP | {"start_rate": -2}}},
     "serve.arrival.start_rate: Input should be greater than or equal to 0"),
    ({"serve": {"arrival": RAMP | {"duration_s": 0}}}, "serve.arrival.duration_s: Input should be greater than 0"),
    ({"serve": {"arrival": {"kind": "gamma"}}}, "serve.arrival.burstiness: Field required"),
    ({"serve": {"arrival": {"kind": "gamma", "burstiness": 0}}},
     "serve.arrival.burstiness: Input should be greater than 0"),
    ({"serve": {"arrival": {"kind": "gamma", "burstiness": 1, "rate": 2}}}, "serve.arrival.rate: unknown key (known: kind, burstiness)"),
    ({"workload": {"kind": "trace", "path": TRACE, "scale": 2}},
     "workload.scale: unknown key (known: kind, path, time_scale, block_size, seed, cluster_only)"),
    ({"serve": {"arrival": {"kind": "trace", "gaps_s": [0]}}},
     "serve.arrival: Input tag 'trace' found using 'kind' does not match any of the expected tags: 'constant', "
     "'poisson', 'gamma', 'ramp'"),
    ({"serve": {"arrival": RAMP}, "axes": BASE["axes"] | {"request_rate": [4.0]}},
     "axes.request_rate: serve.arrival is a ramp (1 to 8 requests/s over 30 s), which sets its own rates; leave "
     "the axis out"),
    ({"serve": {"arrival": RAMP, "search": {"low": 1, "high": 8, "ttft_p99_ms": 100}}},
     "serve.search: a rate search sets the request rate, and serve.arrival is a ramp"),
    ({"workload": {"kind": "trace", "path": TRACE}, "axes": BASE["axes"] | {"request_rate": [4.0]}},
     "axes.request_rate: workload is a trace: its requests arrive at its own times (workload.time_scale scales "
     "them); leave the axis out"),
    ({"workload": {"kind": "trace", "path": TRACE}, "serve": {"search": {"low": 1, "high": 8, "ttft_p99_ms": 100}}},
     "serve.search: workload is a trace, whose serve cells arrive at its own times"),
])
def test_mistakes_name_their_yaml_path(top, expected):
    got = problems(matrix(**top))
    assert any(p.startswith(expected) for p in got), got


def test_a_burstgpt_log(tok):
    """BurstGPT's CSV: seconds from wherever its log starts, failed requests (0 response tokens) dropped and
    counted, no prefix sharing; its gaps are its timestamps' differences, and the row's note says all of it."""
    import csv

    rows = list(csv.DictReader(BURSTGPT.open()))
    kept = [r for r in rows if int(r["Response tokens"]) > 0]
    trace = traces.read_trace(BURSTGPT)
    assert trace.shape == "burstgpt" and trace.dropped == len(rows) - len(kept) == 2
    assert [r.input_length for r in trace.records] == [int(r["Request tokens"]) for r in kept]
    assert [r.output_length for r in trace.records] == [int(r["Response tokens"]) for r in kept]
    seconds = np.array([float(r["Timestamp"]) for r in kept])
    assert np.cumsum(traces.gaps_s(trace.records, len(kept), 0.5)) == pytest.approx((seconds - seconds[0]) * 0.5)
    assert all(not r.hash_ids for r in trace.records)
    w = parse_matrix(matrix(workload={"kind": "trace", "path": str(BURSTGPT)})).workload
    req = timing_requests(w, tok, len(kept), 128, 16, "serve")
    assert [len(p) for p in req.prompts] == [min(r.input_length, 128) for r in trace.records]
    assert "a BurstGPT log: no prefix sharing; 2 failed rows with 0 tokens dropped" in req.notes[0]


def test_a_csv_that_is_not_burstgpts(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("Timestamp,Prompt tokens,Response tokens\n0.5,4,2\n")
    got = problems(matrix(workload={"kind": "trace", "path": str(path)}))
    assert "a .csv trace is read as BurstGPT's, whose header names Timestamp, Request tokens, Response tokens; " \
           "missing: Request tokens" in got[0], got
    path.write_text("Timestamp,Request tokens,Response tokens\n0.5,four,2\n")
    assert "line 2: Timestamp, Request tokens and Response tokens must be numbers" in problems(
        matrix(workload={"kind": "trace", "path": str(path)}))[0]
    path.write_text("Timestamp,Request tokens,Response tokens\n0.5,4,0\n")
    assert "holds no requests (1 rows with 0 tokens dropped)" in problems(
        matrix(workload={"kind": "trace", "path": str(path)}))[0]


def test_a_malformed_trace_names_its_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 4, "output_length": 2, "hash_ids": [0]}\n'
                    '{"timestamp": 5, "output_length": 2, "hash_ids": [0]}\n')
    got = problems(matrix(workload={"kind": "trace", "path": str(path)}))
    assert f"workload.path: {path}: line 2: input_length: Field required" in got[0], got
    path.write_text('{"timestamp": 9, "input_length": 4, "output_length": 2}\n'
                    '{"timestamp": 5, "input_length": 4, "output_length": 2}\n')
    got = problems(matrix(workload={"kind": "trace", "path": str(path)}))
    assert "line 2: timestamp 5 is before the previous request's 9 (a trace is in time order)" in got[0], got


def test_the_worker_gets_the_shapes(cache_dir):
    """build_spec: a trace's serve cells carry its gaps (every prepared request's), a gamma's its group's
    shape; both survive the JSON the worker reads."""
    from adapters.contract.specs import GroupSpec
    from orchestrator.execution.engine_child.spec import GroupJob, build_spec, tokenizer_source
    from orchestrator.inputs import task_sets
    from orchestrator.matrix.cells import group

    for top in ({"workload": {"kind": "trace", "path": TRACE, "block_size": 16, "time_scale": 2.0}},
                {"serve": {"arrival": {"kind": "gamma", "burstiness": float("inf")}},
                 "axes": BASE["axes"] | {"request_rate": [4.0]}}):
        m = parse_matrix(matrix(measure={"warmup": 1, "repeats": 2}, serve={"requests": 10} | top.pop("serve", {}),
                                **top))
        (g,) = group(expand(m))
        job = GroupJob(run_id="r", group=g, matrix=m, device="cpu", python="python", cache_dir=str(cache_dir))
        spec = build_spec(job, g.cells, Tokenizer(tokenizer_source(job)), task_sets.load_tasks(m.tasks))
        spec = GroupSpec.model_validate_json(spec.model_dump_json())
        (cell,) = spec.cells
        n = 4 + 2 * 10       # warmup x batch_size, then repeats x serve.requests
        assert len(cell.timing_prompts) == n
        if m.workload.kind == "trace":
            recs = traces.read_trace(TRACE).records
            assert cell.request_rate is None and cell.arrival.kind == "trace" and len(cell.arrival.gaps_s) == n
            assert cell.arrival.gaps_s[1] == pytest.approx(2.0 * (recs[1].timestamp - recs[0].timestamp) / 1e3)
            assert spec.serve.arrival.kind == "poisson"      # the group's, which a trace's cells do not use
        else:
            assert cell.request_rate == 4.0 and cell.arrival is None
            assert spec.serve.arrival.kind == "gamma" and spec.serve.arrival.burstiness == float("inf")
