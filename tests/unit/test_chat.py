"""Chat workloads without a benchmark run or an engine: the built-in model's chat template in its tokenizer,
multi-turn messages, what validation says about a model without a template, the `unsupported` rows where
only the node can tell, and the request bodies. (llama-cpp-python rendering the GGUF's template:
engines/test_chat_gguf.py; what `bench validate` prints: e2e/test_chat_run.py.)"""

from __future__ import annotations

from dataclasses import replace

import pytest

from adapters.contract.openai_api import ServerApi, completion_body, completion_path, stream_count
from adapters.contract.tokenizer import chat_template
from orchestrator.execution.engine_child.prompts import Tokenizer, timing_requests
from orchestrator.inputs import tiny_model as tiny_build
from orchestrator.inputs.chat import ChatRenderer, NoChatTemplate
from orchestrator.matrix.models import ShareGptWorkload
from orchestrator.matrix.validate import parse_matrix
from tests.helpers import MSGS, SHAREGPT, chat_matrix, without_template


@pytest.fixture(scope="module")
def no_template(tiny_model, tmp_path_factory):
    return without_template(tiny_model, tmp_path_factory.mktemp("no-template") / "tiny-plain")


def test_builtin_model_has_a_chatml_style_template(tiny_model):
    assert chat_template(tiny_model) == tiny_build.CHAT_TEMPLATE
    r, tok = ChatRenderer(str(tiny_model)), Tokenizer(str(tiny_model))
    ids = r.ids(MSGS)
    assert tok.decode(ids) == ("<|im_start|>system\nYou are brief.</s>\n<|im_start|>user\nWhen do you open?</s>\n"
                               "<|im_start|>assistant\n")
    assert ids.count(tok.eos_id) == 2    # a turn ends with EOS, as a special token, not its text
    # the cache key moves with the template: a tiny model cached before it had one is rebuilt
    assert tiny_model.name.startswith(f"tiny-{tiny_build.fingerprint('llama')}-") and tiny_build.BUILD_VERSION == "tiny-2"


def test_multi_turn_messages_grow_by_the_reply_and_the_next_question(tiny_model):
    tok, chat = Tokenizer(str(tiny_model)), ChatRenderer(str(tiny_model))
    w = ShareGptWorkload(path=SHAREGPT, multi_turn=True, chat=True)
    req = timing_requests(w, tok, 20, 320, 16, "serve", chat)
    assert req.messages is not None and len(req.messages) == len(req.prompts) == 20
    for i, k in enumerate(req.follows):
        assert req.prompts[i] == chat.ids(req.messages[i])
        if k:   # the next turn: the previous turn's messages + its reply + the next user question
            prev, cur = req.messages[i - k], req.messages[i]
            assert cur[:len(prev)] == prev and [m["role"] for m in cur[len(prev):]] == ["assistant", "user"]
            assert req.prompts[i][:len(req.prompts[i - k])] == req.prompts[i - k]   # a prefix cache can reuse it
    assert any(n.startswith("chat: messages rendered with the model's chat template") and "later turns start with "
               "the previous turn's prompt ids" in n for n in req.notes)
    # offline: the same renderings, turn by turn; without chat, the old 'User: ...' text
    off = timing_requests(w, tok, 20, 320, 16, "offline", chat)
    assert all(p == chat.ids(m) for p, m in zip(off.prompts, off.messages)) and off.follows is None
    plain = timing_requests(ShareGptWorkload(path=SHAREGPT, multi_turn=True), tok, 20, 320, 16, "offline")
    assert plain.messages is None and "User: " in tok.decode(plain.prompts[0])
    with pytest.raises(ValueError, match="needs the model's chat template"):
        timing_requests(w, tok, 4, 320, 16, "offline")


def test_no_template_on_the_node_is_unsupported_rows(no_template, tmp_path):
    """Where only the node can tell (a hub model): every chat cell is `unsupported` with the reason, and no
    engine starts. Here a local model is let through validation by building the matrix without it."""
    from orchestrator.execution.engine_child.spec import GroupJob
    from orchestrator.execution.engine_child.supervisor import run_group
    from orchestrator.matrix.cells import expand, group
    from orchestrator.matrix.models import Matrix

    m = Matrix.model_validate(chat_matrix(str(no_template)))
    (g,) = group(expand(m))
    rows = run_group(GroupJob("r", g, m, "cpu", "python3", str(tmp_path)))
    assert [r.row["status"] for r in rows] == ["unsupported"]
    assert "has no chat template" in rows[0].row["reason"]
    with pytest.raises(NoChatTemplate):
        ChatRenderer(str(no_template))


def test_chat_bodies_and_the_chat_endpoint():
    api = ServerApi(prompt_ids=True, ids_in_logprobs=False, prompt_logprobs=None, ignore_eos=True, batches=True,
                    stream_usage=True, greedy_fields={"top_k": -1})
    body = completion_body(api, MSGS, 8, 0, True, "m")
    assert body["messages"] == MSGS and "prompt" not in body and completion_path(body) == "/v1/chat/completions"
    # usage on every chunk only where the server gives no token ids (stream_count)
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert "return_token_ids" not in body
    ids_api = replace(api, stream_token_ids=True)
    body = completion_body(ids_api, MSGS, 8, 0, True, "m")
    assert body["stream_options"] == {"include_usage": True} and body["return_token_ids"] is True
    assert stream_count(ids_api) == "token_ids" and stream_count(api) == "usage"
    assert stream_count(ids_api, logprobs=1) == "logprobs" and stream_count(replace(api, stream_usage=False)) == "text"
    body = completion_body(ids_api, [1, 2], 8, 0, True, "m", logprobs=1)   # logprobs asked anyway: nothing more
    assert body["stream_options"] == {"include_usage": True} and "return_token_ids" not in body
    assert "stream_options" not in completion_body(ids_api, [1, 2], 8, 0, False, "m")
    assert body["ignore_eos"] and body["top_k"] == -1 and body["max_tokens"] == 8
    assert completion_path(completion_body(api, [1, 2, 3], 8, 0, True, "m")) == "/v1/completions"
    with pytest.raises(ValueError, match="no logprobs"):
        completion_body(api, MSGS, 8, 0, False, "m", logprobs=2)


def test_chat_workload_keeps_old_cell_ids():
    from orchestrator.matrix.cells import expand

    base = {"models": {"t": "builtin:tiny"}, "axes": {"framework": ["hf"], "model": ["t"]},
            "workload": {"kind": "sharegpt", "path": SHAREGPT}}
    a = expand(parse_matrix(base))[0].cell_id
    b = expand(parse_matrix({**base, "workload": {**base["workload"], "chat": False}}))[0].cell_id
    c = expand(parse_matrix({**base, "workload": {**base["workload"], "chat": True}}))[0].cell_id
    assert a == b != c


def test_servers_not_driven_through_chat_are_unsupported(tmp_path):
    from orchestrator.execution.engine_child.spec import GroupJob, unsupported_reason
    from orchestrator.matrix.cells import expand, group

    m = parse_matrix({**chat_matrix("builtin:tiny"), "axes": {"framework": ["trtllm", "vllm", "llamacpp"],
                                                              "model": ["m"], "mode": ["serve"]}})
    reasons = {g.framework: unsupported_reason(GroupJob("r", g, m, "cpu", "python3", str(tmp_path)), "python3")
               for g in group(expand(m))}
    assert "not driven through /v1/chat/completions" in reasons["trtllm"]
    assert not any("chat" in (reasons[fw] or "") for fw in ("vllm", "llamacpp"))
