"""`kind: hf` workloads through `bench` as a child process, over the local dataset under tests/data/ (no
network: HF_DATASETS_OFFLINE=1): what `bench validate` says it cannot check (a hub dataset is fetched on
the node), and one real `bench run` of an hf cell. (Reading the dataset and validation in process:
unit/test_hf_datasets.py.)"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from orchestrator.execution.engine_child.prompts import Tokenizer, timing_requests
from orchestrator.inputs.chat import ChatRenderer
from orchestrator.matrix.models import HfWorkload
from orchestrator.matrix.validate import parse_matrix
from tests.helpers import HF_DATA, HF_OFFLINE, ROOT, bench_cmd, hf_matrix


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    for k, v in HF_OFFLINE.items():
        monkeypatch.setenv(k, v)


def test_validate_says_a_hub_dataset_is_fetched_on_the_node(tmp_path):
    parse_matrix(hf_matrix(field="prompt"))
    (tmp_path / "m.yaml").write_text(json.dumps(hf_matrix(field="text") | {
        "workload": {"kind": "hf", "name": "someorg/some-dataset", "config": "en", "field": "text"}}))
    out = subprocess.run(bench_cmd("validate", str(tmp_path / "m.yaml")), capture_output=True, text=True, cwd=ROOT,
                         env=os.environ | HF_OFFLINE)
    assert out.returncode == 0, out.stderr
    said = " ".join(out.stdout.split())
    assert "not checked here: workload.name: 'someorg/some-dataset' is not a local path: a hub dataset" in said


def test_bench_run_of_an_hf_cell(tiny_model, tmp_path):
    """A real `bench run` (transformers, batch 1: one output length per call) over the local dataset's
    conversations, multi-turn, rendered with the model's chat template."""
    m = hf_matrix(messages_field="messages", multi_turn=True, chat=True) | {
        "name": "hf-dataset", "measure": {"warmup": 1, "repeats": 2, "scoring_prompts": 1, "scoring_len": 16,
                                          "greedy_tokens": 2, "score_repeats": 1, "top_k": 2},
        "run": {"cell_timeout_s": 300, "load_timeout_s": 300}}
    m["axes"] |= {"batch_size": [1], "input_len": [256], "output_len": [8]}
    (tmp_path / "m.yaml").write_text(json.dumps(m))
    out = subprocess.run(bench_cmd("run", str(tmp_path / "m.yaml"), "--run-dir", str(tmp_path / "run")),
                         capture_output=True, text=True, cwd=ROOT, env=os.environ | HF_OFFLINE, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    from orchestrator.store.run_store import RunStore

    row = RunStore(tmp_path / "run").read_cells().iloc[0]
    assert row.status == "ok", row.reason
    req = timing_requests(HfWorkload(name=HF_DATA, messages_field="messages", multi_turn=True, chat=True),
                          Tokenizer(str(tiny_model)), 3, 256, 8, "offline", ChatRenderer(str(tiny_model)))
    assert row.prompt_tokens == sum(map(len, req.prompts[1:])) and row.output_tokens == sum(req.output_lens[1:])
    assert "hf: 6 conversations" in row.notes and "chat: messages rendered" in row.notes
