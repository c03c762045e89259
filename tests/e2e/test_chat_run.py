"""A chat workload through real engines on the tiny model: the shipped multi-turn ShareGPT file rendered by
the model's chat template, offline through transformers and llama.cpp (the same ids; the template is
rendered on the driver, so vLLM's offline cells take the same path), and served through
vLLM's and llama-cpp-python's /v1/chat/completions, whose own renderings of the messages are checked
against the run's template ids; and what `bench validate` (a child process) says about a model without a
template."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from orchestrator.execution.engine_child.prompts import Tokenizer, timing_requests
from orchestrator.execution.engine_child.supervisor import PROJECT_ROOT
from orchestrator.inputs.chat import ChatRenderer
from orchestrator.matrix.models import MatrixError, ShareGptWorkload
from orchestrator.matrix.validate import parse_matrix
from tests.helpers import (CHAT_BATCH, CHAT_IN_CAP, CHAT_OUT_CAP, CHAT_WARMUP, MSGS, ROOT, SERVE_REPEATS,
                           SERVE_REQUESTS, SHAREGPT, bench_cmd, chat_matrix, without_template)

HAS_VLLM = (PROJECT_ROOT / ".venvs" / "vllm" / "bin" / "python").exists()
WARMUP, REPEATS, SERVED, BATCH, IN_CAP, OUT_CAP = (CHAT_WARMUP, SERVE_REPEATS, SERVE_REQUESTS, CHAT_BATCH, CHAT_IN_CAP,
                                                   CHAT_OUT_CAP)


@pytest.fixture(scope="module")
def chat_run(served_run):
    """The chat workload of the session's served run (tests/helpers.py served_matrix, shared with e2e/test_serve.py:
    its cells share that run's vLLM and llama.cpp servers): served by vLLM and llama.cpp, offline through llama.cpp
    at batch 2 and transformers at batch 1 (vLLM offline would add an engine group for the path llama.cpp's
    batch-2 cell covers)."""
    cells = served_run.cells
    return cells[cells.workload == "chat"].set_index(["framework", "mode"])


def _timed(tiny_model, mode: str, batch: int, per_run: int):
    """The template ids of a cell's timed requests (after the warm-up ones)."""
    req = timing_requests(ShareGptWorkload(path=SHAREGPT, multi_turn=True, think_time_s=0.02, chat=True),
                          Tokenizer(str(tiny_model)), WARMUP * batch + REPEATS * per_run, IN_CAP, OUT_CAP, mode,
                          ChatRenderer(str(tiny_model)))
    return req.prompts[WARMUP * batch:], req.output_lens[WARMUP * batch:]


def test_offline_cells_run_the_templates_ids(chat_run, tiny_model):
    hf = chat_run.loc[("hf", "offline")]
    assert hf.status == "ok", hf.reason
    prompts, outs = _timed(tiny_model, "offline", 1, 1)
    assert hf.prompt_tokens == sum(map(len, prompts)) and hf.output_tokens == sum(outs)
    assert "chat: messages rendered with the model's chat template" in hf.notes
    v = chat_run.loc[("llamacpp", "offline")]
    assert v.status == "ok", v.reason
    prompts, outs = _timed(tiny_model, "offline", BATCH, BATCH)
    assert v.prompt_tokens == sum(map(len, prompts)) and v.output_tokens == sum(outs)


@pytest.mark.parametrize("framework", ["vllm", "llamacpp"])
def test_served_chat_matches_the_templates_ids(chat_run, tiny_model, framework):
    if framework == "vllm" and not HAS_VLLM:
        pytest.skip("no .venvs/vllm")
    row = chat_run.loc[(framework, "serve")]
    assert row.status == "ok", row.reason
    assert row.errors == 0 and row.requests == REPEATS * SERVED, row.errors_by_kind
    prompts, outs = _timed(tiny_model, "serve", BATCH, SERVED)
    # the server's prompt counts (vLLM: its /tokenize of the messages, and its stream's usage; llama.cpp: a
    # one-token chat request's usage) equal our template's ids: the same conversations went through both
    assert row.prompt_tokens == sum(map(len, prompts))
    assert "MISMATCH" not in row.notes
    assert "chat: the server's chat template" in row.notes and "gives the run's prompt token count" in row.notes
    if framework == "vllm":   # its /tokenize of the messages: the very ids
        assert re.search(r"; (\d+) of \1 are the same ids", row.notes) and row.output_tokens == sum(outs)
    else:   # llama.cpp's server cannot ignore EOS, and the template ends a turn with EOS
        assert 0 < row.output_tokens <= sum(outs)
    assert row.ttft_ms_p50 > 0 and "multi-turn" in row.notes


def test_a_server_rendering_otherwise_is_a_stated_mismatch(tiny_model, tmp_path):
    """llama-cpp-python on a GGUF without a chat template falls back to its own "llama-2" format: the served
    cell's check says MISMATCH (never hides it), and the server's counts become the prompt lengths."""
    from adapters.contract.specs import ServeSpec
    from adapters.engines.llamacpp.gguf_convert import gguf_for
    from adapters.worker.served_cells import Target, _chat_lengths
    from tests.helpers import API, start_llamacpp

    plain = without_template(tiny_model, tmp_path / "tiny-plain")
    path, _ = gguf_for(str(plain), "fp32", str(tmp_path / "cache"))
    chats = [MSGS, MSGS + [{"role": "assistant", "content": "At seven."}, {"role": "user", "content": "Sunday?"}]]
    ids = [ChatRenderer(str(tiny_model)).ids(m) for m in chats]
    notes: list[str] = []
    srv = start_llamacpp(str(path), tmp_path / "llama.log")
    try:
        target = Target(srv.url, API, "tiny", None, None, ServeSpec(requests=1, time_limit_s=30, arrival="constant",
                                                                      request_timeout_s=60))
        lengths = _chat_lengths(target, chats + chats[:1], ids + ids[:1], notes)
    finally:
        srv.stop()
    assert notes[0].startswith("chat: MISMATCH: the server's chat template (the usage of a 1-token "
                               "/v1/chat/completions) rendered 2 of 2 distinct chats"), notes
    assert lengths[0] == lengths[2] and lengths[0] != len(ids[0]) and lengths[1] != len(ids[1])


# ------------------------------------------------------------------ `bench validate` on a model without a template

@pytest.fixture(scope="module")
def no_template(tiny_model, tmp_path_factory):
    return without_template(tiny_model, tmp_path_factory.mktemp("no-template") / "tiny-plain")


def test_validate_rejects_chat_on_a_local_model_without_a_template(no_template, tiny_model, tmp_path):
    with pytest.raises(MatrixError) as err:
        parse_matrix(chat_matrix(str(no_template)))
    assert "workload.chat: model 'm' has no chat template (models.m.source: " in str(err.value)
    assert "drop chat" in str(err.value) and "models.m.tokenizer" in str(err.value)
    parse_matrix(chat_matrix("builtin:tiny"))                                   # the built-in ones have one
    parse_matrix({**chat_matrix(str(no_template)), "models": {"m": {"source": str(no_template),
                                                                     "tokenizer": str(tiny_model)}}})
    parse_matrix({**chat_matrix(str(no_template)), "workload": {"kind": "sharegpt", "path": SHAREGPT}})   # no chat
    # through the CLI: exit 2, the YAML path; a hub model is said to be checked on the node
    (tmp_path / "m.yaml").write_text(json.dumps(chat_matrix(str(no_template))))
    out = subprocess.run(bench_cmd("validate", str(tmp_path / "m.yaml")), capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "workload.chat: model 'm' has no chat template" in out.stderr
    (tmp_path / "h.yaml").write_text(json.dumps(chat_matrix("someorg/some-model")))
    out = subprocess.run(bench_cmd("validate", str(tmp_path / "h.yaml")), capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "its chat template is checked on the node" in " ".join((out.stdout + out.stderr).split())
