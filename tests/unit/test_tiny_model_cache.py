"""The built-in tiny model's cache without building one: concurrent resolvers build once (the build
replaced by a fake), unknown names are refused, other sources pass through, and the fingerprint follows
the architecture and the build version. (Real builds: engines/test_tiny_model.py.)"""

import time
from pathlib import Path

import pytest

from orchestrator.inputs import tiny_model


def test_concurrent_resolvers_build_once(tmp_path, monkeypatch):
    import threading

    calls = []

    def fake_build(out_dir, arch="llama"):
        calls.append(arch)
        time.sleep(0.5)  # long enough for the other thread to reach the lock
        (Path(out_dir) / "model.safetensors").write_bytes(b"fake")
        return Path(out_dir)

    monkeypatch.setattr(tiny_model, "build_tiny_model", fake_build)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(tiny_model.resolve_builtin("tiny", tmp_path)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == ["llama"]
    assert len(results) == 2 and results[0] == results[1]
    assert (results[0] / "model.safetensors").read_bytes() == b"fake"


def test_unknown_builtin_raises(tmp_path):
    with pytest.raises(ValueError, match="tiny-qwen2"):
        tiny_model.resolve_builtin("huge", cache_root=tmp_path)
    with pytest.raises(ValueError, match="known"):
        tiny_model.resolve_model_source("builtin:nope", cache_root=tmp_path)
    assert not (tmp_path / "models").exists()


def test_resolve_model_source_passes_other_sources_through():
    for source in ("/models/llama", "meta-llama/Llama-3.2-1B", "model.gguf", "builtinx"):
        assert tiny_model.resolve_model_source(source) == source


def test_fingerprint_depends_on_arch_and_version(monkeypatch):
    llama = tiny_model.fingerprint("llama")
    assert llama != tiny_model.fingerprint("qwen2")
    monkeypatch.setattr(tiny_model, "BUILD_VERSION", "other")
    assert tiny_model.fingerprint("llama") != llama

