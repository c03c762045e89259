"""`kind: hf` workloads: a Hugging Face `datasets` dataset read with load_dataset, here a local directory
shipped under tests/data/ (no network: HF_DATASETS_OFFLINE=1), as prompts (field, output_field) or as
conversations (messages_field, multi-turn, chat); what `bench validate` checks and what it says it cannot;
and one real `bench run` of an hf cell over it."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from orchestrator.execution.prompts import Tokenizer, timing_requests
from orchestrator.inputs.chat import ChatRenderer
from orchestrator.matrix.models import HfWorkload, MatrixError
from orchestrator.matrix.validate import parse_matrix
from tests.conftest import ROOT, bench_cmd

DATA = str(ROOT / "tests" / "data" / "hf_dataset")
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    for k, v in OFFLINE.items():
        monkeypatch.setenv(k, v)


def _matrix(**workload) -> dict:
    return {"models": {"tiny": "builtin:tiny"}, "axes": {"framework": ["hf"], "model": ["tiny"]},
            "workload": {"kind": "hf", "name": DATA, **workload}}


def test_prompts_and_reference_lengths(tiny_model):
    tok = Tokenizer(str(tiny_model))
    req = timing_requests(HfWorkload(name=DATA, field="prompt", output_field="reference"), tok, 8, 64, 12, "offline")
    rows = [json.loads(line) for line in open(f"{DATA}/train.jsonl")]
    assert req.prompts[0] == tok.encode(rows[0]["prompt"]) and req.prompts[6] == req.prompts[0]   # cycled
    assert req.output_lens[0] == min(12, len(tok.encode(rows[0]["reference"])))
    # one data file by path reads the same
    same = timing_requests(HfWorkload(name=f"{DATA}/train.jsonl", field="prompt"), tok, 8, 64, 12, "offline")
    assert same.prompts == req.prompts and same.output_lens is None


def test_conversations_with_chat(tiny_model):
    tok, chat = Tokenizer(str(tiny_model)), ChatRenderer(str(tiny_model))
    w = HfWorkload(name=DATA, messages_field="messages", multi_turn=True, chat=True)
    req = timing_requests(w, tok, 9, 320, 16, "serve", chat)
    assert sum(1 for k in req.follows if k) == 3 and all(p == chat.ids(m) for p, m in zip(req.prompts, req.messages))
    assert req.notes[0].startswith("hf: 6 conversations, 9 requests (multi-turn)")


@pytest.mark.parametrize("workload, problem", [
    ({"field": "prompt", "messages_field": "messages"}, "workload: give exactly one of field"),
    ({}, "workload: give exactly one of field"),
    ({"field": "nope"}, "workload.name: " + DATA + " (train): record 0 has no field 'nope'"),
    ({"messages_field": "prompt"}, "record 0 field 'prompt' has no 'conversations' (ShareGPT) or 'messages'"),
    ({"field": "prompt", "chat": True}, "workload.chat: chat needs conversations: set workload.messages_field"),
    ({"messages_field": "messages", "output_field": "reference"}, "workload.output_field: reference outputs go with field"),
    ({"field": "prompt", "split": "test"}, "workload.name: " + DATA + ": "),
])
def test_validate_loads_local_datasets(workload, problem):
    with pytest.raises(MatrixError) as err:
        parse_matrix(_matrix(**workload))
    assert problem in str(err.value)


def test_validate_says_a_hub_dataset_is_fetched_on_the_node(tmp_path):
    parse_matrix(_matrix(field="prompt"))
    (tmp_path / "m.yaml").write_text(json.dumps(_matrix(field="text") | {
        "workload": {"kind": "hf", "name": "someorg/some-dataset", "config": "en", "field": "text"}}))
    out = subprocess.run(bench_cmd("validate", str(tmp_path / "m.yaml")), capture_output=True, text=True, cwd=ROOT,
                         env=os.environ | OFFLINE)
    assert out.returncode == 0, out.stderr
    said = " ".join(out.stdout.split())
    assert "not checked here: workload.name: 'someorg/some-dataset' is not a local path: a hub dataset" in said


def test_bench_run_of_an_hf_cell(tiny_model, tmp_path):
    """A real `bench run` (transformers, batch 1: one output length per call) over the local dataset's
    conversations, multi-turn, rendered with the model's chat template."""
    m = _matrix(messages_field="messages", multi_turn=True, chat=True) | {
        "name": "hf-dataset", "measure": {"warmup": 1, "repeats": 2, "scoring_prompts": 1, "scoring_len": 16,
                                          "greedy_tokens": 2, "score_repeats": 1, "top_k": 2},
        "run": {"cell_timeout_s": 300, "load_timeout_s": 300}}
    m["axes"] |= {"batch_size": [1], "input_len": [256], "output_len": [8]}
    (tmp_path / "m.yaml").write_text(json.dumps(m))
    out = subprocess.run(bench_cmd("run", str(tmp_path / "m.yaml"), "--run-dir", str(tmp_path / "run")),
                         capture_output=True, text=True, cwd=ROOT, env=os.environ | OFFLINE, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    from orchestrator.store.run_store import RunStore

    row = RunStore(tmp_path / "run").read_cells().iloc[0]
    assert row.status == "ok", row.reason
    req = timing_requests(HfWorkload(name=DATA, messages_field="messages", multi_turn=True, chat=True),
                          Tokenizer(str(tiny_model)), 3, 256, 8, "offline", ChatRenderer(str(tiny_model)))
    assert row.prompt_tokens == sum(map(len, req.prompts[1:])) and row.output_tokens == sum(req.output_lens[1:])
    assert "hf: 6 conversations" in row.notes and "chat: messages rendered" in row.notes
