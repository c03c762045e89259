"""`kind: hf` workloads: a Hugging Face `datasets` dataset read with load_dataset, here a local directory
shipped under tests/data/ (no network: HF_DATASETS_OFFLINE=1), as prompts (field, output_field) or as
conversations (messages_field, multi-turn, chat), and what validation checks. (What `bench validate` says
it cannot check, and one real `bench run` of an hf cell over it: e2e/test_hf_datasets_run.py.)"""

from __future__ import annotations

import json

import pytest

from orchestrator.execution.engine_child.prompts import Tokenizer, timing_requests
from orchestrator.inputs.chat import ChatRenderer
from orchestrator.matrix.models import HfWorkload, MatrixError
from orchestrator.matrix.validate import parse_matrix
from tests.helpers import HF_DATA, HF_OFFLINE, hf_matrix


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    for k, v in HF_OFFLINE.items():
        monkeypatch.setenv(k, v)


def test_prompts_and_reference_lengths(tiny_model):
    tok = Tokenizer(str(tiny_model))
    req = timing_requests(HfWorkload(name=HF_DATA, field="prompt", output_field="reference"), tok, 8, 64, 12, "offline")
    rows = [json.loads(line) for line in open(f"{HF_DATA}/train.jsonl")]
    assert req.prompts[0] == tok.encode(rows[0]["prompt"]) and req.prompts[6] == req.prompts[0]   # cycled
    assert req.output_lens[0] == min(12, len(tok.encode(rows[0]["reference"])))
    # one data file by path reads the same
    same = timing_requests(HfWorkload(name=f"{HF_DATA}/train.jsonl", field="prompt"), tok, 8, 64, 12, "offline")
    assert same.prompts == req.prompts and same.output_lens is None


def test_conversations_with_chat(tiny_model):
    tok, chat = Tokenizer(str(tiny_model)), ChatRenderer(str(tiny_model))
    w = HfWorkload(name=HF_DATA, messages_field="messages", multi_turn=True, chat=True)
    req = timing_requests(w, tok, 9, 320, 16, "serve", chat)
    assert sum(1 for k in req.follows if k) == 3 and all(p == chat.ids(m) for p, m in zip(req.prompts, req.messages))
    assert req.notes[0].startswith("hf: 6 conversations, 9 requests (multi-turn)")


@pytest.mark.parametrize("workload, problem", [
    ({"field": "prompt", "messages_field": "messages"}, "workload: give exactly one of field"),
    ({}, "workload: give exactly one of field"),
    ({"field": "nope"}, "workload.name: " + HF_DATA + " (train): record 0 has no field 'nope'"),
    ({"messages_field": "prompt"}, "record 0 field 'prompt' has no 'conversations' (ShareGPT) or 'messages'"),
    ({"field": "prompt", "chat": True}, "workload.chat: chat needs conversations: set workload.messages_field"),
    ({"messages_field": "messages", "output_field": "reference"}, "workload.output_field: reference outputs go with field"),
    ({"field": "prompt", "split": "test"}, "workload.name: " + HF_DATA + ": "),
])
def test_validate_loads_local_datasets(workload, problem):
    with pytest.raises(MatrixError) as err:
        parse_matrix(hf_matrix(**workload))
    assert problem in str(err.value)
