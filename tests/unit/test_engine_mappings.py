"""TensorRT-LLM and LMDeploy adapters on a machine without a GPU or either engine.

- Matrix options -> engine arguments (`engine_kwargs`, `sampling_kwargs`, `generation_kwargs`), checked
  against the argument names of the pinned versions recorded in tests/data/engine_signatures.json, so
  a misspelt argument fails here. Where the real lmdeploy config classes can be imported (an lmdeploy
  environment, or an unpacked lmdeploy-0.16.0 wheel: `make lmdeploy-src`, which `make test` runs,
  puts it in .cache/lmdeploy-src; LOSSLESS_BENCH_LMDEPLOY_SRC names another; its lmdeploy/messages.py
  imports with the CPU torch), the same arguments build the real classes too, validators included.
  tensorrt_llm does not import without CUDA; its real classes are checked only where it is installed.
- The adapters' generate/score/greedy logic against fake engines that speak the recorded API.
- On this CPU machine, trtllm and lmdeploy cells are `unsupported ... needs CUDA` rows at once.
(That importing the adapters imports neither engine is checked in a fresh interpreter:
e2e/test_harness_costs.py.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import importlib
import json
import os
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest

import adapters
from adapters.base import Unsupported, log_softmax
from adapters.contract.specs import LoadSpec, ModelSpec
from adapters.engines.lmdeploy import adapter as lmd
from adapters.engines.trtllm import adapter as trt
from orchestrator.execution.engine_child.spec import GroupJob, unsupported_reason
from orchestrator.execution.engine_child.supervisor import run_group
from orchestrator.matrix.cells import expand, group
from orchestrator.matrix.models import MatrixError
from orchestrator.matrix.validate import load_matrix, parse_matrix
from tests.helpers import ROOT

SIGS = json.loads((ROOT / "tests" / "data" / "engine_signatures.json").read_text())


def fields(engine: str, name: str) -> set[str]:
    return set(SIGS[engine]["classes"][name]["fields"])


def values(engine: str, name: str) -> list:
    return SIGS[engine]["values"][name]


def assert_known(engine: str, name: str, kwargs: dict) -> None:
    unknown = set(kwargs) - fields(engine, name)
    assert not unknown, f"{engine} {SIGS[engine]['version']} {name} has no argument(s) {sorted(unknown)}"


def load_spec(fw: str, quant: str = "fp16", options: dict | None = None, source: str = "/models/m",
              **model) -> LoadSpec:
    return LoadSpec(framework=fw, model=ModelSpec(name="m", source=source, **model), quantization=quant,
                    options=options or {}, device="cuda", gpus=1)


# --- the recorded signatures themselves ------------------------------------------------------


def test_signature_file_names_versions_and_sources():
    assert SIGS["lmdeploy"]["version"] == lmd.LMDEPLOY_VERSION == "0.16.0"
    assert SIGS["tensorrt_llm"]["version"] == trt.TRTLLM_VERSION == "1.2.1"
    for engine in ("lmdeploy", "tensorrt_llm"):
        assert SIGS[engine]["source"]
        for name, entry in SIGS[engine]["classes"].items():
            assert entry["source"] and entry["fields"], name


def test_the_check_catches_a_misspelt_argument():
    with pytest.raises(AssertionError, match="enable_prefix_cache"):
        assert_known("lmdeploy", "TurbomindEngineConfig", {"enable_prefix_cache": True})
    with pytest.raises(AssertionError, match="disable_overlap_schedular"):
        assert_known("tensorrt_llm", "TorchLlmArgs", {"disable_overlap_schedular": True})


# --- LMDeploy: options -> TurbomindEngineConfig / PytorchEngineConfig ------------------------

LMDEPLOY_CASES = [
    ("fp16", {}),
    ("bf16", {"enable_prefix_caching": True, "quant_policy": 8, "cache_max_entry_count": 0.5,
              "tensor_parallel_size": 2, "max_batch_size": 64, "session_len": 4096, "max_prefill_token_num": 2048}),
    ("awq", {}),
    ("gptq", {"quant_policy": 4}),
    ("fp8", {}),
    ("fp16", {"backend": "pytorch"}),
    ("bf16", {"backend": "pytorch", "eager_mode": True, "enable_prefix_caching": True, "quant_policy": 16}),
    ("fp8", {"backend": "pytorch"}),
    ("awq", {"backend": "pytorch"}),
    ("fp16", {"backend": "pytorch", "speculative_method": "eagle3", "speculative_model": "/models/draft",
              "num_speculative_tokens": 3}),
    ("bf16", {"backend": "pytorch", "speculative_method": "deepseek_mtp"}),
]


@pytest.mark.parametrize("quant,options", LMDEPLOY_CASES)
def test_lmdeploy_arguments_exist_in_the_pinned_version(quant, options):
    kw = lmd.engine_kwargs(load_spec("lmdeploy", quant, options, revision="abc", trust_remote_code=True))
    backend = options.get("backend", "turbomind")
    cls = "TurbomindEngineConfig" if backend == "turbomind" else "PytorchEngineConfig"
    assert kw["backend"] == backend and kw["model_path"] == "/models/m"
    assert_known("lmdeploy", cls, kw["backend_config"])
    assert_known("lmdeploy", "pipeline", kw["pipeline"] | {"model_path": 0, "backend_config": 0, "speculative_config": 0})
    cfg = kw["backend_config"]
    assert cfg["dtype"] in values("lmdeploy", f"{cls}.dtype")
    assert cfg["tp"] == options.get("tensor_parallel_size", 1)
    assert cfg["quant_policy"] in values("lmdeploy", "QuantPolicy")
    assert cfg["revision"] == "abc" and kw["pipeline"]["trust_remote_code"] is True
    if "model_format" in cfg:
        assert cfg["model_format"] in values("lmdeploy", f"{cls}.model_format")
    if backend == "turbomind":
        assert cfg["quant_policy"] in values("lmdeploy", "TurbomindEngineConfig.quant_policy")
        assert "eager_mode" not in cfg and "logprobs_mode" not in cfg
    else:
        assert cfg["logprobs_mode"] == "raw_logprobs" and cfg["logprobs_mode"] in values("lmdeploy", "PytorchEngineConfig.logprobs_mode")
    if kw["speculative_config"]:
        assert_known("lmdeploy", "SpeculativeConfig", kw["speculative_config"])
        assert kw["speculative_config"]["method"] in values("lmdeploy", "SpeculativeConfig.method")


def test_lmdeploy_mapping_values():
    tm = lambda q, o=None: lmd.engine_kwargs(load_spec("lmdeploy", q, o))["backend_config"]  # noqa: E731
    assert tm("fp16")["dtype"] == "float16" and tm("bf16")["dtype"] == "bfloat16"
    assert tm("awq") == {"dtype": "auto", "tp": 1, "cache_max_entry_count": 0.8, "enable_prefix_caching": False,
                        "quant_policy": 0, "model_format": "awq"}
    assert tm("gptq")["model_format"] == "gptq" and tm("fp8")["model_format"] == "fp8"
    assert "model_format" not in tm("fp16")
    pt = lambda q, o=None: tm(q, {"backend": "pytorch"} | (o or {}))  # noqa: E731
    assert pt("fp8")["model_format"] == "fp8"          # online blocked-fp8 quantization
    assert "model_format" not in pt("awq")             # read from the checkpoint's quantization_config
    assert pt("fp16", {"eager_mode": True})["eager_mode"] is True
    assert pt("fp16")["eager_mode"] is False           # CUDA graphs on: the engine default
    spec = lmd.engine_kwargs(load_spec("lmdeploy", "fp16", {"backend": "pytorch", "speculative_method": "eagle",
                                                            "speculative_model": "/d"}))["speculative_config"]
    assert spec == {"method": "eagle", "num_speculative_tokens": 1, "model": "/d"}


@pytest.mark.parametrize("options,message", [
    ({"eager_mode": True}, "eager_mode is a PyTorch-engine option"),
    ({"speculative_method": "deepseek_mtp"}, "PyTorch engine only"),
    ({"quant_policy": 16}, "TurboMind has no fp8 KV cache"),
    ({"backend": "pytorch", "speculative_method": "eagle3"}, "needs speculative_model"),
    ({"cache_max_entry_count": 1.0}, "less than 1"),
    ({"quant_policy": 2}, "quant_policy"),
])
def test_lmdeploy_option_conflicts_are_matrix_errors(options, message):
    with pytest.raises(MatrixError, match=message):
        parse_matrix(_matrix(["lmdeploy"], flags={"lmdeploy": {"x": options}}, axis_flags=["x"]))


@pytest.mark.parametrize("kind,backend", [("timing", "turbomind"), ("timing", "pytorch"),
                                          ("greedy", "turbomind"), ("greedy", "pytorch")])
def test_lmdeploy_generation_config_arguments(kind, backend):
    kw = lmd.generation_kwargs(kind, 8, False, backend, top_k=5)
    assert_known("lmdeploy", "GenerationConfig", kw)
    assert kw["do_sample"] is False and kw["max_new_tokens"] == 8
    if kind == "greedy":
        assert kw["ignore_eos"] is True
        if backend == "turbomind":
            assert kw["output_logits"] == "generation" and "logprobs" not in kw  # never TurboMind's logprobs
        else:
            assert kw["logprobs"] == 5 and "output_logits" not in kw


def test_lmdeploy_async_engine_calls_exist():
    pre = fields("lmdeploy", "AsyncEngine.preprocess")
    assert {"messages", "session_id", "input_ids", "gen_config"} <= pre
    assert {"request", "stream_response"} <= fields("lmdeploy", "AsyncEngine.generate")
    assert "input_ids" in fields("lmdeploy", "AsyncEngine.async_get_logits")


# --- the real lmdeploy classes, where they import ------------------------------------------


LMDEPLOY_SRC_DEFAULT = ROOT / ".cache" / "lmdeploy-src"   # where `make lmdeploy-src` unpacks the wheel


def _import_lmdeploy_messages(src: Path | None):
    """lmdeploy.messages from an lmdeploy environment, or from the unpacked wheel `src` (its
    lmdeploy/__init__ pulls mmengine and more; messages.py does not). None: neither is there."""
    try:
        return importlib.import_module("lmdeploy.messages")
    except Exception:  # noqa: BLE001 - not installed, or installed without its CUDA pieces
        pass
    if src is None:
        return None
    saved = {k: v for k, v in sys.modules.items() if k == "lmdeploy" or k.startswith("lmdeploy.")}
    pkg = types.ModuleType("lmdeploy")
    pkg.__path__ = [str(src / "lmdeploy")]
    sys.modules["lmdeploy"] = pkg
    try:
        version = importlib.import_module("lmdeploy.version").__version__
        assert version == lmd.LMDEPLOY_VERSION, f"{src} holds lmdeploy {version}, the adapter pins {lmd.LMDEPLOY_VERSION}"
        return importlib.import_module("lmdeploy.messages")
    finally:  # keep the module object, leave sys.modules as it was
        for k in [k for k in sys.modules if k == "lmdeploy" or k.startswith("lmdeploy.")]:
            del sys.modules[k]
        sys.modules.update(saved)


@pytest.fixture(scope="module")
def real_lmdeploy():
    """The real lmdeploy config classes. LOSSLESS_BENCH_LMDEPLOY_SRC (set by `make test`) makes them
    required: a missing or broken unpacked wheel is then a failure, not a skip."""
    named = os.environ.get("LOSSLESS_BENCH_LMDEPLOY_SRC")
    src = Path(named) if named else LMDEPLOY_SRC_DEFAULT
    if named:
        assert (src / "lmdeploy" / "messages.py").exists(), \
            f"LOSSLESS_BENCH_LMDEPLOY_SRC={named} holds no unpacked lmdeploy wheel (run `make lmdeploy-src`)"
    messages = _import_lmdeploy_messages(src if (src / "lmdeploy" / "messages.py").exists() else None)
    if messages is None:
        pytest.skip(f"lmdeploy's config classes are not importable here: run `make lmdeploy-src` (unpacks the "
                    f"lmdeploy-{lmd.LMDEPLOY_VERSION} wheel into {LMDEPLOY_SRC_DEFAULT.relative_to(ROOT)}), "
                    "or install lmdeploy")
    return messages


def test_recorded_lmdeploy_fields_match_the_real_classes(real_lmdeploy):
    for name in ("TurbomindEngineConfig", "PytorchEngineConfig", "GenerationConfig", "SpeculativeConfig"):
        real = {f.name for f in dataclasses.fields(getattr(real_lmdeploy, name))}
        assert real == fields("lmdeploy", name), name


@pytest.mark.parametrize("quant,options", LMDEPLOY_CASES)
def test_lmdeploy_arguments_build_the_real_classes(real_lmdeploy, quant, options):
    kw = lmd.engine_kwargs(load_spec("lmdeploy", quant, options))
    cls = real_lmdeploy.TurbomindEngineConfig if kw["backend"] == "turbomind" else real_lmdeploy.PytorchEngineConfig
    cfg = cls(**kw["backend_config"])  # runs lmdeploy's own __post_init__ checks
    assert int(cfg.quant_policy) == kw["backend_config"]["quant_policy"]
    if kw["speculative_config"]:
        real_lmdeploy.SpeculativeConfig(**kw["speculative_config"])
    for kind in ("timing", "greedy"):
        real_lmdeploy.GenerationConfig(**lmd.generation_kwargs(kind, 4, True, kw["backend"], 3))


# --- TensorRT-LLM: options -> LLM(**TorchLlmArgs), KvCacheConfig, CudaGraphConfig, SamplingParams --

TRTLLM_CASES = [
    ("fp16", {}),
    ("bf16", {"cuda_graphs": False, "overlap_scheduler": False, "kv_block_reuse": True,
              "kv_cache_free_gpu_memory_fraction": 0.5, "tensor_parallel_size": 2, "max_batch_size": 64,
              "max_num_tokens": 4096, "max_seq_len": 2048, "enable_chunked_prefill": True,
              "sampler_type": "TorchSampler", "deterministic": True}),
    ("bf16", {"cuda_graph_padding": True, "cuda_graph_batch_sizes": [1, 2, 4]}),
    ("fp8", {"kv_cache_dtype": "fp8"}),
    ("awq", {}),
]


@pytest.mark.parametrize("quant,options", TRTLLM_CASES)
def test_trtllm_arguments_exist_in_the_pinned_version(quant, options):
    kw = trt.engine_kwargs(load_spec("trtllm", quant, options, revision="abc"))
    assert_known("tensorrt_llm", "TorchLlmArgs", kw)
    assert_known("tensorrt_llm", "KvCacheConfig", kw["kv_cache_config"])
    if kw["cuda_graph_config"] is not None:
        assert_known("tensorrt_llm", "CudaGraphConfig", kw["cuda_graph_config"])
    assert kw["dtype"] in values("tensorrt_llm", "TorchLlmArgs.dtype")
    assert kw["kv_cache_config"]["dtype"] in values("tensorrt_llm", "KvCacheConfig.dtype")
    if "sampler_type" in kw:
        assert kw["sampler_type"] in values("tensorrt_llm", "TorchLlmArgs.sampler_type")
    assert kw["tensor_parallel_size"] == options.get("tensor_parallel_size", 1) and kw["revision"] == "abc"


def test_trtllm_mapping_values():
    kw = trt.engine_kwargs(load_spec("trtllm", "fp16"))
    # block reuse off by default: context logits (teacher-forced scores) need it off
    assert kw["kv_cache_config"] == {"enable_block_reuse": False, "free_gpu_memory_fraction": 0.9, "dtype": "auto"}
    assert kw["cuda_graph_config"] == {"enable_padding": False} and kw["disable_overlap_scheduler"] is False
    assert kw["dtype"] == "float16" and "backend" not in kw
    assert trt.engine_kwargs(load_spec("trtllm", "bf16"))["dtype"] == "bfloat16"
    assert trt.engine_kwargs(load_spec("trtllm", "fp8"))["dtype"] == "auto"   # the checkpoint decides
    off = trt.engine_kwargs(load_spec("trtllm", "bf16", {"cuda_graphs": False, "overlap_scheduler": False}))
    assert off["cuda_graph_config"] is None and off["disable_overlap_scheduler"] is True
    assert trt.env_vars(load_spec("trtllm", options={"deterministic": True})) == {"FORCE_DETERMINISTIC": "1"}
    assert trt.env_vars(load_spec("trtllm")) == {}


@pytest.mark.parametrize("kind", ["timing", "score", "greedy"])
def test_trtllm_sampling_params_arguments(kind):
    kw = trt.sampling_kwargs(kind, 8, ignore_eos=False)
    assert_known("tensorrt_llm", "SamplingParams", kw)
    assert kw["top_k"] == 1 and "top_p" not in kw  # greedy (SamplingParams._greedy_decoding)
    assert {"timing": "return_perf_metrics", "score": "return_context_logits",
            "greedy": "return_generation_logits"}[kind] in kw


def test_trtllm_option_conflicts_are_matrix_errors():
    with pytest.raises(MatrixError, match="need cuda_graphs: true"):
        parse_matrix(_matrix(["trtllm"], flags={"trtllm": {"x": {"cuda_graphs": False, "cuda_graph_padding": True}}},
                             axis_flags=["x"]))
    with pytest.raises(MatrixError, match=r"flags.trtllm.x.kv_block_reus: unknown key \(known options for trtllm: .*kv_block_reuse"):
        parse_matrix(_matrix(["trtllm"], flags={"trtllm": {"x": {"kv_block_reus": True}}}, axis_flags=["x"]))


def test_real_tensorrt_llm_classes_where_installed():
    try:
        from tensorrt_llm import SamplingParams
        from tensorrt_llm.llmapi.llm_args import CudaGraphConfig, KvCacheConfig, TorchLlmArgs
    except Exception as err:  # noqa: BLE001 - CUDA-only package
        pytest.skip(f"tensorrt_llm does not import here ({type(err).__name__}); checked on the GPU machine")
    kw = trt.engine_kwargs(load_spec("trtllm", "fp16", {"cuda_graph_padding": True}))
    assert set(kw) <= set(TorchLlmArgs.model_fields)
    KvCacheConfig(**kw["kv_cache_config"])
    CudaGraphConfig(**kw["cuda_graph_config"])
    for kind in ("timing", "score", "greedy"):
        SamplingParams(**trt.sampling_kwargs(kind, 4))


# --- checkpoint checks (pure) -------------------------------------------------------------


def test_prequantized_levels_need_a_matching_checkpoint(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"vocab_size": 10}))
    awq = tmp_path / "awq"
    awq.mkdir()
    (awq / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "awq"}}))
    modelopt = tmp_path / "modelopt"
    modelopt.mkdir()
    (modelopt / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))

    assert "lmdeploy lite auto_awq" in lmd.checkpoint_problem(load_spec("lmdeploy", "awq", source=str(plain)))
    assert lmd.checkpoint_problem(load_spec("lmdeploy", "awq", source=str(awq))) is None
    assert lmd.checkpoint_problem(load_spec("lmdeploy", "fp8", {"backend": "pytorch"}, source=str(plain))) is None
    assert "pre-quantized" in lmd.checkpoint_problem(load_spec("lmdeploy", "fp8", source=str(plain)))
    assert lmd.checkpoint_problem(load_spec("lmdeploy", "awq", source="org/hub-id")) is None

    assert "ModelOpt" in trt.checkpoint_problem(load_spec("trtllm", "fp8", source=str(plain)))
    assert trt.checkpoint_problem(load_spec("trtllm", "fp8", source=str(modelopt))) is None
    assert "ModelOpt" in trt.checkpoint_problem(load_spec("trtllm", "awq", source=str(awq)))
    assert trt.checkpoint_problem(load_spec("trtllm", "fp16", source=str(plain))) is None


def test_trtllm_tensorrt_backend_is_refused_with_a_reason():
    reason = trt.TrtllmAdapter().check(load_spec("trtllm", "fp16", {"backend": "tensorrt"}))
    assert "backend: pytorch" in reason


# --- fake engines: the adapters' own logic ----------------------------------------------------

V = 12  # vocabulary of the fake model


def fake_logits(prefix) -> np.ndarray:
    """Deterministic logits of a fake model for the next token after `prefix`."""
    rng = np.random.default_rng(int(np.sum(np.asarray(prefix, dtype=np.int64) * 7919)) + len(prefix))
    return rng.normal(size=V).astype(np.float32)


def fake_greedy(prompt, n):
    seq, rows = list(prompt), []
    for _ in range(n):
        lg = fake_logits(seq)
        rows.append(lg)
        seq.append(int(np.argmax(lg)))
    return seq[len(prompt):], np.stack(rows)


class FakeGenerationConfig:
    def __init__(self, **kw):
        assert_known("lmdeploy", "GenerationConfig", kw)
        self.__dict__.update({"output_logits": None, "logprobs": None} | kw)


class FakeLmdeployEngine:
    """Speaks AsyncEngine.preprocess / generate / async_get_logits as lmdeploy 0.16.0 does."""

    def __init__(self, backend):
        self.backend = backend
        self.session_mgr = types.SimpleNamespace(get=lambda: object())

    async def preprocess(self, **kw):
        assert_known("lmdeploy", "AsyncEngine.preprocess", kw)
        assert kw["messages"] is None and all(isinstance(t, int) for t in kw["input_ids"])
        return kw

    async def generate(self, request, stream_response=True):
        gc, prompt = request["gen_config"], request["input_ids"]
        ids, rows = fake_greedy(prompt, gc.max_new_tokens)
        steps = range(1, len(ids) + 1) if stream_response else [len(ids)]
        prev = 0
        for k in steps:
            await asyncio.sleep(0.001)
            out = types.SimpleNamespace(generate_token_len=k, token_ids=ids[prev:k], finish_reason=None,
                                        logits=None, logprobs=None)
            if gc.output_logits == "generation":  # TurboMind: all generation rows so far, vocab padded
                out.logits = np.pad(rows[:k], ((0, 0), (0, 3)), constant_values=50.0)
            if gc.logprobs:  # PyTorch engine: this chunk's steps, sampled token + top k
                out.logprobs = []
                for r, tok in zip(rows[prev:k], ids[prev:k]):
                    lp = log_softmax(r[None])[0]
                    top = np.argsort(-lp)[: gc.logprobs]
                    out.logprobs.append({int(t): float(lp[t]) for t in [tok, *top]})
            prev = k
            yield out
        yield types.SimpleNamespace(generate_token_len=len(ids), token_ids=[], finish_reason="length",
                                    logits=None, logprobs=None)

    async def async_get_logits(self, input_ids, sessions=None):
        return [np.pad(np.stack([fake_logits(p[: i + 1]) for i in range(len(p))]), ((0, 0), (0, 3)),
                       constant_values=50.0) for p in input_ids]


@pytest.fixture
def event_loop_thread():
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def fake_lmdeploy(backend, loop, options=None):
    a = lmd.LmdeployAdapter()
    a.backend, a.opts = backend, lmd.LmdeployOptions(**({"backend": backend} | (options or {})))
    a.GenerationConfig, a.engine, a.loop, a.vocab = FakeGenerationConfig, FakeLmdeployEngine(backend), loop, V
    return a


PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9]]


def _check_chunks(t, n_tokens: int) -> None:
    """Every request's chunks: in time order within the call, each a distinct time, carrying every token."""
    for r in t.requests:
        assert sum(r.chunk_tokens) == n_tokens and min(r.chunk_tokens) >= 1
        assert t.start <= r.sent < r.chunk_times[0] and r.chunk_times[-1] <= r.end <= t.end
        assert all(b > a for a, b in zip(r.chunk_times, r.chunk_times[1:]))


def expected_scores(prompt):
    return log_softmax(np.stack([fake_logits(prompt[: i + 1]) for i in range(len(prompt) - 1)]))


@pytest.mark.parametrize("backend", ["turbomind", "pytorch"])
def test_lmdeploy_adapter_logic_on_a_fake_engine(backend, event_loop_thread):
    a = fake_lmdeploy(backend, event_loop_thread)
    t = a.generate(PROMPTS, 4, ignore_eos=True)
    assert [r.output_tokens for r in t.requests] == [4, 4, 4] and [r.prompt_tokens for r in t.requests] == [5, 3, 7]
    _check_chunks(t, 4)
    assert all(r.engine_ttft_s is None for r in t.requests) and "engine_ttft_ms" in t.missing

    for p, s in zip(PROMPTS, a.score(PROMPTS, top_k=3)):
        want = expected_scores(p)
        assert np.allclose(s.logprobs, want[np.arange(len(p) - 1), p[1:]], atol=1e-6)
        assert (s.topk_ids[:, 0] == want.argmax(1)).all()  # padded vocabulary columns were cut

    for p, s in zip(PROMPTS, a.greedy(PROMPTS, 5, top_k=3)):
        ids, rows = fake_greedy(p, 5)
        lp = log_softmax(rows)
        assert s.token_ids.tolist() == ids and s.topk_ids.shape == (5, 3)
        assert np.allclose(s.logprobs, lp[np.arange(5), ids], atol=1e-6)
        assert np.allclose(s.topk_logprobs, -np.sort(-lp, axis=1)[:, :3], atol=1e-6)


def test_lmdeploy_prefix_caching_makes_scores_unsupported(event_loop_thread):
    a = fake_lmdeploy("turbomind", event_loop_thread, {"enable_prefix_caching": True})
    with pytest.raises(Unsupported, match="prefix caching"):
        a.score(PROMPTS, 3)


class FakeSamplingParams:
    def __init__(self, **kw):
        assert_known("tensorrt_llm", "SamplingParams", kw)
        self.__dict__.update({"return_context_logits": False, "return_generation_logits": False,
                              "return_perf_metrics": False, "ignore_eos": False} | kw)


class FakeLLM:
    """Speaks LLM.generate / generate_async as tensorrt_llm's LLM API does."""

    def _result(self, prompt, sp, k):
        ids, rows = fake_greedy(prompt, k)
        pad = lambda a: np.pad(a, ((0, 0), (0, 5)), constant_values=50.0)  # noqa: E731 - padded vocabulary
        metrics = types.SimpleNamespace(timing_metrics=types.SimpleNamespace(
            arrival_time=datetime.timedelta(seconds=10), first_token_time=datetime.timedelta(seconds=10.25)))
        out = types.SimpleNamespace(token_ids=ids, generation_logits=pad(rows) if sp.return_generation_logits else None,
                                    request_perf_metrics=metrics if sp.return_perf_metrics else None)
        ctx = pad(np.stack([fake_logits(prompt[: i + 1]) for i in range(len(prompt))])) if sp.return_context_logits else None
        return types.SimpleNamespace(outputs=[out], context_logits=ctx)

    def generate(self, inputs, **kw):
        assert_known("tensorrt_llm", "LLM.generate", kw | {"inputs": 0})
        assert isinstance(inputs[0], list)  # a batch of token-id prompts
        return [self._result(p, kw["sampling_params"], kw["sampling_params"].max_tokens) for p in inputs]

    async def generate_async(self, inputs, **kw):
        assert_known("tensorrt_llm", "LLM.generate_async", kw | {"inputs": 0})
        assert kw["streaming"] is True
        sp = kw["sampling_params"]
        for k in range(1, sp.max_tokens + 1):
            await asyncio.sleep(0.001)
            yield self._result(inputs, sp, k)


def fake_trtllm(options=None):
    a = trt.TrtllmAdapter()
    a.opts, a.SamplingParams, a.llm, a.vocab = trt.TrtllmOptions(**(options or {})), FakeSamplingParams, FakeLLM(), V
    return a


def test_trtllm_adapter_logic_on_a_fake_engine():
    a = fake_trtllm()
    t = a.generate(PROMPTS, 4, ignore_eos=True)
    assert [r.output_tokens for r in t.requests] == [4, 4, 4]
    assert [r.engine_ttft_s for r in t.requests] == pytest.approx([0.25] * 3)
    _check_chunks(t, 4)

    for p, s in zip(PROMPTS, a.score(PROMPTS, top_k=3)):
        want = expected_scores(p)
        assert np.allclose(s.logprobs, want[np.arange(len(p) - 1), p[1:]], atol=1e-6)
        assert (s.topk_ids[:, 0] == want.argmax(1)).all()

    for p, s in zip(PROMPTS, a.greedy(PROMPTS, 5, top_k=3)):
        ids, rows = fake_greedy(p, 5)
        assert s.token_ids.tolist() == ids
        assert np.allclose(s.logprobs, log_softmax(rows)[np.arange(5), ids], atol=1e-6)


def test_trtllm_block_reuse_makes_scores_unsupported():
    with pytest.raises(Unsupported, match="block reuse off"):
        fake_trtllm({"kv_block_reuse": True}).score(PROMPTS, 3)


# --- on this CPU machine: unsupported rows at once, before any process starts ----------------


def _matrix(frameworks, quantization=("fp16",), flags=None, axis_flags=("default",), device="cpu"):
    return {"name": "cuda-only", "models": {"tiny": "builtin:tiny"},
            "axes": {"framework": list(frameworks), "model": ["tiny"], "quantization": list(quantization),
                     "batch_size": [1, 2], "flags": list(axis_flags), "input_len": [16], "output_len": [4]},
            "flags": flags or {}, "run": {"device": device}}


def _jobs(data, device="cpu"):
    m = parse_matrix(data)
    return [GroupJob(run_id="r", group=g, matrix=m, device=device, python=sys.executable, cache_dir="/nonexistent")
            for g in group(expand(m))]


def test_cuda_only_frameworks_are_unsupported_rows_on_a_cpu_run():
    flags = {"lmdeploy": {"pt": {"backend": "pytorch"}}, "trtllm": {"pt": {"cuda_graphs": False}}}
    jobs = _jobs(_matrix(["trtllm", "lmdeploy"], ("fp16", "bf16"), flags, ["default", "pt"]))
    assert len(jobs) == 8
    for job in jobs:
        reason = unsupported_reason(job, sys.executable)
        assert reason == f"{job.group.framework} needs CUDA; this run's device is cpu"
        rows = run_group(job)  # returns at once: no process, no prompts, no model
        assert [r.row["status"] for r in rows] == ["unsupported"] * len(job.group.cells)
        assert all("needs CUDA" in r.row["reason"] and r.logprobs is None and r.tasks is None for r in rows)


def test_levels_an_engine_cannot_run_say_so_first():
    (job,) = _jobs(_matrix(["lmdeploy"], ("fp32",)))
    assert unsupported_reason(job, sys.executable).startswith("lmdeploy does not run quantization fp32")
    (job,) = _jobs(_matrix(["trtllm"], ("q4_k_m",)))
    assert "trtllm does not run quantization q4_k_m" in unsupported_reason(job, sys.executable)
    # no fp32 on TensorRT-LLM's PyTorch backend (NVIDIA/TensorRT-LLM#5260): unsupported rows, on CUDA too
    (job,) = _jobs(_matrix(["trtllm"], ("fp32",), device="cuda"), device="cuda")
    assert unsupported_reason(job, sys.executable).startswith("trtllm does not run quantization fp32")
    rows = run_group(job)
    assert [r.row["status"] for r in rows] == ["unsupported"] * len(job.group.cells)
    assert all("does not run quantization fp32" in r.row["reason"] for r in rows)


def test_on_cuda_a_missing_environment_names_the_install_command():
    (job,) = _jobs(_matrix(["lmdeploy"]), device="cuda")
    reason = unsupported_reason(job, "/nonexistent/.venvs/lmdeploy/bin/python")
    assert "environment not installed" in reason and "lmdeploy==0.16.0" in reason
    (job,) = _jobs(_matrix(["trtllm"]), device="cuda")
    assert "tensorrt_llm==1.2.1" in unsupported_reason(job, "/nonexistent/python")


def test_adapters_are_registered_as_cuda_only():
    for name in ("trtllm", "lmdeploy"):
        cls = adapters.ADAPTERS[name]
        assert cls.needs_cuda and cls.install_hint and cls.requires_modules


def test_gpu_check_matrix_is_valid():
    m, _ = load_matrix(ROOT / "matrices" / "gpu-check.yaml")
    assert {"hf", "vllm", "trtllm", "lmdeploy"} <= set(m.axes.framework)
    assert m.run.device == "cuda"


# -- serve cells: the servers' command lines ---------------------------------------------------------
# Flags each server's CLI defines, read from its source: lmdeploy 0.16.0 lmdeploy/cli/serve.py
# (add_parser_api_server) with cli/utils.py (ArgumentHelper); tensorrt_llm/commands/serve.py (click
# options of `serve`; recent main, not the 1.2.1 tag). These servers need CUDA: the command lines are
# checked here, the servers themselves only on a GPU host (tests/gpu).
LMDEPLOY_SERVE_FLAGS = {"--server-name", "--server-port", "--backend", "--model-name", "--tp", "--dtype",
                        "--cache-max-entry-count", "--quant-policy", "--generation-config", "--log-level",
                        "--model-format", "--session-len", "--max-batch-size", "--max-prefill-token-num",
                        "--logprobs-mode", "--revision", "--enable-prefix-caching", "--eager-mode",
                        "--trust-remote-code"}
TRTLLM_SERVE_FLAGS = {"--host", "--port", "--backend", "--tp_size", "--log_level", "--extra_llm_api_options",
                      "--trust_remote_code"}


def _flags(argv: list[str]) -> set[str]:
    return {a for a in argv if a.startswith("--")}


@pytest.mark.parametrize("quant,options", LMDEPLOY_CASES)
def test_lmdeploy_api_server_command_uses_only_its_flags(quant, options):
    spec = load_spec("lmdeploy", quant, options, trust_remote_code=True)
    try:
        argv = lmd.server_argv(spec, 23333)
    except Unsupported as err:   # speculative decoding: offline only, and said so
        assert options.get("speculative_method") and "offline pipeline only" in str(err)
        return
    assert argv[:4] == ["lmdeploy", "serve", "api_server", "/models/m"]
    assert _flags(argv) <= LMDEPLOY_SERVE_FLAGS, _flags(argv) - LMDEPLOY_SERVE_FLAGS
    value = lambda flag: argv[argv.index(flag) + 1]  # noqa: E731
    kw = lmd.engine_kwargs(spec)
    assert value("--server-port") == "23333" and value("--server-name") == "127.0.0.1"
    assert value("--backend") == kw["backend"] and value("--tp") == str(kw["backend_config"]["tp"])
    assert ("--enable-prefix-caching" in argv) == kw["backend_config"]["enable_prefix_caching"]
    assert "--trust-remote-code" in argv and value("--generation-config") == "lmdeploy"


@pytest.mark.parametrize("quant,options", TRTLLM_CASES)
def test_trtllm_serve_command_and_its_extra_options(quant, options, tmp_path):
    spec = load_spec("trtllm", quant, options)
    spec.cache_dir = str(tmp_path)
    argv, extra = trt.server_argv(spec, 8123)
    assert argv[:3] == ["trtllm-serve", "serve", "/models/m"] and _flags(argv) <= TRTLLM_SERVE_FLAGS
    assert argv[argv.index("--port") + 1] == "8123" and argv[argv.index("--host") + 1] == "127.0.0.1"
    # the LLM API arguments go whole into the options file: the same ones the offline adapter builds
    assert extra == {k: v for k, v in trt.engine_kwargs(spec).items() if k != "model"}
    assert argv[argv.index("--extra_llm_api_options") + 1].startswith(str(tmp_path))
