"""What the scheduler estimates before a group runs: model sizes (local files, config.json in the Hugging
Face cache, offline), per-framework priors, and durations measured by earlier runs under a results root."""

import json

import pytest

from orchestrator.execution.scheduling import model_size
from orchestrator.execution.scheduling.estimate import GroupFacts, History, estimate_groups, prior
from orchestrator.store.run_store import RunStore

LLAMA_8B = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 14336,
            "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
            "tie_word_embeddings": False, "hidden_act": "silu", "torch_dtype": "bfloat16"}


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """A Hugging Face cache with one hub model's config.json (no weights), as `hf download` leaves it."""
    root = tmp_path / "hub"
    repo = root / "models--meta-llama--Llama-3.1-8B"
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text(json.dumps(LLAMA_8B))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")   # nothing here may reach the network
    model_size.weight_bytes.cache_clear()
    yield root
    model_size.weight_bytes.cache_clear()


@pytest.mark.parametrize("cfg,billions", [
    (LLAMA_8B, 8.03),
    ({**LLAMA_8B, "hidden_size": 8192, "num_hidden_layers": 80, "intermediate_size": 28672,
      "num_attention_heads": 64}, 70.6),                                            # Llama-3.1-70B
    ({**LLAMA_8B, "hidden_size": 2048, "num_hidden_layers": 16, "intermediate_size": 8192,
      "tie_word_embeddings": True}, 1.24),                                          # Llama-3.2-1B
    ({**LLAMA_8B, "model_type": "qwen2", "hidden_size": 5120, "num_hidden_layers": 48, "intermediate_size": 13824,
      "num_attention_heads": 40, "vocab_size": 152064}, 14.8),                      # Qwen2.5-14B
    ({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
      "activation_function": "gelu_new"}, 0.124),                                  # GPT-2
    ({**LLAMA_8B, "model_type": "mixtral", "vocab_size": 32000, "num_local_experts": 8}, 46.7),   # Mixtral-8x7B
    ({"text_config": LLAMA_8B}, 8.03),                                              # a multimodal wrapper
])
def test_parameter_count_from_config(cfg, billions):
    assert model_size.params_from_config(cfg) / 1e9 == pytest.approx(billions, rel=0.01)


def test_hub_id_is_sized_from_its_cached_config_offline(hf_cache):
    params = model_size.params_from_config(LLAMA_8B)
    assert model_size.weight_bytes("meta-llama/Llama-3.1-8B", "bf16") == (int(params * 2), "config")
    assert model_size.weight_bytes("meta-llama/Llama-3.1-8B", "q4_k_m") == (int(params * 0.6), "config")
    # a quantization the table does not name: the config's dtype
    assert model_size.weight_bytes("meta-llama/Llama-3.1-8B", None)[0] == int(params * 2)
    # a revision that is not cached falls back to main's snapshot
    assert model_size.weight_bytes("meta-llama/Llama-3.1-8B", "fp8", "v2")[1] == "config"
    # not cached, hub not asked (offline): unknown, as before
    assert model_size.weight_bytes("org/not-cached", "bf16") == (model_size.UNKNOWN_BYTES, "unknown")


def test_local_models_are_sized_from_files_or_config(tmp_path, hf_cache):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"\0" * 12345)
    assert model_size.weight_bytes(str(gguf), "q4_0") == (12345, "gguf file")
    weights = tmp_path / "weights-only"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"\0" * 1000)
    (weights / "notes.txt").write_text("not weights")
    assert model_size.weight_bytes(str(weights), "fp32") == (1000, "weight files")
    with_config = tmp_path / "with-config"
    with_config.mkdir()
    (with_config / "config.json").write_text(json.dumps(LLAMA_8B))
    (with_config / "model.safetensors").write_bytes(b"\0" * 10)
    assert model_size.weight_bytes(str(with_config), "fp16")[1] == "config"   # the cell's precision, not the file's
    assert model_size.weight_bytes("builtin:tiny")[1] == "builtin"


def test_priors_know_tensor_parallel_size_and_each_frameworks_load_cost():
    def facts(fw, gpus=1, gb=16, n=4, **kw):
        return GroupFacts(fw, "k", tuple(f"c{i}" for i in range(n)), int(gb * 1e9), gpus, **kw)

    one, two = prior(facts("vllm")), prior(facts("vllm", gpus=2))
    assert two.load_s == pytest.approx(45 + 1.5 * 8) and one.load_s == pytest.approx(45 + 1.5 * 16)
    assert two.cell_s[0] == pytest.approx(6 + 0.8 * 8) and len(two.cell_s) == 4
    assert prior(facts("trtllm")).load_s - prior(facts("hf")).load_s == pytest.approx(110)  # engine build
    assert prior(facts("hf")).cell_s[0] == pytest.approx(2.5 * prior(facts("vllm")).cell_s[0])
    # llama.cpp converts an HF checkpoint to GGUF first; a .gguf file it runs as it is
    assert prior(facts("llamacpp")).load_s - prior(facts("llamacpp", gguf_source=True)).load_s == pytest.approx(32)
    # an unknown size: 16 GB on each of its GPUs
    unknown = prior(GroupFacts("vllm", "k", ("c",), None, 4))
    assert unknown.load_s == pytest.approx(45 + 1.5 * 16)
    assert prior(facts("hf", device="cpu")).cell_s[0] > 10 * prior(facts("hf")).cell_s[0]


def _run(root, name, rows):
    store = RunStore(root / name)
    for cid, key, fw, status, load, dur in rows:
        store.write_cell({"run_id": name, "cell_id": cid, "engine_key": key, "framework": fw, "status": status,
                          "load_s": load, "duration_s": dur})
    store.write_manifest({"matrix": {"name": name}, "sessions": [{"started": f"2025-01-0{name[-1]}T00:00:00"}]})


def test_measured_durations_from_a_results_root_replace_and_calibrate_the_priors(tmp_path):
    _run(tmp_path, "run1", [("a0", "A", "vllm", "ok", 10.0, 100.0), ("a1", "A", "vllm", "ok", 10.0, 200.0),
                            ("b0", "B", "hf", "failed", 5.0, 999.0)])
    _run(tmp_path, "run2", [("a0", "A", "vllm", "ok", 30.0, 300.0), ("a1", "A", "vllm", "ok", 30.0, 200.0)])
    h = History.read(tmp_path)
    assert h.runs == 2
    assert h.load_s == {"A": 20.0}                     # one load per group and run, median over runs
    assert h.cell_s == {"a0": 200.0, "a1": 200.0}      # medians; the failed cell says nothing
    gb = int(16e9)
    measured = GroupFacts("vllm", "A", ("a0", "a1"), gb)
    partly = GroupFacts("vllm", "A", ("a0", "a1", "new"), gb)       # the matrix grew a cell
    same_fw = GroupFacts("vllm", "C", ("c0",), gb)                   # never measured
    other_fw = GroupFacts("hf", "B", ("b0",), gb)
    e = estimate_groups([measured, partly, same_fw, other_fw], h)
    assert (e[0].load_s, e[0].cell_s, e[0].basis) == (20.0, [200.0, 200.0], "measured")
    assert (e[1].cell_s, e[1].basis) == ([200.0, 200.0, 200.0], "partly measured")
    # vllm measured/prior: (20 + 400) / (p.load + 2 p.cell); C (vllm) and B (hf, none measured) scaled by it
    p = prior(same_fw)
    k = 420.0 / (p.load_s + 2 * p.cell_s[0])
    assert e[2].basis == "calibrated prior" and e[2].seconds == pytest.approx(k * p.seconds)
    assert e[3].seconds == pytest.approx(k * prior(other_fw).seconds)
    assert estimate_groups([same_fw], None)[0].basis == "prior"
    assert History.read(tmp_path / "run2").runs == 1   # one run dir is a root too
    # how far off each may be: what was measured within 10%, the rest (and calibrated priors) as priors
    assert (e[0].load_sigma, e[0].cell_sigma) == (0.1, [0.1, 0.1])
    assert (e[1].load_sigma, e[1].cell_sigma) == (0.1, [0.1, 0.1, 0.6])
    assert (e[2].load_sigma, e[2].cell_sigma) == (0.3, [0.6]) == (p.load_sigma, p.cell_sigma)


def test_hub_metadata_sizes_an_uncached_model_where_the_hub_answers(hf_cache, monkeypatch):
    """No network here: the hub's answers are stand-ins; what is checked is how they are used."""
    import huggingface_hub
    from huggingface_hub import errors

    class Meta:
        parameter_count = {"BF16": 7_000_000_000, "F32": 1_000_000}

    asked = []

    def metadata(repo_id, revision=None):
        asked.append(repo_id)
        if repo_id == "org/gated":
            raise errors.HFValidationError("the hub answered: no")
        if repo_id == "org/down":
            raise ConnectionError("unreachable")
        return Meta()

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub, "get_safetensors_metadata", metadata)
    monkeypatch.setattr(model_size, "_hub_failed", False)
    assert model_size.weight_bytes("org/open", "fp8") == (7_001_000_000, "hub metadata")
    assert model_size.weight_bytes("org/gated", "bf16")[1] == "unknown"     # this model only
    assert model_size.weight_bytes("org/other", "bf16")[1] == "hub metadata"
    assert model_size.weight_bytes("org/down", "bf16")[1] == "unknown"      # unreachable: stop asking
    assert model_size.weight_bytes("org/later", "bf16")[1] == "unknown"
    assert asked == ["org/open", "org/gated", "org/other", "org/down"]
    assert model_size.weight_bytes("meta-llama/Llama-3.1-8B", "bf16")[1] == "config"   # the cache first
