"""The preflight (orchestrator/execution/preflight.py): each model resolved once before any engine starts, the
pairs an engine cannot run known from the model's config (adapters' `model_problem`), a hub id that cannot be
had one message, with no retries. Real matrices, real adapters' classes, the built-in model; no Ray, no engine."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from adapters.contract.specs import ModelFacts
from orchestrator.execution.preflight import preflight, resolve_model
from orchestrator.execution.engine_child.spec import GroupJob
from orchestrator.matrix.cells import expand, group
from orchestrator.matrix.models import ModelEntry
from orchestrator.matrix.validate import load_matrix
from tests.helpers import needs_llama

NO_SUCH_HUB_ID = "lossless-bench-tests/no-such-model-3f9c"


def checkpoint(path, **config):
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 128,
                                                  "num_attention_heads": 2, **config}))
    return path


def jobs_of(tmp_path, cache_dir, models: dict, frameworks: list[str], quantization=("fp32",)) -> list[GroupJob]:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"name": "pf", "models": models,
                                    "axes": {"framework": frameworks, "model": list(models),
                                             "quantization": list(quantization), "input_len": [8], "output_len": [2]}}))
    m, _ = load_matrix(path)
    return [GroupJob(run_id="r", group=g, matrix=m, device="cpu", python="python", cache_dir=str(cache_dir))
            for g in group(expand(m))]


def test_a_hub_id_that_cannot_be_had_is_one_quick_answer(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))   # an empty cache: nothing to fall back on
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    t0 = time.monotonic()
    facts, why = resolve_model(ModelEntry(source=NO_SUCH_HUB_ID), str(tmp_path))
    took = time.monotonic() - t0
    # offline (this machine) the hub does not answer; online it says the repo does not exist: either way, once
    assert facts is None and why and NO_SUCH_HUB_ID in why and ("cannot be reached" in why or "not found" in why)
    assert took < 15, f"one request, no retry loop (took {took:.1f} s)"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    facts, why = resolve_model(ModelEntry(source=NO_SUCH_HUB_ID), str(tmp_path))
    assert facts is None and "HF_HUB_OFFLINE is set" in why


def test_a_cached_hub_model_resolves_from_the_cache_offline(monkeypatch, tmp_path):
    snapshots = tmp_path / "hub" / "models--org--small" / "snapshots"
    snapshots.mkdir(parents=True)
    checkpoint(snapshots / "abc", head_dim=32)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    facts, why = resolve_model(ModelEntry(source="org/small"), str(tmp_path))
    assert why is None and facts.kind == "hub" and facts.architecture == "LlamaForCausalLM" and facts.head_dim == 32


def test_vllm_on_a_cpu_runs_only_the_head_sizes_its_attention_has():
    from adapters.engines.vllm.adapter import VllmAdapter

    def facts(hd):
        return ModelFacts(source="m", kind="dir", config={}, architecture="LlamaForCausalLM", head_dim=hd)

    reason = VllmAdapter.model_problem(facts(16), "fp32", {}, "cpu")
    assert reason and "head_dim is 16" in reason and "32, 64, 80" in reason
    assert VllmAdapter.model_problem(facts(64), "fp32", {}, "cpu") is None
    assert VllmAdapter.model_problem(facts(16), "fp16", {}, "cuda") is None   # a GPU's kernels are another list


@needs_llama
def test_llamacpp_pairs_it_cannot_run(tmp_path):
    from adapters.engines.llamacpp.adapter import LlamacppAdapter

    def facts(kind, arch="LlamaForCausalLM"):
        return ModelFacts(source=str(tmp_path), kind=kind, config={"architectures": [arch]}, architecture=arch)

    assert LlamacppAdapter.model_problem(facts("dir"), "q4_0", {}, "cpu") is None
    assert "does not support architecture NoSuchForCausalLM" in LlamacppAdapter.model_problem(
        facts("dir", "NoSuchForCausalLM"), "fp32", {}, "cpu")
    assert "hub id" in LlamacppAdapter.model_problem(facts("hub"), "fp32", {}, "cpu")
    assert "a given .gguf file" in LlamacppAdapter.model_problem(facts("dir"), "gguf", {}, "cpu")


@needs_llama
def test_preflight_writes_what_cannot_run_once_and_schedules_the_rest(monkeypatch, tmp_path, cache_dir):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    small_heads = checkpoint(tmp_path / "heads16", hidden_size=32, num_attention_heads=2)    # head_dim 16
    odd = checkpoint(tmp_path / "odd", architectures=["NoSuchForCausalLM"])
    jobs = jobs_of(tmp_path, cache_dir, {"tiny": "builtin:tiny", "hub": NO_SUCH_HUB_ID, "h16": str(small_heads),
                                         "odd": str(odd)}, ["hf", "vllm", "llamacpp"])
    out = preflight(jobs)
    run = {(j.group.framework, j.group.model) for j in out.runnable}
    gone = {(j.group.framework, j.group.model): (status, reason) for j, status, reason in out.excluded}
    assert run == {("hf", "tiny"), ("vllm", "tiny"), ("llamacpp", "tiny"), ("hf", "h16"), ("llamacpp", "h16"),
                   ("hf", "odd"), ("vllm", "odd")}
    assert {k for k, (s, _) in gone.items() if s == "failed"} == {("hf", "hub"), ("vllm", "hub"), ("llamacpp", "hub")}
    assert gone[("vllm", "h16")][0] == "unsupported" and "head_dim is 16" in gone[("vllm", "h16")][1]
    assert gone[("llamacpp", "odd")][0] == "unsupported" and "NoSuchForCausalLM" in gone[("llamacpp", "odd")][1]
    msgs = out.messages()
    assert sum(NO_SUCH_HUB_ID in line for line in msgs) == 1   # the hub id's problem said once, not per cell
    assert msgs[0].startswith("model hub: hub id") and "cells fail without starting an engine" in msgs[0]


@pytest.mark.parametrize("source", ["/nowhere/on/this/machine", "./relative/missing"])
def test_a_path_this_machine_lacks_is_left_to_the_nodes(source, tmp_path):
    facts, why = resolve_model(ModelEntry(source=source), str(tmp_path))
    assert why is None and facts.kind == "elsewhere"
