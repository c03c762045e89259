"""llama.cpp through llama-cpp-python 0.3.36: GGUF conversion, a quantization ladder, and honest batching.

Model files: an HF checkpoint is converted to GGUF by llama.cpp's own converter (`adapters.engines.llamacpp.gguf_convert`:
f32/f16/bf16, cached by content hash) and quantized from the F32 GGUF by llama.cpp's own `llama_model_quantize` (q8_0 ... q4_0).
A `.gguf` model file runs as it is: quantization `gguf`, or the level matching its file type.

Batching: the default path drives llama.cpp's low-level C API. A batch of B prompts is B sequences
(seq_id 0..B-1) in one context with n_seq_max >= B; the prompts are prefilled together and every
decode step is one `llama_decode` carrying one token per live sequence. Greedy sampling is an argmax
of each sequence's raw logits in numpy (the benchmark ignores EOS, so no sampler chain is needed);
seeded sampling (`sample`) runs llama.cpp's own sampler, one llama_sampler chain per sequence with its
own seed, in the same kind of batched loop.
Prompt-lookup speculative decoding goes through llama-cpp-python's high-level `Llama.generate` with
`LlamaPromptLookupDecoding`, which runs one sequence at a time: that mode reports batch_mode
"sequential" and runs the prompts of a batch one after another. llama-cpp-python counts no drafts, so
the draft model is wrapped to count them (`spec_counters`).

Logprobs are computed by us from raw logits (base.log_softmax in float64), never by the engine.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import logging
import os
import sys
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from adapters.base import Adapter, EngineOptions, NumericsFlag, SeedPromise, Unsupported, log_softmax, normalize_quantization, register
from adapters.contract.events import LoadFacts
from adapters.contract.openai_api import ServerApi, ServerLaunch
from adapters.contract.records import TokenScores, topk_dense
from adapters.contract.specs import LoadSpec, ModelFacts, SamplerSettings
from adapters.contract.timing import TimedRun, per_token_run
from adapters.engines.llamacpp.gguf_convert import captured_llama_logs
from adapters.engines.llamacpp.batched import BatchedDecoding
from adapters.engines.llamacpp.native import (
    CTX_ROUND,
    KV_TYPES,
    Batch,
    VocabMap,
    check_seed,
    flash_attn_mode,
    gelu_deviation,
    last_error,
    tensor_types,
)
from adapters.engines.llamacpp.sequential import PromptLookupDecoding

KvCacheType = Literal["f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl"]


class Options(EngineOptions):
    n_threads: int | None = Field(None, ge=1, description="Threads for prompt and generation; default: the CPUs this process may use")
    n_batch: int = Field(2048, ge=1, description="Logical batch: most tokens per llama_decode call (larger batches are split)")
    n_ubatch: int = Field(512, ge=1, description="Physical micro-batch size")
    flash_attn: Literal["auto", "on", "off"] | bool = Field("auto", description="llama.cpp's flash attention: auto (its default), on, off")
    n_gpu_layers: int | None = Field(None, ge=-1, description="Layers offloaded to the GPU; -1 all; default: all on cuda, 0 on cpu")
    # The KV cache and flash attention matter for "did the outputs change": on the tiny model, llama.cpp's
    # defaults (f16 KV cache, flash attention auto -> on, whose CPU kernel works in f16) move the f32
    # model's logprobs by ~3e-3 against transformers; type_k/type_v f32 with flash_attn off match to ~1e-5.
    # The defaults stay llama.cpp's, so a matrix measures what users get; the flags measure the rest.
    type_k: KvCacheType | None = Field(None, description="K cache type (llama.cpp default f16)")
    type_v: KvCacheType | None = Field(None, description="V cache type (llama.cpp default f16); quantized V needs flash attention")
    # llama.cpp's default is True: weights are repacked into the CPU's "extra" buffer types (CPU_REPACK,
    # AMX) for faster kernels. Off by default here because (1) on AVX-512/AMX hosts quantized models
    # segfaulted at the first eval with it on (llama.cpp's AMX mul_mat, cf. ggml-org/llama.cpp#20824),
    # and a benchmark default must run everywhere, and (2) repacked Q4_0/Q4_K kernels change the logits
    # (measured up to 0.06 abs on an AVX2 host), so it is a flag to measure, for speed and for outputs.
    use_extra_bufts: bool = Field(False, description="Repack weights into the CPU's extra buffer types (llama.cpp default: true)")
    kv_unified: bool = Field(False, description="One KV buffer shared by all sequences (llama.cpp default: false)")
    prompt_lookup: bool = Field(False, description="Speculative decoding by prompt lookup (llama-cpp-python's LlamaPromptLookupDecoding); sequential")
    num_pred_tokens: int = Field(10, ge=1, description="Prompt lookup: draft tokens proposed per step")
    max_ngram_size: int = Field(2, ge=1, description="Prompt lookup: longest n-gram matched")
    n_ctx: int = Field(0, ge=0, description="Context tokens per sequence; 0 sizes it from the requests")
    keep_kv_between_runs: bool = Field(False, description="Keep the KV cache between calls, so a repeated prompt prefix is reused")
    tensor_types: dict[str, str] = Field(default_factory=dict, description=(
        "Per-tensor types over the quantization level: regex on tensor names -> ggml type (f32, q8_0, q4_0, ...), "
        "the first match wins; llama.cpp's tt_overrides (tensor_mix.py)"))
    imatrix: str | None = Field(None, description=(
        "An importance matrix file (.npz, imatrix.py; `bench explain --recipe --imatrix` writes one from the run's "
        "scoring prompts) given to llama.cpp's quantizer for this cell's quantized level (tensor_mix.py)"))

    @field_validator("tensor_types")
    @classmethod
    def _tensor_types(cls, v: dict[str, str]) -> dict[str, str]:
        from adapters.engines.llamacpp.tensor_mix import check_tensor_types

        check_tensor_types(v)
        return v


@register
class LlamacppAdapter(BatchedDecoding, PromptLookupDecoding, Adapter):
    name = "llamacpp"
    Options = Options
    quantizations = ("fp32", "fp16", "bf16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0", "gguf")
    install_hint = ("pip install -e '.[llamacpp]'  (llama-cpp-python==0.3.36 builds from source, about 5 minutes "
                    "on 2 cores; add CMAKE_ARGS=-DGGML_CUDA=on for a GPU build)")
    requires_modules = ("llama_cpp", "gguf")
    sampler_order = ("top_k", "top_p", "min_p", "temperature")     # its chain (_sampler_chain; llama_cpp.server's too)
    load_fixed_s, cell_speed, packages = 20.0, 2.0, ("llama-cpp-python",)   # the scheduler's priors; the manifest
    convert_s_per_gb = 2.0                                                 # HF -> GGUF, where the matrix gives no GGUF
    seed_promises = (SeedPromise("llama_cpp_python", ">=0.3", same_batch=True, across_batch=False,
                                 source="llama.cpp seeds each sequence's dist sampler (llama_sampler_init_dist(seed)); "
                                 "it makes no batch-invariance claim"),)
    # `bench explain`'s suspects: the KV cache types first (f16 by default: ~3e-3 off an f32 reference on the tiny model)
    numerics_flags = (
        NumericsFlag("kv_cache_types", {"type_k": "f32", "type_v": "f32"}, "the KV cache's K and V types (default f16)"),
        NumericsFlag("flash_attn", {"flash_attn": "off"}, "flash attention (auto: on where supported; its CPU kernel works in f16)"),
        NumericsFlag("batch_split", {"n_batch": 2048, "n_ubatch": 512}, "how prompts are cut into llama_decode calls and micro-batches"),
        NumericsFlag("threads", {"n_threads": None}, "threads: how each matmul's rows are split"),
        NumericsFlag("weight_repacking", {"use_extra_bufts": False}, "weights repacked for the CPU's extra kernels (AMX, CPU_REPACK)"),
    )

    def __init__(self) -> None:
        self._L = None
        self._model = None
        self._ctx = None
        self._llm = None            # prompt-lookup mode: llama_cpp.Llama
        self._batch: Batch | None = None
        self._ctx_seqs = 0
        self._ctx_len = 0           # tokens per sequence the context holds
        self._cached: dict[int, list[int]] = {}   # tokens in the KV cache per sequence
        self.info: LoadFacts | None = None
        self.last_perf: dict[str, float] = {}
        self._logits_key: tuple[int, int] | None = None
        self._logits_view: np.ndarray | None = None
        self._drafter = None        # prompt-lookup mode: the counting LlamaPromptLookupDecoding
        self._spec = [0, 0]         # prompt-lookup mode: draft tokens proposed, accepted (since load)

    # ------------------------------------------------------------------------------------------
    @classmethod
    def model_problem(cls, model: ModelFacts, quantization: str, options, device: str) -> str | None:
        """Before any engine starts: a hub id (there is no local checkpoint to convert), `gguf` on a checkpoint,
        an architecture llama.cpp's converter lacks, the converter not unpacked, a checkpoint property the converter
        cannot write (gguf_convert.preflight)."""
        from adapters.engines.llamacpp import gguf_convert

        if model.kind == "hub":
            return (f"llamacpp runs local GGUF files or converts local HF checkpoints; {model.source} is a hub id "
                    "(download it, e.g. `hf download`, and give the folder as the model's source)")
        if model.kind != "dir" or model.config is None:
            return None
        named = [k for k in ("tensor_types", "imatrix") if dict(options or {}).get(k)]
        if named and normalize_quantization(quantization) not in gguf_convert.QUANT_LEVELS:
            return (f"{' and '.join(named)} needs a quantized level ({', '.join(gguf_convert.QUANT_LEVELS)}): llama.cpp's "
                    f"quantizer reads them only when the file type is quantized; this cell is {quantization}")
        if normalize_quantization(quantization) == "gguf":
            return ("quantization 'gguf' means a given .gguf file used as it is; "
                    f"{model.source} is an HF checkpoint (use fp32/fp16/bf16 or a quantized level)")
        try:
            arch = gguf_convert.architecture_of(model.config, gguf_convert.converter_dir())
            gguf_convert.preflight(Path(model.source), model.config, arch)
        except ImportError:      # no llama-cpp-python beside the driver: the group's own environment checks
            return None
        except (Unsupported, FileNotFoundError) as err:
            return str(err)
        return None

    def check(self, spec: LoadSpec) -> str | None:
        try:
            import llama_cpp
        except ImportError:
            return f"llama-cpp-python is not installed; install it with: {self.install_hint}"
        quant = normalize_quantization(spec.quantization)
        if quant not in self.quantizations:
            return f"llamacpp does not run quantization {quant} (runs: {', '.join(self.quantizations)})"
        if not str(spec.model.source).endswith(".gguf"):
            try:
                import gguf  # noqa: F401
            except ImportError:
                return f"the gguf package (HF->GGUF conversion) is not installed; install it with: {self.install_hint}"
        opts = self.Options(**(spec.options or {}))
        wants_gpu = opts.n_gpu_layers not in (None, 0) or (opts.n_gpu_layers is None and spec.device == "cuda")
        if wants_gpu and not llama_cpp.llama_supports_gpu_offload():
            return ("this llama-cpp-python build has no GPU offload (a CPU build); rebuild it with "
                    "CMAKE_ARGS=-DGGML_CUDA=on pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36")
        if opts.type_v not in (None, "f32", "f16", "bf16") and flash_attn_mode(opts.flash_attn) == "off":
            return f"a quantized V cache (type_v={opts.type_v}) needs flash_attn on or auto in llama.cpp"
        return None

    def load(self, spec: LoadSpec) -> LoadFacts:
        import llama_cpp

        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # llama.cpp's load chatter off stderr
        self._L = llama_cpp
        self.spec = spec
        self.opts = opts = self.Options(**(spec.options or {}))
        quant = normalize_quantization(spec.quantization)
        path, facts = self._model_file(spec)
        self.gguf_path = str(path)

        self.n_threads = opts.n_threads or len(os.sched_getaffinity(0))
        self.n_gpu_layers = opts.n_gpu_layers if opts.n_gpu_layers is not None else (-1 if spec.device == "cuda" else 0)
        self.flash_attn = flash_attn_mode(opts.flash_attn)

        notes: list[str] = list(facts.pop("conversion_notes", []))
        types = tensor_types(path)
        if quant in ("q6_k", "q5_k_m", "q4_k_m") and not any(t.endswith("_K") for t in types):
            notes.append(f"{quant}: no tensor got a K-quant type (llama.cpp needs rows that are multiples of 256 "
                         f"and fell back to {', '.join(sorted(t for t in types if t not in ('F32',)))})")
        llama_cpp.llama_backend_init()
        logs: list[str] = []
        if opts.prompt_lookup:
            batch_mode = "sequential"
            notes.append("prompt_lookup: llama-cpp-python's Llama.generate speculates one sequence at a time, "
                         "so the prompts of a batch run one after another")
            self._ensure_llama(256, logs)
        else:
            batch_mode = "batched"
            mparams = llama_cpp.llama_model_default_params()
            mparams.n_gpu_layers = self.n_gpu_layers
            mparams.use_extra_bufts = opts.use_extra_bufts
            with captured_llama_logs(logs):
                self._model = llama_cpp.llama_model_load_from_file(self.gguf_path.encode(), mparams)
            if not self._model:
                raise RuntimeError(f"llama.cpp could not load {self.gguf_path}: {last_error(logs)}")
            self._vocab = llama_cpp.llama_model_get_vocab(self._model)
            self._n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
            # llama_get_logits returning the address as an int: the per-step check in _logits
            self._logits_addr = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(
                ctypes.cast(llama_cpp.llama_get_logits, ctypes.c_void_p).value)
            self._ensure_context(1, 256, logs)

        versions = {"llama_cpp_python": llama_cpp.__version__}
        if facts.get("converter_version"):   # llama.cpp's own converter, from this version's source distribution
            versions["gguf_converter"] = facts["converter_version"]
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions["gguf"] = importlib.metadata.version("gguf")
        engine_args: dict[str, Any] = {
            **opts.model_dump(),
            "n_threads": self.n_threads,
            "n_gpu_layers": self.n_gpu_layers,
            "flash_attn": self.flash_attn,
            "gguf_path": self.gguf_path,
            "gguf_file_size_bytes": path.stat().st_size,
            "gguf_tensor_types": types,
            **facts,
        }
        self.info = LoadFacts(versions=versions, engine_args=engine_args, batch_mode=batch_mode, notes=notes,
                              engine_deviation=gelu_deviation(path) if self.n_gpu_layers == 0 else None)
        self.info.notes.append("llama.cpp system info: " + llama_cpp.llama_print_system_info().decode().strip())
        self._record_context(logs)
        return self.info

    @staticmethod
    def tensor_groups(source: str, quantization: str, cache_dir: str | None = None) -> list[dict[str, Any]]:
        """The quantized weight groups of this checkpoint's GGUF at `quantization` (made and cached if missing),
        each with the regex and the type it has there: what `bench explain --sensitivity` quantizes one at a time."""
        from adapters.engines.llamacpp import gguf_convert
        from adapters.engines.llamacpp.tensor_mix import tensor_groups

        return tensor_groups(gguf_convert.gguf_for(source, normalize_quantization(quantization), cache_dir)[0])

    @staticmethod
    def group_tensor_types(groups: list[dict[str, Any]]) -> dict[str, str]:
        """The `tensor_types` that quantize `groups` (each at its type there) and keep every other weight F32."""
        from adapters.engines.llamacpp.tensor_mix import group_tensor_types

        return group_tensor_types(groups)

    @staticmethod
    def importance_matrix(source: str, prompts: list[list[int]], out: str, cache_dir: str | None = None) -> dict[str, Any]:
        """An imatrix (imatrix.py) from `prompts` (token ids) run through this checkpoint's F32 GGUF, written to
        `out` (the `imatrix` option names it); its facts (architecture, prompts, positions, weights, digest)."""
        from adapters.engines.llamacpp.gguf_convert import converted_gguf
        from adapters.engines.llamacpp.imatrix import compute_imatrix, write_imatrix

        f32, _ = converted_gguf(source, "f32", cache_dir)
        data, facts = compute_imatrix(f32, prompts)
        write_imatrix(out, data, facts)
        return facts

    @staticmethod
    def _model_file(spec: LoadSpec):
        """The GGUF this group runs (converted and quantized on first use, cached) and the conversion facts."""
        from adapters.engines.llamacpp import gguf_convert

        quant = normalize_quantization(spec.quantization)
        if quant not in LlamacppAdapter.quantizations:
            raise Unsupported(f"llamacpp does not run quantization {quant} (runs: {', '.join(LlamacppAdapter.quantizations)})")
        # a builtin: model arrives here already built (the driver resolves it)
        tensor_types, imatrix = (spec.options or {}).get("tensor_types"), (spec.options or {}).get("imatrix")
        if tensor_types or imatrix:
            from adapters.engines.llamacpp.tensor_mix import mixed_gguf

            return mixed_gguf(str(spec.model.source), quant, dict(tensor_types or {}), spec.cache_dir or None, imatrix)
        return gguf_convert.gguf_for(str(spec.model.source), quant, spec.cache_dir or None)

    # ------------------------------------------------------------------------------------------
    # serving: llama-cpp-python's own OpenAI server (`python -m llama_cpp.server`), started through
    # `serve_main` so the model parameters its CLI lacks (use_extra_bufts, flash attention auto) are
    # set as the offline adapter sets them.
    #
    # What that server does (llama-cpp-python 0.3.36, llama_cpp/llama.py and server/): prompts are
    # text only (a list of ids is a 422), tokenized by its /extras/tokenize; logprobs come keyed by
    # token *string* (mapped back through the GGUF's vocabulary: `VocabMap`); one request runs at a
    # time (one Llama behind a lock); EOS cannot be ignored; repeat_penalty defaults to 1.1, so every
    # request sends the neutral sampler fields. /v1/models and /extras/* wait for the model's lock, so
    # health is polled on /openapi.json. Its echo=True prompt logprobs assume a BOS token: for a
    # model without one (add_bos false, as the built-in model) entry i holds the distribution of
    # token i+1 labelled as token i, so prompt logprobs are not taken from it.
    # Chat: without a chat_format, Llama.__init__ takes the GGUF's tokenizer.chat_template (llama.cpp's converter
    # writes the checkpoint's) unless it is byte-equal to one of its built-in formats, and falls back to "llama-2"
    # when the GGUF has none; the rendered text is tokenized with special tokens parsed, no BOS added. Its
    # chat stream reports no usage, so the served cell asks each chat's prompt count once, non-streamed.
    server_api = ServerApi(prompt_ids=False, ids_in_logprobs=False, prompt_logprobs=None, ignore_eos=False,
                           batches=False, tokenize_path="/extras/tokenize", health_path="/openapi.json", chat=True,
                           greedy_fields={"top_p": 1.0, "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0,
                                          "presence_penalty": 0.0, "frequency_penalty": 0.0})

    def token_strings(self, spec: LoadSpec):
        path, _ = self._model_file(spec)
        return VocabMap(path).id

    def server(self, spec: LoadSpec, port: int) -> ServerLaunch:
        import llama_cpp

        opts = self.Options(**(spec.options or {}))
        if opts.keep_kv_between_runs or opts.kv_unified:
            raise Unsupported("llamacpp serve: keep_kv_between_runs and kv_unified are offline-adapter options "
                              "(the server keeps its own KV cache and reuses a common prompt prefix by itself)")
        path, facts = self._model_file(spec)
        n_threads = opts.n_threads or len(os.sched_getaffinity(0))
        n_gpu_layers = opts.n_gpu_layers if opts.n_gpu_layers is not None else (-1 if spec.device == "cuda" else 0)
        # one sequence at a time: the context holds the longest request, with room for a text prompt
        # that the server's tokenizer makes a little longer than the run's token ids
        n_ctx = opts.n_ctx or -(-int(spec.context_len * 1.25 + 64) // CTX_ROUND) * CTX_ROUND
        flash = flash_attn_mode(opts.flash_attn)
        args = ["--model", str(path), "--host", "127.0.0.1", "--port", str(port), "--model_alias", spec.model.name,
                "--n_threads", str(n_threads), "--n_threads_batch", str(n_threads), "--n_ctx", str(n_ctx),
                "--n_batch", str(opts.n_batch), "--n_ubatch", str(min(opts.n_ubatch, opts.n_batch)),
                "--n_gpu_layers", str(n_gpu_layers), "--seed", str(spec.seed), "--flash_attn", str(flash == "on"),
                "--interrupt_requests", "False", "--verbose", "False"]
        for name in ("type_k", "type_v"):
            if getattr(opts, name):
                args += [f"--{name}", str(KV_TYPES[getattr(opts, name)][0])]
        if opts.prompt_lookup:
            args += ["--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", str(opts.num_pred_tokens)]
        argv = [sys.executable, "-c", "from adapters.engines.llamacpp.native import serve_main; serve_main()",
                str(opts.use_extra_bufts), flash, "--", *args]
        engine_args = {"server": "llama_cpp.server", "server_args": [a if a != str(path) else "<gguf>" for a in args],
                       "use_extra_bufts": opts.use_extra_bufts, "flash_attn": flash,
                       "gguf_file_size_bytes": path.stat().st_size, **facts}
        notes = list(engine_args.pop("conversion_notes", []))
        if opts.prompt_lookup:
            notes.append("prompt_lookup: the server's draft_model prompt-lookup-decoding (its max_ngram_size is fixed)")
        # serve_main is imported from this checkout, wherever the server's working directory is
        root = str(Path(__file__).resolve().parents[3])   # the repository: where `adapters` imports from
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        return ServerLaunch(argv=argv, model_name=spec.model.name, env=env, engine_args=engine_args, notes=notes,
                            versions={"llama_cpp_python": llama_cpp.__version__,
                                      **({"gguf_converter": facts["converter_version"]} if facts.get("converter_version") else {})},
                            to_id=VocabMap(path).id)

    def close(self) -> None:
        L = self._L
        if self._llm is not None:
            self._llm.close()
            self._llm = None
        if L is not None:
            if self._ctx:
                L.llama_free(self._ctx)
            if self._model:
                L.llama_model_free(self._model)
        self._ctx = self._model = None
        self._batch = None

    # ------------------------------------------------------------------------------------------
    # low-level context management

    # ------------------------------------------------------------------------------------------
    # batched generation (shared by generate and greedy)

    # ------------------------------------------------------------------------------------------
    no_stream_reason = ("llama-cpp-python's offline API has no continuous-batching scheduler: this adapter runs "
                        "static batches of sequences in one context (mode offline), or serve cells through its server")

    def generate(self, prompts: list[list[int]], output_len: int | list[int], ignore_eos: bool) -> TimedRun:
        if self._llm is not None:
            return self._generate_sequential(prompts, output_len, ignore_eos)
        r = self._run(prompts, output_len, stop_at_eos=not ignore_eos, keep_logits=False)
        return per_token_run(r["start"], r["end"], r["times"], prompts, r["engine_ttft"])

    def score(self, prompts: list[list[int]], top_k: int) -> list[TokenScores]:
        if self._llm is not None:
            return [self._score_one(p, top_k) for p in prompts]
        B = len(prompts)
        self._ensure_context(B, max(len(p) for p in prompts))
        self._clear_kv()  # teacher forcing needs every position's logits: nothing to reuse
        tok = np.concatenate([np.asarray(p, np.int32) for p in prompts])
        pos = np.concatenate([np.arange(len(p), dtype=np.int32) for p in prompts])
        seq = np.concatenate([np.full(len(p), s, np.int32) for s, p in enumerate(prompts)])
        # logits wanted at positions 0..n-2 of every prompt (they score tokens 1..n-1)
        out = np.concatenate([np.r_[np.ones(len(p) - 1, np.int8), np.zeros(1, np.int8)] for p in prompts])
        row_seq = np.repeat(np.arange(B), [len(p) for p in prompts])
        rows_by_seq: list[list[np.ndarray]] = [[] for _ in range(B)]
        for rows, view in self._decode(tok, pos, seq, out):
            if view is None:
                continue
            owners = row_seq[rows]
            for s in np.unique(owners):
                rows_by_seq[s].append(log_softmax(view[owners == s]))
        self._clear_kv()
        result = []
        for s, p in enumerate(prompts):
            lp = np.concatenate(rows_by_seq[s]) if rows_by_seq[s] else np.zeros((0, self._n_vocab), np.float32)
            result.append(topk_dense(lp, np.asarray(p[1:], np.int64), top_k))
        return result

    def greedy(self, prompts: list[list[int]], n_tokens: int, top_k: int) -> list[TokenScores]:
        if self._llm is not None:
            return [self._greedy_one(p, n_tokens, top_k) for p in prompts]
        r = self._run(prompts, n_tokens, stop_at_eos=False, keep_logits=True)
        return [topk_dense(log_softmax(np.stack(rows)), np.asarray(gen, np.int64), top_k)
                for rows, gen in zip(r["logits"], r["generated"])]

    def hidden_states(self, prompts: list[list[int]]) -> list[np.ndarray]:
        """Through llama.cpp's eval callback (adapters/engines/llamacpp/hidden.py)."""
        from adapters.engines.llamacpp.hidden import hidden_states

        return hidden_states(self, prompts)

    def residual_states(self, prompts: list[list[int]]) -> list[np.ndarray]:
        from adapters.engines.llamacpp.hidden import hidden_states

        return hidden_states(self, prompts, split=True)

    # ------------------------------------------------------------------------------------------
    # prompt-lookup speculative decoding: llama-cpp-python's Llama, one sequence at a time

    def sample(self, prompts: list[list[int]], seeds: list[int], settings: SamplerSettings,
               n_tokens: int) -> list[TokenScores]:
        """Seeded sampling by llama.cpp's own sampler: one llama_sampler chain per sequence (llama.cpp's
        order: top_k -> top_p -> min_p -> temp -> dist(seed), each filter only when the settings turn it
        on), sampling that sequence's logits row of each llama_decode of the batched loop, so a sample
        depends only on its prompt, its seed and its logits. Raw logprobs from the same rows."""
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        for seed in seeds:
            check_seed(seed)
        if self._llm is not None:
            return [self._sample_one(p, int(seed), settings, n_tokens) for p, seed in zip(prompts, seeds)]
        L = self._L
        B = len(prompts)
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt")
        self._ensure_context(B, max(len(p) for p in prompts) + n_tokens)
        self._clear_kv()
        cap = self._batch.capacity
        generated: list[list[int]] = [[] for _ in range(B)]
        logprobs: list[list[float]] = [[] for _ in range(B)]
        chains = [self._sampler_chain(int(seed), settings) for seed in seeds]
        try:
            tok = np.concatenate([np.asarray(p, np.int32) for p in prompts])
            pos = np.concatenate([np.arange(len(p), dtype=np.int32) for p in prompts])
            seq = np.concatenate([np.full(len(p), s, np.int32) for s, p in enumerate(prompts)])
            out = np.zeros(len(tok), np.int8)
            ends = np.cumsum([len(p) for p in prompts]) - 1
            out[ends] = 1
            owner = {int(e): s for s, e in enumerate(ends)}
            for step in range(n_tokens):
                if step:   # one token per sequence: its last sample, at the next position
                    tok = np.array([g[-1] for g in generated], np.int32)
                    pos = np.array([len(p) + step - 1 for p in prompts], np.int32)
                    seq = np.arange(B, dtype=np.int32)
                    out = np.ones(B, np.int8)
                    owner = {s: s for s in range(B)}
                for rows, view in self._decode(tok, pos, seq, out):
                    if view is None:
                        continue
                    lp = log_softmax(view)
                    for j, r in enumerate(rows):
                        s = owner[int(r)]
                        # idx: the token's index in the llama_decode batch just run (_decode's chunks
                        # start at multiples of its capacity)
                        t = int(L.llama_sampler_sample(chains[s], self._ctx, int(r) % cap))
                        generated[s].append(t)
                        logprobs[s].append(float(lp[j, t]))
        finally:
            for chain in chains:
                L.llama_sampler_free(chain)
            self._clear_kv()
        return [TokenScores(token_ids=np.asarray(g, np.int32), logprobs=np.asarray(lps, np.float32),
                            topk_ids=np.zeros((len(g), 0), np.int32), topk_logprobs=np.zeros((len(g), 0), np.float32))
                for g, lps in zip(generated, logprobs)]

    def _sampler_chain(self, seed: int, settings: SamplerSettings):
        L = self._L
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        parts = []
        if settings.top_k:
            parts.append(L.llama_sampler_init_top_k(settings.top_k))
        if settings.top_p < 1.0:
            parts.append(L.llama_sampler_init_top_p(settings.top_p, 1))
        if settings.min_p:
            parts.append(L.llama_sampler_init_min_p(settings.min_p, 1))
        parts.append(L.llama_sampler_init_temp(settings.temperature))
        parts.append(L.llama_sampler_init_dist(seed))
        for part in parts:
            L.llama_sampler_chain_add(chain, part)   # the chain owns its parts (freed with it)
        return chain

    def spec_counters(self) -> tuple[int, int] | None:
        """Prompt lookup's (draft tokens proposed, accepted) since load, over generate, greedy and sample."""
        if not self.opts.prompt_lookup:
            return None
        return self._spec[0], self._spec[1]


