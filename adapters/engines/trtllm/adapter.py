"""TensorRT-LLM through its LLM API, PyTorch backend (the LLM API's default since 1.0). CUDA only.

Pinned to tensorrt_llm 1.2.1, the newest stable release on PyPI (whose package there is a stub that
fetches the wheel from pypi.nvidia.com). The NVIDIA/TensorRT-LLM snapshot (2.5 GB) could not be
fetched whole, so the argument names were read from the indexed source of NVIDIA/TensorRT-LLM:
tensorrt_llm/llmapi/llm_args.py of the 1.2 line (BaseLlmArgs, TorchLlmArgs, KvCacheConfig,
CudaGraphConfig, SamplerType; `quant_config` there is TrtLlmArgs-only, a private attribute of
TorchLlmArgs), checked against the same file on main, tensorrt_llm/sampling_params.py
(SamplingParams), tensorrt_llm/quantization/mode.py (QuantAlgo), the LLM API tests of
return_context_logits / return_generation_logits / return_perf_metrics, and the LLM.generate_async
streaming example. tests/data/engine_signatures.json records those names; the GPU check
(tests/gpu/test_gpu_engines.py) runs them against the installed package.

What that source says, and what this adapter does about it:
- Context logits (teacher-forced scores) come back for the whole prompt only with KV-cache block
  reuse off: with reuse a repeated prompt returns a single row. So kv_block_reuse defaults to False
  here (TensorRT-LLM's own default is True); with it on, scores are `Unsupported`.
- Logits are raw: SamplingParams(return_context_logits / return_generation_logits), log-softmax here,
  cut to the model's vocabulary (the engine may pad it).
- Timings: every request of a batch goes through `LLM.generate_async(..., streaming=True)` together
  under asyncio; each streamed step is timestamped as it arrives. The engine's own per-request
  metrics (SamplingParams(return_perf_metrics=True): timing_metrics.arrival_time and
  first_token_time) give engine_ttft_s, the cross-check of the wall-clock TTFT.
- Quantization on the PyTorch backend comes from the checkpoint (a ModelOpt hf_quant_config.json or
  an HF quantization_config): fp8 and awq (W4A16 AWQ) need a pre-quantized checkpoint; fp32/fp16/bf16
  are `dtype`. The KV cache can be fp8 on its own (KvCacheConfig.dtype, option kv_cache_dtype).
- Deterministic mode: the environment variable FORCE_DETERMINISTIC=1, set before tensorrt_llm is
  imported (what the maintainers point to in NVIDIA/TensorRT-LLM#13290, instead of an LlmArgs field).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
from pydantic import Field, model_validator

from adapters.base import (
    Adapter,
    EngineOptions,
    NumericsFlag,
    Unsupported,
    log_softmax,
    logits_rows,
    no_cuda_reason,
    one_length,
    register,
)
from adapters.contract.events import LoadFacts
from adapters.contract.openai_api import ServerApi, ServerLaunch
from adapters.contract.records import TokenScores, topk_dense
from adapters.contract.specs import LoadSpec
from adapters.contract.timing import RequestTiming, TimedRun

TRTLLM_VERSION = "1.2.1"

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# Pre-quantized checkpoints the PyTorch backend reads: ModelOpt quant_algo names (QuantAlgo) and HF
# quantization_config.quant_method names.
PREQUANTIZED = {"fp8": {"algos": {"FP8", "FP8_BLOCK_SCALES", "FP8_PER_CHANNEL_PER_TOKEN"}, "methods": {"fp8"}},
                "awq": {"algos": {"W4A16_AWQ"}, "methods": set()}}


class TrtllmOptions(EngineOptions):
    backend: Literal["pytorch", "tensorrt"] = "pytorch"
    tensor_parallel_size: int = Field(1, ge=1)
    cuda_graphs: bool = Field(True, description="cuda_graph_config=CudaGraphConfig(...) (the engine default); "
                              "False: cuda_graph_config=None")
    cuda_graph_padding: bool = Field(False, description="CudaGraphConfig.enable_padding")
    cuda_graph_batch_sizes: list[int] | None = Field(None, description="CudaGraphConfig.batch_sizes")
    overlap_scheduler: bool = Field(True, description="False: disable_overlap_scheduler=True")
    kv_block_reuse: bool = Field(False, description="KvCacheConfig.enable_block_reuse; must stay off for context "
                                 "logits (teacher-forced scores)")
    kv_cache_free_gpu_memory_fraction: float = Field(0.9, gt=0, le=1, description="KvCacheConfig.free_gpu_memory_fraction")
    kv_cache_dtype: Literal["auto", "fp8"] = Field("auto", description="KvCacheConfig.dtype")
    max_batch_size: int | None = Field(None, ge=1)
    max_num_tokens: int | None = Field(None, ge=1)
    max_seq_len: int | None = Field(None, ge=1)
    enable_chunked_prefill: bool = False
    sampler_type: Literal["auto", "TorchSampler", "TRTLLMSampler"] | None = None
    deterministic: bool = Field(False, description="FORCE_DETERMINISTIC=1 in the engine's environment")

    @model_validator(mode="after")
    def _graph_rules(self) -> "TrtllmOptions":
        if not self.cuda_graphs and (self.cuda_graph_padding or self.cuda_graph_batch_sizes):
            raise ValueError("cuda_graph_padding / cuda_graph_batch_sizes need cuda_graphs: true")
        return self


def engine_kwargs(spec: LoadSpec) -> dict[str, Any]:
    """Matrix options -> `tensorrt_llm.LLM(**kwargs)` (TorchLlmArgs fields), without importing it.

    Nested configs are plain dicts here (kv_cache_config -> KvCacheConfig, cuda_graph_config ->
    CudaGraphConfig or None); `load` builds the classes from them.
    """
    opts = TrtllmOptions(**spec.options)
    args: dict[str, Any] = {
        "model": spec.model.source,
        "dtype": DTYPES.get(spec.quantization, "auto"),  # pre-quantized: the checkpoint decides
        "tensor_parallel_size": opts.tensor_parallel_size,
        "trust_remote_code": spec.model.trust_remote_code,
        "kv_cache_config": {"enable_block_reuse": opts.kv_block_reuse,
                            "free_gpu_memory_fraction": opts.kv_cache_free_gpu_memory_fraction,
                            "dtype": opts.kv_cache_dtype},
        "cuda_graph_config": None,  # None: no CUDA graphs
        "disable_overlap_scheduler": not opts.overlap_scheduler,
        "enable_chunked_prefill": opts.enable_chunked_prefill,
    }
    if opts.cuda_graphs:
        args["cuda_graph_config"] = {"enable_padding": opts.cuda_graph_padding}
        if opts.cuda_graph_batch_sizes:
            args["cuda_graph_config"]["batch_sizes"] = list(opts.cuda_graph_batch_sizes)
    if spec.model.revision:
        args["revision"] = spec.model.revision
    for name in ("max_batch_size", "max_num_tokens", "max_seq_len", "sampler_type"):
        if getattr(opts, name) is not None:
            args[name] = getattr(opts, name)
    return args


def server_argv(spec: LoadSpec, port: int) -> tuple[list[str], dict[str, Any]]:
    """`trtllm-serve` for this group, and the LLM API arguments its CLI has no flag for (they go in the
    --extra_llm_api_options file, written by `server`), without importing tensorrt_llm."""
    kw = engine_kwargs(spec)
    model = kw.pop("model")
    extra = Path(spec.cache_dir or ".") / f"trtllm-serve-{port}.yaml"
    argv = ["trtllm-serve", "serve", model, "--host", "127.0.0.1", "--port", str(port), "--backend", "pytorch",
            "--tp_size", str(kw["tensor_parallel_size"]), "--log_level", "warning", "--extra_llm_api_options", str(extra)]
    return argv + ["--trust_remote_code"] * bool(spec.model.trust_remote_code), kw


def env_vars(spec: LoadSpec) -> dict[str, str]:
    """Environment the engine must see before `import tensorrt_llm`."""
    return {"FORCE_DETERMINISTIC": "1"} if TrtllmOptions(**spec.options).deterministic else {}


def sampling_kwargs(kind: Literal["timing", "score", "greedy"], n_tokens: int = 1,
                    ignore_eos: bool = True) -> dict[str, Any]:
    """SamplingParams fields. top_k=1 (top_p unset) is greedy decoding (SamplingParams._greedy_decoding)."""
    args: dict[str, Any] = {"max_tokens": n_tokens, "top_k": 1, "detokenize": False}
    if kind == "timing":
        args |= {"ignore_eos": ignore_eos, "return_perf_metrics": True}
    elif kind == "score":
        args |= {"max_tokens": 1, "return_context_logits": True}
    else:
        args |= {"ignore_eos": True, "return_generation_logits": True}
    return args


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def checkpoint_problem(spec: LoadSpec) -> str | None:
    """Why fp8/awq cannot come from this checkpoint (a local one without matching quantization)."""
    want = PREQUANTIZED.get(spec.quantization)
    src = Path(spec.model.source)
    if not want or not src.is_dir():
        return None  # a hub id is checked by TensorRT-LLM itself when it loads
    modelopt = _read_json(src / "hf_quant_config.json").get("quantization", {})
    qc = _read_json(src / "config.json").get("quantization_config") or {}
    algos = {str(modelopt.get("quant_algo", "")).upper(), str(qc.get("quant_algo", "")).upper()}
    method = str(qc.get("quant_method", "")).lower()
    if algos & want["algos"] or method in want["methods"]:
        return None
    return (f"TensorRT-LLM's PyTorch backend reads {spec.quantization} from a pre-quantized checkpoint "
            f"(quant_algo {'/'.join(sorted(want['algos']))} in hf_quant_config.json or quantization_config); "
            f"{spec.model.name} has none: quantize it with NVIDIA ModelOpt first")


def _vocab_size(source: str) -> int | None:
    config = _read_json(Path(source) / "config.json")
    return config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")


@register
class TrtllmAdapter(Adapter):
    name = "trtllm"
    load_fixed_s, cell_speed, packages = 120.0, 0.8, ("tensorrt-llm",)   # the scheduler's priors; the manifest
    Options = TrtllmOptions
    # `bench explain`'s suspects (TorchLlmArgs: kv_cache_config, cuda_graph_config, FORCE_DETERMINISTIC)
    numerics_flags = (
        NumericsFlag("kv_cache_dtype", {"kv_cache_dtype": "auto"}, "KvCacheConfig.dtype (fp8: a quantized KV cache)"),
        NumericsFlag("graphs", {"cuda_graphs": False, "cuda_graph_padding": False, "cuda_graph_batch_sizes": None},
                     "CUDA graphs (padded batches run other kernels) vs eager"),
        NumericsFlag("chunked_prefill", {"enable_chunked_prefill": False}, "prompts cut into chunks across steps"),
        NumericsFlag("kv_block_reuse", {"kv_block_reuse": False}, "KV blocks reused across requests"),
        NumericsFlag("deterministic", {"deterministic": True}, "FORCE_DETERMINISTIC: fixed reduction orders"),
        NumericsFlag("scheduler_batch", {"max_batch_size": None, "max_num_tokens": None}, "how many requests and tokens share a step"),
    )
    # no fp32: its PyTorch backend has no fp32 kernels (NVIDIA/TensorRT-LLM#5260)
    quantizations = ("fp16", "bf16", "fp8", "awq")
    needs_cuda = True
    install_hint = (f"python -m venv .venvs/trtllm && .venvs/trtllm/bin/pip install 'tensorrt_llm=={TRTLLM_VERSION}' "
                    "numpy pydantic psutil nvidia-ml-py (on a CUDA host with libopenmpi; the PyPI package fetches its "
                    "wheel from pypi.nvidia.com), or run the worker in NVIDIA's TensorRT-LLM release container "
                    "and point run.python.trtllm at its python")
    requires_modules = ("tensorrt_llm",)

    def check(self, spec: LoadSpec) -> str | None:
        if TrtllmOptions(**spec.options).backend == "tensorrt":
            return ("backend: tensorrt (prebuilt TensorRT engines, tensorrt_llm._tensorrt_engine.LLM) is not wired into "
                    "this adapter: its logits need build-time gather flags; use backend: pytorch")
        problem = checkpoint_problem(spec)
        if problem:
            return problem
        return no_cuda_reason("TensorRT-LLM")

    def load(self, spec: LoadSpec) -> LoadFacts:
        os.environ.update(env_vars(spec))  # read when tensorrt_llm is imported
        import tensorrt_llm
        import torch
        from tensorrt_llm import LLM, SamplingParams
        from tensorrt_llm.llmapi.llm_args import CudaGraphConfig, KvCacheConfig

        self.opts = TrtllmOptions(**spec.options)
        self.SamplingParams = SamplingParams
        kw = engine_kwargs(spec)
        built = dict(kw)
        built["kv_cache_config"] = KvCacheConfig(**kw["kv_cache_config"])
        if kw["cuda_graph_config"] is not None:
            built["cuda_graph_config"] = CudaGraphConfig(**kw["cuda_graph_config"])
        self.llm = LLM(**built)
        self.vocab = _vocab_size(spec.model.source)
        info = LoadFacts(
            versions={"tensorrt_llm": tensorrt_llm.__version__, "torch": torch.__version__,
                      "cuda": str(torch.version.cuda)},
            engine_args=kw | env_vars(spec),
            notes=[f"adapter written against tensorrt_llm {TRTLLM_VERSION} (PyTorch backend)",
                   "prompt logprobs: return_context_logits, log-softmax by lossless-bench (block reuse "
                   + ("on: not captured)" if self.opts.kv_block_reuse else "off)"),
                   "greedy logprobs: return_generation_logits, log-softmax by lossless-bench",
                   "timings: client-side over generate_async streaming; engine_ttft from request_perf_metrics"],
        )
        if torch.cuda.is_available():
            info.notes.append(f"gpu: {torch.cuda.get_device_name(0)}")
        if tensorrt_llm.__version__ != TRTLLM_VERSION:
            info.notes.append(f"installed tensorrt_llm {tensorrt_llm.__version__} differs from {TRTLLM_VERSION}")
        return info

    # -- serving: `trtllm-serve` ---------------------------------------------------------------
    # Read from tensorrt_llm/commands/serve.py and serve/openai_protocol.py (recent main, not the 1.2.1
    # tag; unverified on a GPU): token-id prompts are accepted; unknown request fields are rejected
    # (extra="forbid"), so only its own fields are sent; no prompt logprobs; top_logprobs are keyed by
    # tokenizer.decode([id]) strings; the LLM API arguments the CLI lacks go in --extra_llm_api_options.
    server_api = ServerApi(prompt_ids=True, ids_in_logprobs=False, prompt_logprobs=None, ignore_eos=True, batches=True,
                           stream_usage=True, health_path="/health",
                           greedy_fields={"top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0})

    def token_strings(self, spec: LoadSpec):
        return decoded_vocab(spec.model.source, spec.model.trust_remote_code)

    def server(self, spec: LoadSpec, port: int) -> ServerLaunch:
        import tensorrt_llm

        argv, extra = server_argv(spec, port)
        path = Path(argv[argv.index("--extra_llm_api_options") + 1])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(extra))   # JSON is YAML
        model = argv[2]
        return ServerLaunch(argv=argv, model_name=Path(model).name if Path(model).exists() else model,
                            env=env_vars(spec), engine_args={"server": "trtllm-serve", **extra},
                            versions={"tensorrt_llm": tensorrt_llm.__version__}, to_id=self.token_strings(spec),
                            notes=["trtllm-serve: logprobs keyed by token strings, mapped back through the tokenizer"])

    # -- helpers -----------------------------------------------------------------------------
    def _logits(self, t, rows: int) -> np.ndarray:
        return logits_rows(t, rows, self.vocab)

    @staticmethod
    def _engine_ttft(output) -> float | None:
        try:
            tm = output.outputs[0].request_perf_metrics.timing_metrics
            return (tm.first_token_time - tm.arrival_time).total_seconds()
        except AttributeError:
            return None

    # -- the interface -----------------------------------------------------------------------
    def generate(self, prompts, output_len, ignore_eos) -> TimedRun:
        output_len = one_length(output_len, "TensorRT-LLM (one sampling config per call here)")
        params = self.SamplingParams(**sampling_kwargs("timing", output_len, ignore_eos))
        last: list[Any] = [None] * len(prompts)
        start = time.perf_counter()
        requests = [RequestTiming(sent=start, prompt_tokens=len(p)) for p in prompts]

        async def one(i: int, ids: list[int]) -> None:
            seen, r = 0, requests[i]
            async for out in self.llm.generate_async(list(ids), sampling_params=params, streaming=True):
                now = time.perf_counter()      # the step's tokens reach this process
                n = len(out.outputs[0].token_ids)
                r.add_chunk(now, n - seen)
                seen, last[i] = max(seen, n), out
            r.output_tokens, r.end = seen, time.perf_counter()

        async def run_all() -> None:
            await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

        asyncio.run(run_all())
        end = time.perf_counter()
        for r, o in zip(requests, last):
            r.engine_ttft_s = self._engine_ttft(o) if o is not None else None
        return TimedRun(start=start, end=end, requests=requests)

    def score(self, prompts, top_k) -> list[TokenScores]:
        if self.opts.kv_block_reuse:
            raise Unsupported("TensorRT-LLM returns full context logits only with KV-cache block reuse off "
                              "(kv_block_reuse: false); this flag set turns it on")
        params = self.SamplingParams(**sampling_kwargs("score"))
        outs = self.llm.generate([list(p) for p in prompts], sampling_params=params, use_tqdm=False)
        scores = []
        for p, o in zip(prompts, outs):
            if o.context_logits is None or o.context_logits.shape[0] < len(p):
                raise RuntimeError(f"TensorRT-LLM returned context logits for "
                                   f"{None if o.context_logits is None else o.context_logits.shape[0]} of {len(p)} tokens")
            scores.append(topk_dense(log_softmax(self._logits(o.context_logits, len(p) - 1)), np.asarray(p[1:]), top_k))
        return scores

    def greedy(self, prompts, n_tokens, top_k) -> list[TokenScores]:
        params = self.SamplingParams(**sampling_kwargs("greedy", n_tokens))
        outs = self.llm.generate([list(p) for p in prompts], sampling_params=params, use_tqdm=False)
        scores = []
        for o in outs:
            c = o.outputs[0]
            ids = np.asarray(list(c.token_ids)[:n_tokens], dtype=np.int64)
            if c.generation_logits is None:
                raise RuntimeError("TensorRT-LLM returned no generation logits")
            scores.append(topk_dense(log_softmax(self._logits(c.generation_logits, len(ids))), ids, top_k))
        return scores

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.shutdown()


def decoded_vocab(source: str, trust_remote_code: bool = False) -> Callable[[str], int]:
    """Token string -> id for a server that keys logprobs by `tokenizer.decode([id])`; a string several
    ids decode to is ambiguous (-1)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    ids: dict[str, list[int]] = {}
    for i in range(len(tok)):
        ids.setdefault(tok.decode([i]), []).append(i)
    table = {s: (v[0] if len(v) == 1 else -1) for s, v in ids.items()}
    return lambda s: table.get(s, -1)
