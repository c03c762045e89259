"""LMDeploy through its `pipeline` API, on the TurboMind or the PyTorch engine. CUDA only.

Written against lmdeploy 0.16.0: tag v0.16.0 (commit 1208bf0) of InternLM/lmdeploy, the newest
release tag in the fetched snapshot, and the same files as the PyPI wheel lmdeploy==0.16.0. Read:
lmdeploy/api.py (pipeline), lmdeploy/pipeline.py (Pipeline, its event-loop thread),
lmdeploy/messages.py (TurbomindEngineConfig, PytorchEngineConfig, GenerationConfig,
SpeculativeConfig, QuantPolicy), lmdeploy/archs.py (autoget_backend_config),
lmdeploy/serve/core/async_engine.py (preprocess, generate, async_get_logits),
lmdeploy/turbomind/turbomind.py (output_logits), lmdeploy/pytorch/messages.py and
lmdeploy/pytorch/engine/logits_process.py (SamplingParam, logprobs_mode).

What that source says, and what this adapter does about it:
- `Pipeline.stream_infer` takes text or chat messages only (MultimodalProcessor.format_prompts); the
  benchmark's prompts are token ids, and decode + encode is not the identity. So each request takes
  the path stream_infer itself takes (Pipeline._infer): `AsyncEngine.preprocess(messages=None,
  input_ids=...)` then `AsyncEngine.generate(request, stream_response=True)`, as coroutines on the
  pipeline's own event-loop thread (`pipe.internal_thread.loop`, which the engine is bound to).
  Responses carry no timing fields, so every streamed chunk is timestamped client-side, on that
  loop, as it arrives: TTFT = the first chunk with tokens, then one time per new token.
- Teacher-forced scores: `AsyncEngine.async_get_logits(input_ids)` (output_logits='all'), raw logits,
  log-softmax here. lmdeploy refuses all-token logits with prefix caching on (AsyncEngine.preprocess),
  so with enable_prefix_caching the scores are `Unsupported`.
- Greedy logprobs, TurboMind: GenerationConfig(output_logits='generation'), raw logits, log-softmax
  here. Its own `logprobs` are taken after top-k (degenerate under greedy, all 0) and are not used.
- Greedy logprobs, PyTorch engine: it refuses output_logits unless max_new_tokens == 0
  (SamplingParam.from_gen_config), so the engine is built with logprobs_mode='raw_logprobs': the
  log-softmax of the raw logits, taken in FusedLogitsProcessor before penalties, temperature, bad
  words and top-k; GenerationConfig(logprobs=k) returns the top k of it per step.
- ignore_eos in the PyTorch engine turns the stop ids into bad words (masked): where EOS is the
  argmax, its greedy step picks the runner-up, where transformers (eos_token_id=None) keeps EOS.
- A TurbomindEngineConfig for a model TurboMind cannot run silently becomes the PyTorch engine
  (archs.autoget_backend_config); the adapter checks which engine it got and says so.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any, Literal

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
from adapters.contract.records import TokenScores, topk_dense, topk_sparse
from adapters.contract.specs import LoadSpec
from adapters.contract.timing import RequestTiming, TimedRun

LMDEPLOY_VERSION = "0.16.0"

# TurbomindEngineConfig and PytorchEngineConfig both assert dtype in ('auto', 'float16', 'bfloat16'):
# lmdeploy has no fp32 path ('auto' runs an fp32 checkpoint in fp16), so fp32 is not offered.
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
# model_format per engine (messages.py docstrings): TurboMind loads pre-quantized awq / gptq / blocked
# fp8 checkpoints; the PyTorch engine reads awq/gptq from the checkpoint's quantization_config, and
# model_format='fp8' quantizes an unquantized checkpoint to blocked fp8 on load (sm >= 9.0).
MODEL_FORMATS = {"turbomind": {"awq": "awq", "gptq": "gptq", "fp8": "fp8"},
                 "pytorch": {"fp8": "fp8"}}
# Quantizations that must come from a pre-quantized checkpoint: the quantization_config.quant_method
# a local checkpoint must declare.
PREQUANTIZED = {"turbomind": {"awq": {"awq"}, "gptq": {"gptq"}, "fp8": {"fp8"}},
                "pytorch": {"awq": {"awq"}, "gptq": {"gptq"}}}
SPECULATIVE_METHODS = ("eagle", "eagle3", "deepseek_mtp", "hy3_mtp", "qwen3_5_mtp")  # cli/utils.py choices


class LmdeployOptions(EngineOptions):
    backend: Literal["turbomind", "pytorch"] = "turbomind"
    tensor_parallel_size: int = Field(1, ge=1, description="-> tp (the launcher reserves this many GPUs)")
    enable_prefix_caching: bool = False
    cache_max_entry_count: float = Field(0.8, gt=0, lt=1, description="Share of free GPU memory for the KV cache")
    quant_policy: Literal[0, 4, 8, 16, 17] = Field(0, description="KV cache quantization: 0 none, 4 int4, 8 int8; "
                                                   "16/17 fp8 (PyTorch engine only)")
    eager_mode: bool = Field(False, description="PyTorch engine: no CUDA graphs")
    max_batch_size: int | None = Field(None, ge=1)
    session_len: int | None = Field(None, ge=1)
    max_prefill_token_num: int | None = Field(None, ge=1)
    speculative_method: Literal["eagle", "eagle3", "deepseek_mtp", "hy3_mtp", "qwen3_5_mtp"] | None = None
    speculative_model: str | None = Field(None, description="Draft model path (eagle, eagle3)")
    num_speculative_tokens: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _engine_rules(self) -> "LmdeployOptions":
        if self.backend == "turbomind":
            if self.eager_mode:
                raise ValueError("eager_mode is a PyTorch-engine option (backend: pytorch)")
            if self.speculative_method:
                raise ValueError("speculative decoding runs on the PyTorch engine only (backend: pytorch)")
            if self.quant_policy in (16, 17):
                raise ValueError("TurboMind has no fp8 KV cache (quant_policy 0, 4 or 8)")
        if self.speculative_method in ("eagle", "eagle3") and not self.speculative_model:
            raise ValueError(f"speculative_method {self.speculative_method} needs speculative_model (the draft model)")
        return self


def engine_kwargs(spec: LoadSpec) -> dict[str, Any]:
    """Matrix options -> lmdeploy arguments, without importing lmdeploy.

    Returns {"backend", "model_path", "backend_config" (TurbomindEngineConfig or PytorchEngineConfig
    fields), "pipeline" (extra `pipeline()` keywords), "speculative_config" (SpeculativeConfig fields or
    None)}.
    """
    opts = LmdeployOptions(**spec.options)
    q = spec.quantization
    cfg: dict[str, Any] = {
        "dtype": DTYPES.get(q, "auto"),
        "tp": opts.tensor_parallel_size,
        "cache_max_entry_count": opts.cache_max_entry_count,
        "enable_prefix_caching": opts.enable_prefix_caching,
        "quant_policy": opts.quant_policy,
    }
    fmt = MODEL_FORMATS[opts.backend].get(q)
    if fmt:
        cfg["model_format"] = fmt
    for name in ("max_batch_size", "session_len", "max_prefill_token_num"):
        if getattr(opts, name) is not None:
            cfg[name] = getattr(opts, name)
    if spec.model.revision:
        cfg["revision"] = spec.model.revision
    if opts.backend == "pytorch":
        cfg["eager_mode"] = opts.eager_mode
        cfg["logprobs_mode"] = "raw_logprobs"  # greedy logprobs: log-softmax of the raw logits
    speculative = None
    if opts.speculative_method:
        speculative = {"method": opts.speculative_method, "num_speculative_tokens": opts.num_speculative_tokens}
        if opts.speculative_model:
            speculative["model"] = opts.speculative_model
    return {"backend": opts.backend, "model_path": spec.model.source, "backend_config": cfg,
            "pipeline": {"trust_remote_code": spec.model.trust_remote_code, "log_level": "WARNING"},
            "speculative_config": speculative}


def server_argv(spec: LoadSpec, port: int) -> list[str]:
    """`lmdeploy serve api_server` for this group (flags of lmdeploy 0.16.0's cli/serve.py), without importing it."""
    kw = engine_kwargs(spec)
    if kw["speculative_config"]:
        raise Unsupported("lmdeploy serve: speculative decoding is wired for the offline pipeline only")
    cfg = kw["backend_config"]
    argv = ["lmdeploy", "serve", "api_server", kw["model_path"], "--server-name", "127.0.0.1",
            "--server-port", str(port), "--backend", kw["backend"], "--model-name", spec.model.name,
            "--tp", str(cfg["tp"]), "--dtype", cfg["dtype"], "--cache-max-entry-count", str(cfg["cache_max_entry_count"]),
            "--quant-policy", str(cfg["quant_policy"]), "--generation-config", "lmdeploy", "--log-level", "WARNING"]
    flags = {"model_format": "--model-format", "session_len": "--session-len", "max_batch_size": "--max-batch-size",
             "max_prefill_token_num": "--max-prefill-token-num", "logprobs_mode": "--logprobs-mode",
             "revision": "--revision"}
    argv += [x for key, flag in flags.items() if key in cfg for x in (flag, str(cfg[key]))]
    switches = {"--enable-prefix-caching": cfg["enable_prefix_caching"], "--eager-mode": cfg.get("eager_mode"),
                "--trust-remote-code": spec.model.trust_remote_code}
    return argv + [flag for flag, on in switches.items() if on]


def generation_kwargs(kind: Literal["timing", "greedy"], n_tokens: int, ignore_eos: bool, backend: str,
                      top_k: int = 1) -> dict[str, Any]:
    """GenerationConfig fields for a timed batch or a greedy capture. do_sample=False makes
    AsyncEngine._determine_gen_config set top_k=1, temperature=1 and repetition_penalty=1."""
    args: dict[str, Any] = {"max_new_tokens": n_tokens, "do_sample": False, "ignore_eos": ignore_eos}
    if kind == "greedy":
        args["ignore_eos"] = True
        if backend == "turbomind":
            args["output_logits"] = "generation"
        else:
            args["logprobs"] = top_k
    return args


def _checkpoint_quant_method(source: str) -> str | None:
    try:
        config = json.loads((Path(source) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    qc = config.get("quantization_config") or {}
    return str(qc.get("quant_method", "")).lower() or None


def checkpoint_problem(spec: LoadSpec) -> str | None:
    """Why a pre-quantized level cannot come from this checkpoint (a local one that declares none)."""
    backend = LmdeployOptions(**spec.options).backend
    want = PREQUANTIZED[backend].get(spec.quantization)
    if not want or not Path(spec.model.source).is_dir():
        return None  # a hub id is checked by lmdeploy itself when it loads
    have = _checkpoint_quant_method(spec.model.source)
    if have in want:
        return None
    return (f"lmdeploy ({backend}) runs {spec.quantization} from a pre-quantized checkpoint "
            f"(quantization_config.quant_method {'/'.join(sorted(want))}); {spec.model.name} declares "
            f"{have or 'no quantization'}: point the model at an {spec.quantization} checkpoint "
            f"(e.g. made with `lmdeploy lite auto_awq`)")


@register
class LmdeployAdapter(Adapter):
    name = "lmdeploy"
    load_fixed_s, cell_speed, packages = 30.0, 1.0, ("lmdeploy",)   # the scheduler's priors; the manifest
    Options = LmdeployOptions
    # `bench explain`'s suspects (TurbomindEngineConfig / PytorchEngineConfig). eager_mode exists on the PyTorch
    # engine only: for a TurboMind cell the move is not a valid configuration, and the search says so.
    numerics_flags = (
        NumericsFlag("kv_cache_quant", {"quant_policy": 0}, "quant_policy: an int4/int8/fp8 KV cache"),
        NumericsFlag("graphs", {"eager_mode": True}, "CUDA graphs vs eager (PyTorch engine)"),
        NumericsFlag("prefix_cache", {"enable_prefix_caching": False}, "KV reused from other requests' prefixes"),
        NumericsFlag("speculative", {"speculative_method": None, "speculative_model": None}, "speculative decoding"),
        NumericsFlag("scheduler_batch", {"max_batch_size": None, "max_prefill_token_num": None},
                     "how many requests and prompt tokens share a step"),
    )
    quantizations = ("fp16", "bf16", "fp8", "awq", "gptq")
    needs_cuda = True
    install_hint = (f"python -m venv .venvs/lmdeploy && .venvs/lmdeploy/bin/pip install 'lmdeploy=={LMDEPLOY_VERSION}' "
                    "numpy pydantic psutil nvidia-ml-py (on a CUDA host; the wheel brings its CUDA torch)")
    requires_modules = ("lmdeploy",)

    def check(self, spec: LoadSpec) -> str | None:
        problem = checkpoint_problem(spec)
        if problem:
            return problem
        return no_cuda_reason("lmdeploy")

    # -- serving: `lmdeploy serve api_server` ---------------------------------------------------
    # Read from lmdeploy 0.16.0 (cli/serve.py, serve/openai/protocol.py, endpoints/completions.py;
    # unverified on a GPU): text prompts only; /v1/completions returns no logprobs in 0.16 (so served
    # outputs are not captured: timings only); ignore_eos is honoured; `--generation-config lmdeploy`
    # keeps the model's generation_config.json from setting sampling defaults.
    server_api = ServerApi(prompt_ids=False, ids_in_logprobs=False, prompt_logprobs=None, ignore_eos=True, batches=True,
                           logprobs=False, health_path="/health",
                           greedy_fields={"top_k": 1, "top_p": 1.0, "repetition_penalty": 1.0})

    def server(self, spec: LoadSpec, port: int) -> ServerLaunch:
        import lmdeploy

        return ServerLaunch(argv=server_argv(spec, port), model_name=spec.model.name,
                            engine_args={"server": "lmdeploy serve api_server", **engine_kwargs(spec)},
                            env={"UVICORN_LOG_LEVEL": "warning"}, versions={"lmdeploy": lmdeploy.__version__},
                            notes=["lmdeploy 0.16's /v1/completions returns no logprobs: served outputs not captured"])

    def load(self, spec: LoadSpec) -> LoadFacts:
        import lmdeploy
        import torch
        from lmdeploy import GenerationConfig, PytorchEngineConfig, TurbomindEngineConfig, pipeline
        from lmdeploy.messages import SpeculativeConfig

        kw = engine_kwargs(spec)
        self.opts = LmdeployOptions(**spec.options)
        self.backend = kw["backend"]
        self.GenerationConfig = GenerationConfig
        config_cls = TurbomindEngineConfig if self.backend == "turbomind" else PytorchEngineConfig
        backend_config = config_cls(**kw["backend_config"])
        speculative = SpeculativeConfig(**kw["speculative_config"]) if kw["speculative_config"] else None
        self.pipe = pipeline(kw["model_path"], backend_config=backend_config, speculative_config=speculative,
                             **kw["pipeline"])
        self.engine = self.pipe.async_engine
        self.loop = self.pipe.internal_thread.loop
        if self.engine.backend != self.backend:
            got = self.engine.backend
            self.close()
            raise Unsupported(f"lmdeploy {lmdeploy.__version__}: TurboMind does not support {spec.model.name} "
                              f"(lmdeploy fell back to its {got} engine); use backend: pytorch")
        hf_cfg = getattr(self.engine, "hf_cfg", None)
        self.vocab = getattr(hf_cfg, "vocab_size", None) or getattr(getattr(hf_cfg, "text_config", None),
                                                                    "vocab_size", None)
        effective = getattr(self.engine, "backend_config", backend_config)
        engine_args = {"backend": self.backend}
        for key in kw["backend_config"]:
            value = getattr(effective, key, kw["backend_config"][key])
            engine_args[key] = value if isinstance(value, (bool, int, float, str, type(None))) else str(value)
        if speculative:
            engine_args["speculative_config"] = kw["speculative_config"]
        info = LoadFacts(
            versions={"lmdeploy": lmdeploy.__version__, "torch": torch.__version__, "cuda": str(torch.version.cuda)},
            engine_args=engine_args,
            notes=[f"adapter written against lmdeploy {LMDEPLOY_VERSION}",
                   "prompt logprobs: async_get_logits raw logits, log-softmax by lossless-bench",
                   "greedy logprobs: " + ("output_logits='generation', log-softmax by lossless-bench"
                                          if self.backend == "turbomind" else
                                          "engine logprobs_mode='raw_logprobs' (pre-processing log-softmax), top-k"),
                   "timings: client-side over the streamed chunks (lmdeploy reports no per-request times)"],
        )
        if torch.cuda.is_available():
            info.notes.append(f"gpu: {torch.cuda.get_device_name(0)}")
        if lmdeploy.__version__ != LMDEPLOY_VERSION:
            info.notes.append(f"installed lmdeploy {lmdeploy.__version__} differs from {LMDEPLOY_VERSION}")
        return info

    # -- helpers -----------------------------------------------------------------------------
    def _run(self, coro):
        """Run a coroutine on the pipeline's event-loop thread (the engine is bound to that loop)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def _logits(self, t, rows: int) -> np.ndarray:
        return logits_rows(t, rows, self.vocab)

    def _stream(self, prompts: list[list[int]], gen_config, stream: bool) -> tuple[list[RequestTiming], list[dict]]:
        """Send every prompt at once; per prompt its timing (a chunk per streamed step that brought tokens,
        stamped when it reaches this process) and its outputs (generated ids, last logits, logprobs)."""
        engine = self.engine
        start = time.perf_counter()
        timings = [RequestTiming(sent=start, prompt_tokens=len(p)) for p in prompts]
        results: list[dict] = [{"ids": [], "logits": None, "logprobs": []} for _ in prompts]

        async def one(i: int, ids: list[int]) -> None:
            r, t = results[i], timings[i]
            request = await engine.preprocess(messages=None, session_id=engine.session_mgr.get(),
                                              input_ids=list(ids), gen_config=gen_config)
            async for out in engine.generate(request, stream_response=stream):
                now = time.perf_counter()
                if out.finish_reason in ("error", "abort"):
                    raise RuntimeError(f"lmdeploy request ended with finish_reason={out.finish_reason}")
                t.add_chunk(now, out.generate_token_len - t.output_tokens)
                t.output_tokens = max(t.output_tokens, out.generate_token_len)
                r["ids"].extend(out.token_ids or [])
                if out.logits is not None:
                    r["logits"] = out.logits  # TurboMind: all generation rows so far
                if out.logprobs:
                    r["logprobs"].extend(out.logprobs)  # PyTorch engine: this chunk's steps
            t.end = time.perf_counter()

        async def run_all() -> None:
            await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

        self._run(run_all())
        return timings, results

    # -- the interface -----------------------------------------------------------------------
    def generate(self, prompts, output_len, ignore_eos) -> TimedRun:
        output_len = one_length(output_len, "LMDeploy (one sampling config per call here)")
        gen_config = self.GenerationConfig(**generation_kwargs("timing", output_len, ignore_eos, self.backend))
        start = time.perf_counter()
        timings, _ = self._stream(prompts, gen_config, stream=True)
        return TimedRun(start=start, end=time.perf_counter(), requests=timings,
                        missing={"engine_ttft_ms": "LMDeploy's Response carries no timing fields"})

    def score(self, prompts, top_k) -> list[TokenScores]:
        if self.opts.enable_prefix_caching:
            raise Unsupported("lmdeploy returns no all-token logits with prefix caching on "
                              "(AsyncEngine.preprocess), so teacher-forced scores cannot be captured")
        logits = self._run(self.engine.async_get_logits(input_ids=[list(p) for p in prompts]))
        return [topk_dense(log_softmax(self._logits(lg, len(p) - 1)), np.asarray(p[1:]), top_k)
                for p, lg in zip(prompts, logits)]

    def greedy(self, prompts, n_tokens, top_k) -> list[TokenScores]:
        gen_config = self.GenerationConfig(**generation_kwargs("greedy", n_tokens, True, self.backend, top_k))
        _, results = self._stream(prompts, gen_config, stream=False)
        out = []
        for r in results:
            ids = np.asarray(r["ids"][:n_tokens], dtype=np.int64)
            if self.backend == "turbomind":
                if r["logits"] is None:
                    raise RuntimeError("lmdeploy returned no generation logits")
                out.append(topk_dense(log_softmax(self._logits(r["logits"], len(ids))), ids, top_k))
            else:
                out.append(_scores_from_steps(r["logprobs"][: len(ids)], ids, top_k))
        return out

    def close(self) -> None:
        pipe, self.pipe = getattr(self, "pipe", None), None
        if pipe is not None:
            pipe.close()


def _scores_from_steps(steps: list[dict[int, float]], ids: np.ndarray, k: int) -> TokenScores:
    """TokenScores from per-step {token id: logprob} (the sampled token plus the engine's top k), under
    the one top-k rule (adapters.contract.records.topk_sparse)."""
    if len(steps) != len(ids):
        raise RuntimeError(f"lmdeploy returned logprobs for {len(steps)} of {len(ids)} greedy steps")
    rows = []
    for step, tok in zip(steps, ids):
        pairs = [(int(t), float(v)) for t, v in step.items()]
        rows.append((int(tok), dict(pairs).get(int(tok)), pairs))
    return topk_sparse(rows, k)
