"""The built-in model's chat template in its GGUF: llama-cpp-python loads the file (an engine, in process)
and renders the messages to the same ids as the model's tokenizer does."""

from __future__ import annotations

from orchestrator.inputs import tiny_model as tiny_build
from orchestrator.inputs.chat import ChatRenderer
from tests.helpers import MSGS


def test_gguf_carries_the_template_and_llama_cpp_renders_the_same_ids(tiny_model, cache_dir):
    import llama_cpp
    from llama_cpp import llama_chat_format

    from adapters.engines.llamacpp.gguf_convert import gguf_for

    path, _ = gguf_for(str(tiny_model), "fp32", cache_dir)
    llm = llama_cpp.Llama(str(path), n_ctx=256, verbose=False)
    try:
        assert llm.metadata["tokenizer.chat_template"] == tiny_build.CHAT_TEMPLATE
        assert llm.chat_format == "chat_template.default"   # no chat_format given: the GGUF's own template
        # what its chat handler does: render with the GGUF's template, tokenize with specials, no BOS
        fmt = llama_chat_format.Jinja2ChatFormatter(template=tiny_build.CHAT_TEMPLATE, eos_token="</s>", bos_token="<s>")
        res = fmt(messages=MSGS)
        ids = llm.tokenize(res.prompt.encode(), add_bos=not res.added_special, special=True)
    finally:
        llm.close()
    assert ids == ChatRenderer(str(tiny_model)).ids(MSGS)
