"""llama.cpp's converter, the parts that need no engine (adapters/engines/llamacpp/gguf_convert.py): the config names
added to a temporary copy for the converter, the checkpoint properties refused in preflight, and a failed
conversion's one-line reason (the exception's own last line and the stage, not an earlier banner)."""

from __future__ import annotations

import json

import pytest

from adapters.base import Unsupported
from adapters.engines.llamacpp import gguf_convert as gc

# the converter's output on glm4 under transformers 5 (shortened): a pre-tokenizer banner, then the real failure
GLM4_LOG = """INFO:hf-to-gguf:Loading model: arch-glm4
INFO:hf-to-gguf:Set model parameters
INFO:hf-to-gguf:Set model tokenizer
WARNING:hf-to-gguf:**************************************************************************************
WARNING:hf-to-gguf:** WARNING: The BPE pre-tokenizer was not recognized!
WARNING:hf-to-gguf:**************************************************************************************
Traceback (most recent call last):
  File "convert_hf_to_gguf.py", line 10, in <module>
    raise NotImplementedError("BPE pre-tokenizer was not recognized - update get_vocab_base_pre()")
NotImplementedError: BPE pre-tokenizer was not recognized - update get_vocab_base_pre()

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "conversion/glm.py", line 99, in set_vocab
    special_vocab._set_special_token("eos", tokenizer.get_added_vocab()["<|endoftext|>"])
KeyError: '<|endoftext|>'
"""


def test_reason_is_the_last_error_and_its_stage():
    assert gc.failure_reason(GLM4_LOG) == "KeyError: '<|endoftext|>' (stage: Set model tokenizer)"
    err = gc._failure(GLM4_LOG, "Glm4ForCausalLM", gc.Path("/m/arch-glm4"), 1)
    assert isinstance(err, RuntimeError) and "KeyError: '<|endoftext|>'" in str(err)   # not the banner
    assert "BPE pre-tokenizer" not in str(err)


def test_reason_without_traceback_is_the_last_line():
    assert gc.failure_reason("INFO:hf-to-gguf:Loading model: x\nKilled") == "Killed (stage: Loading model: x)"


def test_renamed_fields_go_to_a_temporary_copy(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    cfg = {"architectures": ["GPT2LMHeadModel"], "n_positions": 256, "n_embd": 128}
    (model / "config.json").write_text(json.dumps(cfg))
    (model / "model.safetensors").write_bytes(b"weights")
    staging = tmp_path / "staging"
    staging.mkdir()
    copy = gc._checkpoint_for_converter(model, cfg, "GPT2LMHeadModel", staging)
    assert copy.name == model.name and copy != model     # the same folder name: the converter's general.name
    assert json.loads((copy / "config.json").read_text())["n_ctx"] == 256
    assert (copy / "model.safetensors").resolve() == (model / "model.safetensors").resolve()
    assert json.loads((model / "config.json").read_text()) == cfg                     # the checkpoint is untouched
    # nothing to add: the checkpoint itself
    assert gc._checkpoint_for_converter(model, {**cfg, "n_ctx": 256}, "GPT2LMHeadModel", staging) == model


@pytest.mark.parametrize(("arch", "cfg", "added"), [
    ("FalconForCausalLM", {"multi_query": True, "new_decoder_architecture": False, "num_kv_heads": 8}, {"num_kv_heads": 1}),
    ("FalconForCausalLM", {"multi_query": True, "new_decoder_architecture": True, "num_kv_heads": 8}, {}),
    ("FalconForCausalLM", {"multi_query": False, "num_kv_heads": 8}, {}),
    ("LlamaForCausalLM", {"n_positions": 256}, {}),
])
def test_config_additions(arch, cfg, added):
    assert gc.config_additions(arch, cfg) == added


def test_preflight_refuses_what_the_converter_cannot_write(tmp_path):
    with pytest.raises(Unsupported, match="n_inner is 256"):
        gc.preflight(tmp_path, {"n_embd": 128, "n_inner": 256}, "GPT2LMHeadModel")
    with pytest.raises(Unsupported, match="intermediate_size is 256"):
        gc.preflight(tmp_path, {"hidden_size": 128, "intermediate_size": 256}, "PhiForCausalLM")
    gc.preflight(tmp_path, {"n_embd": 128, "n_inner": 512}, "GPT2LMHeadModel")
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0}}, "added_tokens": []}))
    with pytest.raises(Unsupported, match="<|endoftext|>"):
        gc.preflight(tmp_path, {}, "Glm4ForCausalLM")
    (tmp_path / "tokenizer.json").write_text(json.dumps(
        {"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": 1, "content": "<|endoftext|>"}]}))
    gc.preflight(tmp_path, {}, "Glm4ForCausalLM")


def test_preflight_names_what_llamacpp_hardcodes(tmp_path):
    """qwen3moe renormalises the top-k expert weights always; smollm3's NoPE step is 4 with no GGUF key: a
    checkpoint that differs is Unsupported with the field named, one as real checkpoints ship it passes."""
    with pytest.raises(Unsupported, match="norm_topk_prob is false"):
        gc.preflight(tmp_path, {}, "Qwen3MoeForCausalLM")
    gc.preflight(tmp_path, {"norm_topk_prob": True}, "Qwen3MoeForCausalLM")
    with pytest.raises(Unsupported, match=r"no_rope_layers is \[1, 0\]"):
        gc.preflight(tmp_path, {"no_rope_layers": [1, 0]}, "SmolLM3ForCausalLM")
    gc.preflight(tmp_path, {"no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0]}, "SmolLM3ForCausalLM")
    gc.preflight(tmp_path, {"no_rope_layers": [1, 1]}, "SmolLM3ForCausalLM")


def test_preflight_refuses_a_phi_with_qk_layernorm(tmp_path):
    """llama.cpp's converter (0.3.36) on a tiny phi saved with qk_layernorm=True, run here without this preflight:
    `ValueError: Can not map tensor 'model.layers.0.self_attn.k_layernorm.bias'`. Unsupported before converting."""
    with pytest.raises(Unsupported, match="qk_layernorm is true"):
        gc.preflight(tmp_path, {"qk_layernorm": True, "intermediate_size": 4, "hidden_size": 1}, "PhiForCausalLM")
    gc.preflight(tmp_path, {"qk_layernorm": False, "intermediate_size": 4, "hidden_size": 1}, "PhiForCausalLM")


def test_converter_environment_says_when_it_is_not_its_own(monkeypatch, tmp_path):
    monkeypatch.delenv(gc.PYTHON_ENV, raising=False)
    monkeypatch.setattr(gc, "__file__", str(tmp_path / "a" / "b" / "c" / "gguf_convert.py"))
    python, reason = gc.converter_python()
    assert reason and "make env-convert" in reason
    monkeypatch.setenv(gc.PYTHON_ENV, "/some/python")
    assert gc.converter_python() == ("/some/python", None)
