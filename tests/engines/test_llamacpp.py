"""The llama.cpp adapter: our HF->GGUF conversion, the quantization ladder, and honest batching, with the
engine loaded (the conversion's cache and the errors before a load: unit/test_llamacpp_files.py).

Everything runs on the built-in tiny models (conftest's session cache); conversions are cached in the
same session cache, so each GGUF is written once per session. The reference is transformers itself
(forward pass + log-softmax, and an argmax loop for greedy), computed here.
"""

from __future__ import annotations

import importlib.util
import json
import re
import signal
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from adapters.base import Unsupported, log_softmax
from adapters.contract.specs import LoadSpec, ModelSpec
from tests.helpers import ROOT, needs_llama

needs_hf = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="the transformers reference needs torch and transformers (pip install -e '.[hf]')")

# f32 KV cache and no flash attention: llama.cpp's defaults (f16 KV cache; flash attention, whose CPU
# kernel works in f16) move logprobs by ~3e-3 on their own, which is not what the conversion tests check.
EXACT = {"type_k": "f32", "type_v": "f32", "flash_attn": "off"}
N_PROMPTS, PROMPT_LEN, GREEDY = 4, 48, 8


@pytest.fixture(scope="module")
def tiny_qwen2(cache_dir) -> Path:
    from orchestrator.inputs.tiny_model import resolve_builtin

    return resolve_builtin("tiny-qwen2", cache_dir)


@lru_cache(maxsize=None)
def _prompts(model_dir: str) -> tuple[tuple[int, ...], ...]:
    from tokenizers import Tokenizer

    from orchestrator.inputs.tiny_model import eval_text

    ids = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json")).encode(eval_text()).ids
    return tuple(tuple(ids[i * PROMPT_LEN:(i + 1) * PROMPT_LEN]) for i in range(N_PROMPTS))


def prompts_of(model_dir) -> list[list[int]]:
    return [list(p) for p in _prompts(str(model_dir))]


@lru_cache(maxsize=None)
def _hf_reference(model_dir: str):
    """transformers: teacher-forced logprobs [n-1, vocab] per prompt, and GREEDY argmax tokens after it."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    scores, greedy = [], []
    with torch.no_grad():
        for p in prompts_of(model_dir):
            scores.append(log_softmax(model(torch.tensor([p])).logits[0, :-1].numpy()))
            ids = list(p)
            for _ in range(GREEDY):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
            greedy.append(ids[len(p):])
    return scores, greedy


def load(model_dir, quant="fp32", cache_dir=None, **options):
    from adapters.engines.llamacpp.adapter import LlamacppAdapter

    adapter = LlamacppAdapter()
    spec = LoadSpec(framework="llamacpp", model=ModelSpec(name="m", source=str(model_dir)), quantization=quant,
                    options=options, device="cpu", cache_dir=str(cache_dir or ""))
    assert adapter.check(spec) is None
    info = adapter.load(spec)
    return adapter, info


def compare(adapter, model_dir) -> dict:
    """max |logprob diff| of the actual tokens, mean KL(ref || engine) over full rows, greedy match."""
    prompts = prompts_of(model_dir)
    ref, ref_greedy = _hf_reference(str(model_dir))
    scored = adapter.score(prompts, top_k=adapter_vocab(adapter))  # top-k = whole vocab: full rows
    maxabs, kls = 0.0, []
    for s, r, p in zip(scored, ref, prompts):
        assert len(s) == len(p) - 1 and (s.token_ids == np.asarray(p[1:])).all()
        maxabs = max(maxabs, float(np.abs(s.logprobs - r[np.arange(len(p) - 1), p[1:]]).max()))
        full = np.full_like(r, -np.inf)
        np.put_along_axis(full, s.topk_ids.astype(np.int64), s.topk_logprobs, axis=1)
        kls.append(float((np.exp(r.astype(np.float64)) * (r - full)).sum(axis=1).mean()))
    greedy = adapter.greedy(prompts, GREEDY, top_k=5)
    match = np.mean([g.token_ids.tolist() == rg for g, rg in zip(greedy, ref_greedy)])
    return {"maxabs": maxabs, "kl": float(np.mean(kls)), "greedy": float(match), "greedy_scores": greedy}


def adapter_vocab(adapter) -> int:
    return int(adapter._n_vocab)


# ----------------------------------------------------------------------------------------------
# conversion fidelity

@needs_llama
@needs_hf
def test_f32_gguf_matches_transformers(tiny_model, cache_dir):
    adapter, info = load(tiny_model, "fp32", cache_dir, **EXACT)
    try:
        assert info.batch_mode == "batched"
        assert info.engine_args["gguf_tensor_types"] == {"F32": 21}
        assert info.engine_args["gguf_file_size_bytes"] > 0
        assert info.versions["llama_cpp_python"] == "0.3.36"
        r = compare(adapter, tiny_model)
        print(f"\nllama f32 vs transformers: maxabs {r['maxabs']:.2e}  KL {r['kl']:.2e}")
        assert r["maxabs"] < 1e-3
        assert r["greedy"] == 1.0
        # greedy logprobs agree with the teacher-forced reference along the generated path too
        for g in r["greedy_scores"]:
            assert np.isfinite(g.logprobs).all() and (g.topk_ids[:, 0] == g.token_ids).all()
    finally:
        adapter.close()


@needs_llama
@needs_hf
def test_engine_default_kv_cache_moves_logprobs_a_little(tiny_model, cache_dir):
    """llama.cpp's own defaults (f16 KV cache, flash attention auto) on the f32 weights: close, not exact.
    The benchmark should show this as a (small) change, so the defaults are left as llama.cpp's."""
    adapter, info = load(tiny_model, "fp32", cache_dir)
    try:
        r = compare(adapter, tiny_model)
        print(f"\nllama f32, engine defaults: maxabs {r['maxabs']:.2e}  KL {r['kl']:.2e} "
              f"(flash_attn resolved: {info.engine_args.get('flash_attn_resolved')})")
        assert 0 < r["maxabs"] < 5e-2 and r["kl"] < 1e-5
    finally:
        adapter.close()


@needs_llama
@needs_hf
def test_qwen2_converts_and_matches(tiny_qwen2, cache_dir):
    import gguf

    adapter, info = load(tiny_qwen2, "fp32", cache_dir, **EXACT)
    try:
        names = {t.name for t in gguf.GGUFReader(info.engine_args["gguf_path"]).tensors}
        assert "output.weight" not in names  # tied embeddings: llama.cpp reuses token_embd
        assert {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"} <= names
        assert info.engine_args["source_architecture"] == "Qwen2ForCausalLM"
        r = compare(adapter, tiny_qwen2)
        print(f"\nqwen2 f32 vs transformers: maxabs {r['maxabs']:.2e}  KL {r['kl']:.2e}")
        assert r["maxabs"] < 1e-3 and r["greedy"] == 1.0
    finally:
        adapter.close()


@needs_llama
@needs_hf
def test_quantization_ladder(tiny_model, cache_dir):
    results = {}
    for level in ("fp16", "bf16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0"):
        adapter, info = load(tiny_model, level, cache_dir, **EXACT)
        try:
            r = compare(adapter, tiny_model)
        finally:
            adapter.close()
        r["size"] = info.engine_args["gguf_file_size_bytes"]
        r["types"] = info.engine_args["gguf_tensor_types"]
        r["notes"] = info.notes
        results[level] = r
        print(f"\n{level:7} size {r['size']:>8}  maxabs {r['maxabs']:.2e}  KL {r['kl']:.2e}  "
              f"greedy {r['greedy']:.2f}  {r['types']}")
        assert np.isfinite(r["maxabs"]) and np.isfinite(r["kl"])
        assert r["maxabs"] > 1e-3, f"{level} should differ measurably from the f32 reference"
    assert results["q8_0"]["kl"] < results["q4_k_m"]["kl"] < results["q4_0"]["kl"]
    assert results["fp16"]["kl"] < results["q8_0"]["kl"]
    assert results["q8_0"]["size"] < results["fp16"]["size"] and results["q4_0"]["size"] < results["q8_0"]["size"]
    assert "Q4_0" in results["q4_0"]["types"] and "Q8_0" in results["q8_0"]["types"]
    # hidden 128 is not a multiple of 256: llama.cpp falls back from K-quants, and the row says so
    assert not any(t.endswith("_K") for t in results["q4_k_m"]["types"])
    assert any("no tensor got a K-quant type" in n for n in results["q4_k_m"]["notes"])


# ----------------------------------------------------------------------------------------------
# batching and timing

@needs_llama
def test_generate_batch_of_four(tiny_model, cache_dir):
    adapter, info = load(tiny_model, "q8_0", cache_dir)
    try:
        prompts = [p[:n] for p, n in zip(prompts_of(tiny_model), (5, 17, 30, 48))]
        adapter.generate(prompts, 4, ignore_eos=True)  # warm-up (builds the 4-sequence context)
        t = adapter.generate(prompts, 12, ignore_eos=True)
        assert adapter.info.engine_args["n_seq_max"] >= 4
        rs = t.requests
        assert [r.output_tokens for r in rs] == [12] * 4 and [r.prompt_tokens for r in rs] == [5, 17, 30, 48]
        for r in rs:
            assert t.start == r.sent < r.chunk_times[0] < t.end
            assert r.chunk_tokens == [1] * 12 and len(r.chunk_times) == 12
            assert all(a < b for a, b in zip(r.chunk_times, r.chunk_times[1:])) and r.chunk_times[-1] <= t.end
            assert 0 < r.engine_ttft_s <= t.end - t.start   # llama_perf_context's own time to the first token
        # one decode step carries all 4 sequences: they share the step timestamps
        assert len({r.chunk_times[5] for r in rs}) == 1
    finally:
        adapter.close()


@needs_llama
def test_batched_greedy_equals_sequential(tiny_model, cache_dir):
    adapter, _ = load(tiny_model, "fp32", cache_dir, **EXACT)
    try:
        prompts = [p[:n] for p, n in zip(prompts_of(tiny_model), (7, 48, 20, 33))]
        together = adapter.greedy(prompts, 10, top_k=5)
        alone = [adapter.greedy([p], 10, top_k=5)[0] for p in prompts]
        for a, b in zip(together, alone):
            assert a.token_ids.tolist() == b.token_ids.tolist()
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
        # score of several prompts in one multi-sequence batch == one at a time
        s_all = adapter.score(prompts, top_k=5)
        for p, s in zip(prompts, s_all):
            np.testing.assert_allclose(s.logprobs, adapter.score([p], top_k=5)[0].logprobs, atol=1e-4)
    finally:
        adapter.close()


@needs_llama
def test_ignore_eos_false_stops_at_eos(tiny_model, cache_dir, tmp_path):
    """ignore_eos=False ends each request AT its first EOS (the EOS counted, nothing after it), before
    output_len; ignore_eos=True runs past it. The built-in tiny model never ranks its own EOS first
    (its greedy continuations never end), so a copy of it declares as EOS (config eos_token_id, which the
    GGUF conversion writes when tokenizer_config.json names no eos_token) a token that both greedy continuations reach after a few steps, at
    different steps: one request stops while the other goes on in the same batch."""
    import shutil

    max_len = 64
    prompts = prompts_of(tiny_model)[:2]
    adapter, _ = load(tiny_model, "fp32", cache_dir, **EXACT)
    try:
        conts = [adapter.greedy([p], max_len, top_k=1)[0].token_ids.tolist() for p in prompts]
    finally:
        adapter.close()
    both = [t for t in set(conts[0]) & set(conts[1]) if min(c.index(t) for c in conts) >= 3]
    assert both, f"no token in both greedy continuations: {conts}"
    eos = min(both, key=lambda t: (conts[0].index(t) == conts[1].index(t), max(c.index(t) for c in conts)))
    stops = [c.index(eos) + 1 for c in conts]   # tokens up to and including the first EOS
    model = tmp_path / "tiny-eos"
    shutil.copytree(tiny_model, model)
    config = json.loads((model / "config.json").read_text())
    assert config["eos_token_id"] not in conts[0] + conts[1]   # its own EOS: never generated
    (model / "config.json").write_text(json.dumps(config | {"eos_token_id": eos}))
    # llama.cpp's converter takes EOS from tokenizer_config.json's eos_token first (an added token), then config.json
    tok_config = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in tok_config.items() if k != "eos_token"}))

    adapter, _ = load(model, "fp32", cache_dir, **EXACT)
    try:
        assert [adapter.greedy([p], max_len, top_k=1)[0].token_ids.tolist() for p in prompts] == conts
        t = adapter.generate(prompts, max_len, ignore_eos=False)
        got = [r.output_tokens for r in t.requests]
        assert got == stops and all(n < max_len for n in stops), (got, stops, eos)
        assert all(len(r.chunk_times) == r.output_tokens for r in t.requests)
        longer = max(stops) + 3
        t = adapter.generate(prompts, longer, ignore_eos=True)
        assert [r.output_tokens for r in t.requests] == [longer] * len(prompts)
    finally:
        adapter.close()


@needs_llama
def test_kv_cleared_between_runs_unless_kept(tiny_model, cache_dir):
    prompts = prompts_of(tiny_model)[:3]
    adapter, _ = load(tiny_model, "fp32", cache_dir)
    try:
        adapter.generate(prompts, 4, True)
        adapter.generate(prompts, 4, True)
        assert adapter.last_perf["prefix_reused"] == [0, 0, 0]
    finally:
        adapter.close()
    adapter, _ = load(tiny_model, "fp32", cache_dir, keep_kv_between_runs=True, **EXACT)
    try:
        adapter.generate(prompts, 4, True)
        first = adapter.greedy(prompts, 6, top_k=3)
        assert adapter.last_perf["prefix_reused"] == [len(p) - 1 for p in prompts]
        changed = [p[:20] + [5, 6, 7] for p in prompts]
        adapter.generate(changed, 4, True)
        assert adapter.last_perf["prefix_reused"] == [20, 20, 20]
    finally:
        adapter.close()
    fresh, _ = load(tiny_model, "fp32", cache_dir, **EXACT)
    try:
        for a, b in zip(first, fresh.greedy(prompts, 6, top_k=3)):
            assert a.token_ids.tolist() == b.token_ids.tolist()
    finally:
        fresh.close()


@needs_llama
def test_prompt_lookup_is_sequential_and_lossless(tiny_model, cache_dir):
    prompts = [p[:24] * 2 for p in prompts_of(tiny_model)[:2]]  # repeated text: the lookup has drafts
    ref, _ = load(tiny_model, "fp32", cache_dir, **EXACT)
    try:
        expected = ref.greedy(prompts, 12, top_k=5)
    finally:
        ref.close()
    adapter, info = load(tiny_model, "fp32", cache_dir, prompt_lookup=True, num_pred_tokens=4, **EXACT)
    try:
        assert info.batch_mode == "sequential"
        got = adapter.greedy(prompts, 12, top_k=5)
        for a, b in zip(got, expected):
            assert a.token_ids.tolist() == b.token_ids.tolist()
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-3)
        t = adapter.generate(prompts, 12, ignore_eos=True)
        a, b = t.requests
        assert [a.output_tokens, b.output_tokens] == [12, 12]
        # one after another, both handed over at the start: the second's TTFT includes the first's run
        assert a.sent == b.sent == t.start < a.chunk_times[0] < a.chunk_times[-1] <= b.chunk_times[0] < t.end
    finally:
        adapter.close()


# ----------------------------------------------------------------------------------------------
# model files and errors (without an engine loaded: unit/test_llamacpp_files.py)

@needs_llama
def test_gguf_file_is_used_as_is(tiny_model, cache_dir):
    from adapters.engines.llamacpp.gguf_convert import quantized_gguf
    from adapters.engines.llamacpp.adapter import LlamacppAdapter

    q4, _ = quantized_gguf(tiny_model, "q4_0", cache_dir)
    for quant in ("gguf", "q4_0"):  # 'gguf', or the level the file already has
        adapter, info = load(q4, quant, cache_dir)
        try:
            assert info.engine_args["gguf_origin"] == "given" and info.engine_args["gguf_path"] == str(q4)
            assert len(adapter.score([prompts_of(tiny_model)[0]], 3)[0]) == PROMPT_LEN - 1
        finally:
            adapter.close()
    with pytest.raises(Unsupported, match="use quantization 'gguf' or 'q4_0'"):
        LlamacppAdapter().load(LoadSpec(framework="llamacpp", model=ModelSpec(name="m", source=str(q4)), quantization="q8_0", device="cpu", cache_dir=str(cache_dir)))
    with pytest.raises(Unsupported, match="HF checkpoint"):
        LlamacppAdapter().load(LoadSpec(framework="llamacpp", model=ModelSpec(name="m", source=str(tiny_model)), quantization="gguf", device="cpu",
                                        cache_dir=str(cache_dir)))


def _cpu_has_amx() -> bool:
    try:
        return re.search(r"\bamx_(tile|int8|bf16)\b", Path("/proc/cpuinfo").read_text()) is not None
    except OSError:
        return False


def test_extra_bufts_flag_in_a_subprocess(tiny_model, cache_dir, tmp_path):
    """use_extra_bufts (weight repacking), each setting in its own child process, so that a crash never
    takes the test run down. False (the default) must run on every CPU, or the test fails. True crashed
    with SIGSEGV at the first eval on AVX-512/AMX CPUs (llama.cpp's AMX matmul issue #20824, the reason
    the default is False): on a CPU with AMX exactly that crash is accepted, and said; any other crash,
    or a crash on a CPU without AMX, fails. Where both run: how far True moves the logits on Q8_0 and
    Q4_0 (repacked kernels)."""
    from adapters.engines.llamacpp.gguf_convert import quantized_gguf

    code = (
        "import sys, numpy as np\n"
        "from adapters.contract.specs import LoadSpec, ModelSpec\n"
        "from adapters.engines.llamacpp.adapter import LlamacppAdapter\n"
        "a = LlamacppAdapter()\n"
        "a.load(LoadSpec(framework='llamacpp', model=ModelSpec(name='m', source=sys.argv[1]), quantization='gguf', options={'use_extra_bufts': sys.argv[2] == 'True'}))\n"
        "np.save(sys.argv[3], a.score([list(range(3, 40))], 3)[0].logprobs)\n"
        "a.close()\n"
    )
    amx = _cpu_has_amx()
    for level in ("q8_0", "q4_0"):
        path, _ = quantized_gguf(tiny_model, level, cache_dir)
        out = {}
        for flag in (False, True):
            npy = tmp_path / f"{level}-{flag}.npy"
            proc = subprocess.run([sys.executable, "-c", code, str(path), str(flag), str(npy)], capture_output=True,
                                  text=True, timeout=120, cwd=ROOT)
            if flag and amx and proc.returncode == -signal.SIGSEGV:
                print(f"\n{level}: use_extra_bufts=True crashed with SIGSEGV on this AMX CPU (llama.cpp #20824), "
                      "as expected there; False ran")
                continue
            how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
            assert proc.returncode == 0, f"{level} use_extra_bufts={flag} (AMX: {amx}): child {how}\n{proc.stderr[-2000:]}"
            out[flag] = np.load(npy)
            assert out[flag].shape == (36,) and np.isfinite(out[flag]).all() and (out[flag] <= 0).all()
        if True in out:
            diff = float(np.abs(out[True] - out[False]).max())
            print(f"\n{level}: use_extra_bufts True vs False, max |logprob diff| {diff:.2e}")
            assert np.isfinite(diff)
