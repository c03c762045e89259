"""The built-in tiny model's cache without building one: concurrent resolvers build once (the build
replaced by a fake), unknown names are refused, other sources pass through, the fingerprint follows
the architecture and the build version, and a build's name carries a digest of its bytes. (Real builds,
one of them on another instruction set: engines/test_tiny_model.py.)"""

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



def _fake_builder(payload: bytes):
    def fake_build(out_dir, arch="llama"):
        (Path(out_dir) / "model.safetensors").write_bytes(payload)
        (Path(out_dir) / "config.json").write_text("{}")
        return Path(out_dir)
    return fake_build


def test_the_name_carries_a_digest_of_the_bytes(tmp_path, monkeypatch):
    """Two builds of one recipe (two hosts, two caches): the same bytes give the same name, other bytes
    another name; the name is <name>-<recipe fingerprint>-<digest of the files written>."""
    names = {}
    for host, payload in (("a", b"weights"), ("b", b"weights"), ("c", b"weights, another CPU's")):
        monkeypatch.setattr(tiny_model, "build_tiny_model", _fake_builder(payload))
        names[host] = tiny_model.resolve_builtin("tiny", tmp_path / host)
    recipe = f"tiny-{tiny_model.fingerprint('llama')}-"
    assert all(p.name.startswith(recipe) and p.name.removeprefix(recipe) == tiny_model.content_digest(p)
               for p in names.values())
    assert names["a"].name == names["b"].name != names["c"].name


def test_a_build_in_the_cache_is_found_by_its_recipe(tmp_path, monkeypatch):
    """A finished build (another host's, in a shared cache) is used as it is, under its own name; a folder of
    the old naming (the recipe alone) or an unfinished one is not taken for one."""
    models = tmp_path / "models"
    recipe = f"tiny-{tiny_model.fingerprint('llama')}"
    (models / recipe).mkdir(parents=True)                       # the old naming: no content digest
    (models / recipe / "model.safetensors").write_bytes(b"old")
    (models / f"{recipe}-0123456789ab").mkdir()                  # no weights: not a finished build
    monkeypatch.setattr(tiny_model, "build_tiny_model", _fake_builder(b"new"))
    built = tiny_model.resolve_builtin("tiny", tmp_path)
    assert built.name == f"{recipe}-{tiny_model.content_digest(built)}" and (built / "model.safetensors").read_bytes() == b"new"

    def no_build(*args, **kwargs):
        raise AssertionError("built again")

    monkeypatch.setattr(tiny_model, "build_tiny_model", no_build)
    assert tiny_model.resolve_builtin("tiny", tmp_path) == built
