"""The llama.cpp adapter's model files and errors, with no engine loaded: the HF->GGUF conversion is
llama.cpp's own converter of the installed version, an architecture it lacks is
`unsupported` (in the converter and through the adapter, before llama.cpp loads anything), a pre-tokenizer
is chosen by tokenizer.json's structure only where llama.cpp implements it exactly, and without
llama-cpp-python the check names the install command.
(The adapter with its engine: engines/test_llamacpp.py; the conversion itself, its cache and other
architectures: engines/test_gguf_converter.py.)"""

from __future__ import annotations

import json
import sys

import pytest

from adapters.base import Unsupported
from adapters.contract.specs import LoadSpec, ModelSpec
from tests.helpers import needs_llama


@needs_llama
def test_unknown_architecture_is_unsupported(tmp_path):
    from adapters.engines.llamacpp.gguf_convert import converted_gguf

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["NoSuchModelForCausalLM"]}))
    with pytest.raises(Unsupported, match=r"converter \(llama-cpp-python 0\.3\.\d+\) does not support architecture "
                                          r"NoSuchModelForCausalLM \(\d{3} text architectures known"):
        converted_gguf(tmp_path, "f32", tmp_path / "cache")
    assert not (tmp_path / "cache").exists()   # refused before anything was hashed or written


@needs_llama
def test_the_converter_is_llama_cpps_own_for_the_installed_version():
    import llama_cpp

    from adapters.engines.llamacpp.gguf_convert import converter_architectures, converter_dir, converter_identity

    src = converter_dir()
    assert src.name == llama_cpp.__version__ and (src / "conversion" / "base.py").is_file()
    archs = converter_architectures(src)
    assert len(archs) > 100 and {"LlamaForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM",
                                 "Olmo2ForCausalLM", "GPTNeoXForCausalLM", "StableLmForCausalLM"} <= archs
    ident = converter_identity(src)
    assert ident["converter_version"].startswith(llama_cpp.__version__ + "+") and ident["converter_gguf_py"] != "unknown"


def test_pre_tokenizer_chosen_by_structure_only_where_llama_cpp_has_it_exactly(tmp_path):
    from adapters.engines.llamacpp.gguf_convert import pre_tokenizer_by_structure

    def pre(p):
        (tmp_path / "tokenizer.json").write_text(json.dumps({"pre_tokenizer": p}))
        return pre_tokenizer_by_structure(tmp_path)

    assert pre({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}) == "gpt-2"
    assert pre({"type": "ByteLevel", "add_prefix_space": True, "use_regex": True}) is None    # a leading space
    assert pre({"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}) is None  # no GPT-2 split
    assert pre({"type": "Metaspace", "replacement": "\u2581"}) is None
    assert pre(None) is None


@needs_llama
def test_unknown_architecture_through_the_adapter(tmp_path):
    from adapters.engines.llamacpp.adapter import LlamacppAdapter

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["NoSuchModelForCausalLM"]}))
    spec = LoadSpec(framework="llamacpp", model=ModelSpec(name="m", source=str(tmp_path)), quantization="fp32", device="cpu", cache_dir=str(tmp_path / "c"))
    with pytest.raises(Unsupported, match="NoSuchModelForCausalLM"):
        LlamacppAdapter().load(spec)


def test_check_names_the_install_command_without_llama_cpp(monkeypatch, tmp_path):
    from adapters.engines.llamacpp.adapter import LlamacppAdapter

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp -> ImportError
    spec = LoadSpec(framework="llamacpp", model=ModelSpec(name="m", source=str(tmp_path)), quantization="fp32", device="cpu")
    reason = LlamacppAdapter().check(spec)
    assert reason and "pip install" in reason and "llamacpp" in reason

