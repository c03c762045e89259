"""The llama.cpp adapter's model files and errors, with no engine loaded: the HF->GGUF conversion is
cached by content, an unknown architecture is `unsupported` (in the converter and through the adapter,
before llama.cpp loads anything), and without llama-cpp-python the check names the install command.
(The adapter with its engine: engines/test_llamacpp.py.)"""

from __future__ import annotations

import json
import sys

import pytest

from adapters.base import Unsupported
from adapters.contract.specs import LoadSpec, ModelSpec
from tests.helpers import needs_llama


def test_unknown_architecture_is_unsupported(tmp_path):
    from adapters.engines.gguf_convert import converted_gguf

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(Unsupported, match=r"does not support architecture GPT2LMHeadModel \(supported: .*LlamaForCausalLM"):
        converted_gguf(tmp_path, "f32", tmp_path / "cache")


@needs_llama
def test_unknown_architecture_through_the_adapter(tmp_path):
    from adapters.engines.llamacpp import LlamacppAdapter

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["FalconForCausalLM"]}))
    spec = LoadSpec(framework="llamacpp", model=ModelSpec(name="m", source=str(tmp_path)), quantization="fp32", device="cpu", cache_dir=str(tmp_path / "c"))
    with pytest.raises(Unsupported, match="FalconForCausalLM"):
        LlamacppAdapter().load(spec)


@needs_llama
def test_conversion_is_cached_by_content(tiny_model, tmp_path):
    import shutil

    from adapters.engines.gguf_convert import converted_gguf

    first, hit1 = converted_gguf(tiny_model, "f16", tmp_path)
    again, hit2 = converted_gguf(tiny_model, "f16", tmp_path)
    assert (hit1, hit2) == (False, True) and first == again
    assert not list(first.parent.glob("*.part"))  # atomic writes leave no temporaries
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model, copy)
    cfg = json.loads((copy / "config.json").read_text())
    cfg["rms_norm_eps"] = 1e-6
    (copy / "config.json").write_text(json.dumps(cfg))
    changed, hit3 = converted_gguf(copy, "f16", tmp_path)
    assert not hit3 and changed != first


def test_check_names_the_install_command_without_llama_cpp(monkeypatch, tmp_path):
    from adapters.engines.llamacpp import LlamacppAdapter

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp -> ImportError
    spec = LoadSpec(framework="llamacpp", model=ModelSpec(name="m", source=str(tmp_path)), quantization="fp32", device="cpu")
    reason = LlamacppAdapter().check(spec)
    assert reason and "pip install" in reason and "llamacpp" in reason

