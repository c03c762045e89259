"""Workloads without engines: the seeded length distributions, the dataset readers, the requests a
workload makes (prefix groups, multi-turn conversations), and what validation says about them. (What
`bench validate` prints, as a child process: e2e/test_workloads_run.py.)"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from pydantic import ValidationError

from orchestrator.execution.engine_child.prompts import Tokenizer, timing_prompts, timing_requests
from orchestrator.inputs import datasets, lengths
from orchestrator.inputs.lengths import LengthDist
from orchestrator.matrix.models import MatrixError, ShareGptWorkload, SyntheticWorkload
from orchestrator.matrix.validate import parse_matrix
from tests.helpers import SHAREGPT


@pytest.fixture(scope="module")
def tok(tiny_model):
    return Tokenizer(str(tiny_model))


# ------------------------------------------------------------------ length distributions

@pytest.mark.parametrize("spec", [{"kind": "fixed", "value": 40}, {"kind": "uniform", "min": 10, "max": 90},
                                  {"kind": "normal", "mean": 100, "std": 20},
                                  {"kind": "lognormal", "mean": 200, "std": 150, "max": 900}])
def test_draws_are_seeded(spec):
    d = LengthDist(**spec)
    a, b, c = lengths.sample(d, 500, [0, 1]), lengths.sample(d, 500, [0, 1]), lengths.sample(d, 500, [1, 1])
    assert a == b and all(isinstance(x, int) for x in a)
    assert (a == c) == (spec["kind"] == "fixed")
    assert lengths.sample(d, 50, [0, 1]) == a[:50]   # request i's length does not depend on how many are drawn


def test_distributions_have_the_moments_they_name():
    n = 40_000
    logn = np.array(lengths.sample(LengthDist(kind="lognormal", mean=200, std=150), n, 7))
    # the lengths' own mean and std (not their log's): within 3% at n = 40k (the sample std's error is ~1.5%)
    assert abs(logn.mean() / 200 - 1) < 0.03 and abs(logn.std() / 150 - 1) < 0.05
    assert np.median(logn) < logn.mean()            # right-skewed, as production prompt lengths are
    norm = np.array(lengths.sample(LengthDist(kind="normal", mean=100, std=20), n, 7))
    assert abs(norm.mean() - 100) < 1 and abs(norm.std() - 20) < 1
    uni = np.array(lengths.sample(LengthDist(kind="uniform", min=10, max=20), n, 7))
    assert uni.min() == 10 and uni.max() == 20 and set(np.unique(uni)) == set(range(10, 21))


def test_clipping_and_bounds():
    d = LengthDist(kind="normal", mean=50, std=100, min=8, max=64)
    x = lengths.sample(d, 2000, 0)
    assert min(x) == 8 and max(x) == 64 and d.upper == 64 and d.nominal == 50
    assert LengthDist(kind="lognormal", mean=100, std=10).upper == 160   # no max: mean + 6 std
    with pytest.raises(ValidationError, match="needs mean, std"):
        LengthDist(kind="lognormal")
    with pytest.raises(ValidationError, match="below min"):
        LengthDist(kind="uniform", min=10, max=5)
    assert lengths.describe([1, 2, 3, 4]).startswith("n=4 mean 2.5 p50 2")


# ------------------------------------------------------------------ dataset readers

def test_sharegpt_reader(tmp_path):
    convs = datasets.read_sharegpt(SHAREGPT)
    assert len(convs) == 8 and convs[0][0] == ("system", "You are a helpful assistant for a small bakery.")
    assert [r for r, _ in convs[3]] == ["user", "assistant"] * 4
    openai = tmp_path / "o.jsonl"   # OpenAI-style messages, one record per line
    openai.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}))
    assert datasets.read_sharegpt(openai) == [[("user", "hi"), ("assistant", "yo")]]
    bad = tmp_path / "bad.json"
    bad.write_text('[{"conversations": [{"from": "robot", "value": "x"}]}]')
    with pytest.raises(datasets.DatasetError, match="record 0 turn 0 needs from/role"):
        datasets.read_sharegpt(bad)


def test_jsonl_reference_outputs_give_output_lengths(tmp_path, tok):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"q": f"Question {i}?", "ref": "word " * (3 * i + 1)}) for i in range(4)))
    w = parse_matrix({"models": {"t": "builtin:tiny"}, "axes": {"framework": ["hf"], "model": ["t"], "output_len": [12]},
                      "workload": {"kind": "jsonl", "path": str(path), "field": "q", "output_field": "ref"}}).workload
    req = timing_requests(w, tok, 6, 64, 12, "offline")
    want = [min(12, len(tok.encode("word " * (3 * i + 1)))) for i in range(4)]
    assert req.output_lens == want + want[:2] and req.prompts[0] == tok.encode("Question 0?")
    assert "output lengths from the references" in req.notes[0]
    with pytest.raises(datasets.DatasetError, match="line 1 has no text field 'answer'"):
        datasets.read_jsonl(path, "q", "answer")


# ------------------------------------------------------------------ requests a workload makes

def test_fixed_synthetic_prompts_are_unchanged(tok):
    """The prompts of a matrix from before drawn lengths and prefix groups are the same ids (hashes
    taken from the code before this change), so old and new runs compare."""
    got = [hashlib.sha256(json.dumps(timing_prompts(w, tok, 9, 48)).encode()).hexdigest()[:16]
           for w in (SyntheticWorkload(), SyntheticWorkload(seed=3, shared_prefix_len=20))]
    assert got == ["1f1c7076ae578792", "a5be4c86a620540d"]


def test_drawn_lengths_and_prefix_groups(tok):
    w = SyntheticWorkload.model_validate({
        "seed": 1, "shared_prefix_len": 12, "prefix_groups": 3,
        "input_lengths": {"kind": "lognormal", "mean": 120, "std": 80, "min": 16, "max": 400},
        "output_lengths": {"kind": "uniform", "min": 4, "max": 24}})
    req = timing_requests(w, tok, 60, 400, 24, "offline")
    assert [len(p) for p in req.prompts] == lengths.sample(w.input_lengths, 60, [1, 1])
    assert req.output_lens == lengths.sample(w.output_lengths, 60, [1, 2])
    prefixes = {tuple(p[:12]) for p in req.prompts}
    assert len(prefixes) == 3                         # three system prompts, each shared by many requests
    assert len({tuple(p[12:20]) for p in req.prompts}) == 60   # and the rest of each prompt is its own
    assert timing_requests(w, tok, 60, 400, 24, "serve").prompts == req.prompts   # the same in every mode
    assert any("3 prefix groups of 12 tokens" in n for n in req.notes)


def test_multi_turn_conversations_grow_and_follow(tok):
    w = ShareGptWorkload(path=SHAREGPT, multi_turn=True, think_time_s=0.5)
    served = timing_requests(w, tok, 16, 512, 64, "serve")
    assert sum(1 for f in served.follows if f) == 8 and served.think_time_s == 0.5
    for i, f in enumerate(served.follows):
        if f:   # the next turn's prompt is the previous turn's prompt, its reply and the new question
            prev = served.prompts[i - f]
            assert served.prompts[i][:len(prev)] == prev and len(served.prompts[i]) > len(prev) + served.output_lens[i - f] - 1
    # the reply lengths come from the file: "Eight." is the second conversation's... shortest reply
    assert min(served.output_lens) == len(tok.encode("Eight.")) and max(served.output_lens) <= 64
    offline = timing_requests(w, tok, 16, 512, 64, "offline")
    assert offline.follows is None and sorted(map(tuple, offline.prompts)) == sorted(map(tuple, served.prompts))
    # turn by turn offline: every first turn before any second turn
    firsts = {tuple(p) for p, f in zip(served.prompts, served.follows) if not f}
    assert {tuple(p) for p in offline.prompts[:8]} == firsts
    # a conversation stops at the first turn beyond input_len
    short = timing_requests(w, tok, 16, 60, 64, "serve")
    assert max(len(p) for p in short.prompts) <= 60 and "turns dropped beyond input_len 60" in short.notes[0]
    single = timing_requests(ShareGptWorkload(path=SHAREGPT), tok, 8, 512, 64, "serve")
    assert single.follows is None and len({tuple(p) for p in single.prompts}) == 8


# ------------------------------------------------------------------ validation

BASE = {"models": {"t": "builtin:tiny"}, "axes": {"framework": ["hf"], "model": ["t"]}}


def _problems(data) -> list[str]:
    with pytest.raises(MatrixError) as err:
        parse_matrix(data)
    return err.value.problems


def test_validate_catches_workload_mistakes(tmp_path):
    missing = str(tmp_path / "nope.json")
    assert _problems(BASE | {"workload": {"kind": "sharegpt", "path": missing}}) == [
        f"workload.path: {missing}: no such file (mark it cluster_only: true if it exists only where the run happens)"]
    parse_matrix(BASE | {"workload": {"kind": "sharegpt", "path": missing, "cluster_only": True}})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\nnot json\n')
    assert _problems(BASE | {"workload": {"kind": "jsonl", "path": str(bad)}})[0].startswith(
        f"workload.path: {bad}: line 2 is not valid JSON")
    drawn = {"kind": "synthetic", "input_lengths": {"kind": "lognormal", "mean": 100, "std": 50}}
    assert _problems(BASE | {"axes": BASE["axes"] | {"input_len": [32, 64]}, "workload": drawn}) == [
        "axes.input_len: the workload draws these lengths (workload.input_lengths); leave the axis out, or drop "
        "workload.input_lengths for a fixed sweep"]
    assert _problems(BASE | {"workload": {"prefix_groups": 4}}) == [
        "workload.prefix_groups: prefix groups need workload.shared_prefix_len > 0 (the tokens each group's "
        "requests share)"]
    assert "workload.input_lengths: Value error, a lognormal length distribution needs mean, std" in _problems(
        BASE | {"workload": {"input_lengths": {"kind": "lognormal"}}})
    assert _problems(BASE | {"axes": BASE["axes"] | {"mode": ["batch"]}})[0].startswith("axes.mode[0]: Input should be")


def test_one_length_engines_refuse_per_request_lengths():
    """transformers, TensorRT-LLM and LMDeploy take one output length per call here: a batch whose
    requests want different lengths is unsupported there, never padded to one length."""
    from adapters.base import Unsupported, one_length

    assert one_length(7, "x") == 7 and one_length([5, 5, 5], "x") == 5
    with pytest.raises(Unsupported, match="transformers generate .*: one output length per batch call; this "
                                          "workload asks for 3-9 tokens"):
        one_length([3, 9], "transformers generate (max_new_tokens)")


def test_stream_cells_and_unsupported_engines(tmp_path):
    from orchestrator.execution.engine_child.spec import GroupJob, unsupported_reason
    from orchestrator.matrix.cells import expand, group, load_label

    m = parse_matrix({"models": {"t": "builtin:tiny"},
                      "axes": {"framework": ["hf", "llamacpp", "vllm"], "model": ["t"], "mode": ["offline", "stream"],
                               "batch_size": [2, 4]},
                      "workload": {"input_lengths": {"kind": "uniform", "min": 8, "max": 40},
                                   "output_lengths": {"kind": "fixed", "value": 5}}})
    cells = expand(m)
    stream = [c for c in cells if c.mode == "stream"]
    assert len(stream) == 6 and all(c.request_rate is None and c.input_len == 24 and c.output_len == 5 for c in cells)
    # one engine per stream batch size: the scheduler's cap is set at load; offline batch sizes share one
    groups = group(cells)
    assert sorted((g.framework, g.mode, len(g.cells)) for g in groups) == sorted(
        [(fw, "offline", 2) for fw in ("hf", "llamacpp", "vllm")] + [(fw, "stream", 1) for fw in ("hf", "llamacpp", "vllm")] * 2)
    assert load_label("stream", 4, None) == "stream c<=4"
    reasons = {g.framework: unsupported_reason(GroupJob("r", g, m, "cpu", "python3", str(tmp_path)), "python3")
               for g in groups if g.mode == "stream"}
    assert "continuous-batching scheduler" in reasons["hf"] and "continuous-batching scheduler" in reasons["llamacpp"]
    assert reasons["hf"].startswith("hf has no stream mode: ") and reasons["vllm"] is None
