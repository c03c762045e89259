"""Ground truth for the layer report (issue 43, item 1): a copy of the built-in model with the weights of one
block k perturbed (transformers), or with only block k's tensors quantized (llama.cpp); the per-layer hidden
states against the unperturbed model must leave the floor (the baseline run twice, and against another engine)
at block k, with every block before k within."""

import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from adapters import ADAPTERS
from adapters.contract.specs import LoadSpec, ModelSpec
from orchestrator.explain.layers import floor, layer_report, relative_errors


def _loaded(framework, folder):
    adapter = ADAPTERS[framework]()
    adapter.load(LoadSpec(framework=framework, model=ModelSpec(name="tiny", source=str(folder)),
                          quantization="fp32", device="cpu"))
    return adapter


@pytest.mark.parametrize("k", [0, 1])
def test_layers_names_the_perturbed_block(k, tiny_model, tmp_path):
    copy = tmp_path / "perturbed"
    shutil.copytree(tiny_model, copy)
    (weights,) = copy.glob("*.safetensors")
    w = load_file(weights)
    name = f"model.layers.{k}.mlp.down_proj.weight"
    w[name] = w[name] * np.float32(1.05)
    save_file(w, weights, metadata={"format": "pt"})
    rng = np.random.default_rng(2)
    prompts = [list(map(int, rng.integers(3, 500, n))) for n in (16, 9)]
    base, ref = _loaded("hf", tiny_model), _loaded("numpy", tiny_model)
    runs = [base.hidden_states(prompts), base.hidden_states(prompts), ref.hidden_states(prompts)]
    cell = _loaded("hf", copy).hidden_states(prompts)
    report = layer_report(relative_errors(cell, runs[0]), floor(runs))
    assert report["first_beyond"] == k, report
    assert not report["embeddings_beyond"]
    assert all(not r["beyond_floor"] for r in report["layers"][: k + 1]), report
    assert report["grows_most"] == k
    assert report["line"].startswith(f"leaves the noise floor at layer {k}")


def _captured(source, prompts, cache_dir, framework="llamacpp", split=False):
    """One engine's capture of `prompts` (a GGUF runs as it is; llama.cpp with an f32 KV cache, no flash attention)."""
    adapter = ADAPTERS[framework]()
    adapter.load(LoadSpec(framework=framework, model=ModelSpec(name="tiny", source=str(source)),
                          quantization="gguf" if str(source).endswith(".gguf") else "fp32", device="cpu",
                          options={"type_k": "f32", "type_v": "f32", "flash_attn": "off"} if framework == "llamacpp"
                          else {}, cache_dir=str(cache_dir)))
    try:
        return adapter.residual_states(prompts) if split else adapter.hidden_states(prompts)
    finally:
        adapter.close()


@pytest.mark.parametrize(("k", "qtype"), [(0, "q8_0"), (1, "q4_0")])
def test_layers_names_the_block_quantized_alone(k, qtype, tiny_model, cache_dir, tmp_path):
    """llama.cpp: an F32 GGUF of the built-in model with only block k's tensors quantized (llama.cpp's own
    quantizer, per-tensor type overrides `tt_overrides`), captured through the eval callback against the F32
    GGUF (run twice, and against transformers): block k is the first beyond the floor, the blocks before it
    within, and the mixed file really holds quantized tensors in block k only."""
    import gguf

    from adapters.engines.llamacpp.gguf_convert import converted_gguf, quantize_gguf

    pytest.importorskip("llama_cpp")
    f32, _ = converted_gguf(tiny_model, "f32", cache_dir)
    mixed = quantize_gguf(f32, tmp_path / f"blk{k}-{qtype}.gguf", qtype,
                          overrides={rf"^(?!blk\.{k}\.)": "f32"})   # everything but block k back to f32
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(mixed)).tensors}
    assert {n for n, t in types.items() if t != "F32"} == {n for n in types if n.startswith(f"blk.{k}.")
                                                            and not n.endswith("norm.weight")}, types
    rng = np.random.default_rng(3)
    prompts = [list(map(int, rng.integers(3, 500, n))) for n in (16, 9)]
    base = _captured(f32, prompts, cache_dir)
    runs = [base, _captured(f32, prompts, cache_dir), _captured(tiny_model, prompts, cache_dir, "hf")]
    report = layer_report(relative_errors(_captured(mixed, prompts, cache_dir), base), floor(runs))
    assert report["first_beyond"] == k, report
    assert not report["embeddings_beyond"]
    assert all(not r["beyond_floor"] for r in report["layers"][: k + 1]), report
    assert all(r["beyond_floor"] for r in report["layers"][k + 1:]), report


@pytest.mark.parametrize(("k", "group", "part"), [(1, "attn_", "attention"), (0, "ffn_", "FFN")])
def test_split_blocks_name_the_quantized_half(k, group, part, tiny_model, cache_dir, tmp_path):
    """llama.cpp, each block split at its attention (Adapter.residual_states): only block k's attention (or only its
    FFN) quantized to q4_0; the first capture beyond the floor is that half of block k, every capture before it
    within (the baseline: the F32 GGUF twice, and transformers split the same way)."""
    from adapters.engines.llamacpp.gguf_convert import converted_gguf, quantize_gguf

    pytest.importorskip("llama_cpp")
    f32, _ = converted_gguf(tiny_model, "f32", cache_dir)
    mixed = quantize_gguf(f32, tmp_path / f"blk{k}-{group}q4_0.gguf", "q4_0",
                          overrides={rf"^(?!blk\.{k}\.{group})": "f32"})
    rng = np.random.default_rng(4)
    prompts = [list(map(int, rng.integers(3, 500, n))) for n in (16, 9)]

    base = _captured(f32, prompts, cache_dir, split=True)
    runs = [base, _captured(f32, prompts, cache_dir, split=True), _captured(tiny_model, prompts, cache_dir, "hf", True)]
    report = layer_report(relative_errors(_captured(mixed, prompts, cache_dir, split=True), base), floor(runs), split=True)
    assert (report["first_beyond"], report["first_part"]) == (k, part), report
    first = next(i for i, r in enumerate(report["layers"]) if r["beyond_floor"])
    assert report["layers"][first]["name"] == f"block {k} {part}"
    assert report["line"].startswith(f"leaves the noise floor at layer {k} ({part})")


def test_the_engine_side_splits_where_it_can_and_says_why_not(tiny_model):
    """adapters/worker/layer_capture.py: transformers splits its blocks; the numpy reference engine has whole blocks
    only (the capture falls back, `split` False); vLLM's adapter has neither and the capture carries its reason."""
    from adapters.contract.specs import HiddenSpec
    from adapters.worker.layer_capture import capture

    spec = HiddenSpec(prompts=[[5, 9, 11, 40], [7, 3]], repeats=2)
    hf = capture(_loaded("hf", tiny_model), spec)
    assert bool(hf["split"]) and hf["r1_p0"].shape == (5, 4, 128) and hf["r0_p1"].shape == (5, 2, 128)
    ref = capture(_loaded("numpy", tiny_model), spec)
    assert not bool(ref["split"]) and ref["r1_p0"].shape == (3, 4, 128)
    np.testing.assert_allclose(ref["r0_p0"], hf["r0_p0"][0::2], atol=1e-5)
    vllm = capture(ADAPTERS["vllm"](), spec)
    assert set(vllm) == {"unsupported"} and "vLLM's offline LLM API" in str(vllm["unsupported"])
