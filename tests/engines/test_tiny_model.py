"""The built-in tiny model: deterministic on one machine, named by its bytes across machines, loadable by HF
loaders, actually trained, cached. Each build trains it with torch here (tens of seconds), so this module builds
once (through an empty cache) and holds that build to the session's, and once more in a child on torch's
portable kernels (ATEN_CPU_CAPABILITY=default), as another CPU would; the cache's bookkeeping without a build:
unit/test_tiny_model_cache.py."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from orchestrator.inputs import tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def cache_root(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _built(cache_root, name: str):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOSSLESS_BENCH_CACHE", str(cache_root))
        start = time.monotonic()
        path = tiny_model.resolve_builtin(name)
        print(f"\nbuild {name}: {time.monotonic() - start:.1f}s")
    return path


@pytest.fixture(scope="module")
def tiny(cache_root):
    """builtin:tiny built once through the cache, for all tests of this module."""
    return _built(cache_root, "tiny")


@pytest.fixture(scope="module")
def tiny_qwen2(cache_dir):
    """The session's (tests/engines/test_llamacpp.py builds it there first): its build is not this module's to time."""
    return tiny_model.resolve_builtin("tiny-qwen2", cache_dir)


def test_build_is_deterministic(tiny, tiny_model_of_the_session):
    """Two builds, bytes equal: this module's, through an empty cache, and the session's (built by another test,
    or an earlier session under the same cache key)."""
    assert tiny != tiny_model_of_the_session
    for name in ("model.safetensors", "tokenizer.json", "config.json", "generation_config.json"):
        assert (tiny_model_of_the_session / name).read_bytes() == (tiny / name).read_bytes(), name


@pytest.fixture
def tiny_model_of_the_session(tiny_model):
    return tiny_model


def test_checkpoint_files_and_config(tiny):
    cfg = json.loads((tiny / "config.json").read_text())
    assert cfg["model_type"] == "llama"
    assert cfg["dtype"] == cfg["torch_dtype"] == "float32"
    assert (cfg["vocab_size"], cfg["hidden_size"], cfg["head_dim"]) == (512, 128, 64)
    assert cfg["tie_word_embeddings"] is False
    assert cfg["rope_theta"] == 10000.0  # top level too, for transformers 4 and GGUF converters
    gen = json.loads((tiny / "generation_config.json").read_text())
    assert gen["eos_token_id"] == cfg["eos_token_id"]
    tok_cfg = json.loads((tiny / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"  # a name transformers 4 knows
    assert tok_cfg["chat_template"] == tiny_model.CHAT_TEMPLATE   # chat workloads (tests/unit/test_chat.py)
    assert all(f.stat().st_mode & 0o044 == 0o044 for f in tiny.iterdir())  # readable by all


def test_loads_with_hf_and_tokenizers(tiny):
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny)
    assert model.dtype == torch.float32
    raw = Tokenizer.from_file(str(tiny / "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(tiny)

    assert (hf.bos_token, hf.eos_token, hf.pad_token) == ("<s>", "</s>", "<pad>")
    assert hf.bos_token_id == model.config.bos_token_id == raw.token_to_id("<s>")
    assert hf.eos_token_id == model.config.eos_token_id == raw.token_to_id("</s>")
    assert len(hf) == raw.get_vocab_size() == 512

    # Plain encoding: both loaders agree and neither inserts BOS.
    text = "The river ran fast and clear past the old mill."
    ids = raw.encode(text).ids
    assert hf(text)["input_ids"] == ids
    assert ids[0] != hf.bos_token_id
    assert hf.decode(ids) == raw.decode(ids) == text

    # BPE with merges: what the GGUF converter writes as llama.cpp's "gpt2" tokenizer.
    spec = json.loads((tiny / "tokenizer.json").read_text())
    assert spec["model"]["type"] == "BPE" and len(spec["model"]["merges"]) > 100
    assert spec["post_processor"] is None


def test_eval_perplexity_far_below_uniform(tiny):
    ppl = tiny_model.perplexity(tiny)
    print(f"\ntiny eval perplexity: {ppl:.2f} (uniform would be 512)")
    assert ppl < 100


def test_generates_english_like_text(tiny):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny)
    tok = AutoTokenizer.from_pretrained(tiny)
    ids = tok("The garden", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=20, do_sample=False)
    text = tok.decode(out[0], skip_special_tokens=True)
    print(f"\ngreedy: {text!r}")
    assert text.startswith("The garden") and " the " in text


def test_resolve_builtin_caches(tiny, cache_root, monkeypatch):
    monkeypatch.setenv("LOSSLESS_BENCH_CACHE", str(cache_root))
    assert tiny.parent == cache_root / "models"
    assert tiny.name == f"tiny-{tiny_model.fingerprint('llama')}-{tiny_model.content_digest(tiny)}"
    mtime = (tiny / "model.safetensors").stat().st_mtime_ns

    def no_rebuild(*args, **kwargs):
        raise AssertionError("rebuilt a cached model")

    monkeypatch.setattr(tiny_model, "build_tiny_model", no_rebuild)
    assert tiny_model.resolve_builtin("tiny") == tiny
    assert tiny_model.resolve_builtin("tiny", cache_root=cache_root) == tiny
    assert tiny_model.resolve_model_source("builtin:tiny") == str(tiny)
    assert (tiny / "model.safetensors").stat().st_mtime_ns == mtime
    # No temp build dirs left behind, only the finished model and its lock file.
    leftovers = [p.name for p in (cache_root / "models").iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_qwen2_variant(tiny_qwen2):
    from transformers import AutoModelForCausalLM

    assert tiny_qwen2.name.startswith("tiny-qwen2-")
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2)
    assert model.config.model_type == "qwen2"
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.k_proj.bias is not None and attn.v_proj.bias is not None
    assert model.config.tie_word_embeddings is True
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ppl = tiny_model.perplexity(tiny_qwen2)
    print(f"\ntiny-qwen2 eval perplexity: {ppl:.2f}")
    assert ppl < 100


def test_another_instruction_set_gives_the_same_bytes_or_another_name(tiny, tmp_path):
    """The recipe built in a child on torch's portable kernels (ATEN_CPU_CAPABILITY=default: no AVX), as a CPU
    without this one's vector units would: equal bytes under one name, or other bytes under another name,
    never other bytes under one name. Either way each name's digest is of its own folder's files."""
    import torch

    from tests.helpers import ROOT

    here = torch.backends.cpu.get_cpu_capability()
    child = ("import sys, torch; from orchestrator.inputs.tiny_model import resolve_builtin; "
             "print(torch.backends.cpu.get_cpu_capability()); print(resolve_builtin('tiny', sys.argv[1]))")
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", child, str(tmp_path)], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    capability, other = out.stdout.split()[-2], Path(out.stdout.split()[-1])
    assert capability == "DEFAULT"
    same_bytes = all((tiny / f.name).read_bytes() == f.read_bytes() for f in other.iterdir()) and \
        sorted(p.name for p in tiny.iterdir()) == sorted(p.name for p in other.iterdir())
    print(f"\nbuilt on {here}: {tiny.name}; on DEFAULT: {other.name}; bytes equal: {same_bytes}")
    assert (other.name == tiny.name) == same_bytes
    assert other.name.endswith(tiny_model.content_digest(other)) and tiny.name.endswith(tiny_model.content_digest(tiny))
