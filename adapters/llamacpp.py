"""llama.cpp through llama-cpp-python 0.3.36: GGUF conversion, a quantization ladder, and honest batching.

Model files: an HF checkpoint is converted to GGUF by `adapters.gguf_convert` (f32/f16/bf16, cached by
content hash) and quantized from the F32 GGUF by llama.cpp's own `llama_model_quantize` (q8_0 ... q4_0).
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
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from adapters.base import Adapter, EngineOptions, Unsupported, log_softmax, normalize_quantization, register
from adapters.contract import LoadFacts, LoadSpec, SamplerSettings, TimedRun, TokenScores, per_token_run, topk_dense
from adapters.gguf_convert import captured_llama_logs
from adapters.server_process import ServerApi, ServerLaunch

KvCacheType = Literal["f32", "f16", "bf16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl"]
# GGML_TYPE_* ids and bytes per element of the KV cache types (ggml.h; quantized types per 32-block)
_KV_TYPES = {"f32": (0, 4.0), "f16": (1, 2.0), "bf16": (30, 2.0), "q8_0": (8, 34 / 32), "q5_1": (7, 24 / 32),
             "q5_0": (6, 22 / 32), "q4_1": (3, 20 / 32), "q4_0": (2, 18 / 32), "iq4_nl": (20, 18 / 32)}
_FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}
_CTX_ROUND = 256  # llama.cpp pads n_ctx (and n_ctx per sequence) to multiples of 256 anyway


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


def _flash_attn_mode(value: str | bool) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return value


@contextlib.contextmanager
def _llama_defaults(use_extra_bufts: bool, flash_attn_type: int):
    """Make llama_cpp.Llama(...) build its model with `use_extra_bufts` (which its constructor does not
    expose) and its context with the flash-attention mode auto/on/off (it only maps a bool)."""
    import llama_cpp.llama_cpp as lc

    orig_params, orig_disabled = lc.llama_model_default_params, lc.LLAMA_FLASH_ATTN_TYPE_DISABLED

    def model_params():
        params = orig_params()
        params.use_extra_bufts = use_extra_bufts
        return params

    lc.llama_model_default_params = model_params
    lc.LLAMA_FLASH_ATTN_TYPE_DISABLED = flash_attn_type  # Llama(flash_attn=False) writes this value
    try:
        yield
    finally:
        lc.llama_model_default_params, lc.LLAMA_FLASH_ATTN_TYPE_DISABLED = orig_params, orig_disabled


class _Batch:
    """A llama_batch over numpy buffers we own: filled with vector writes, one seq id per token."""

    def __init__(self, llama_cpp, capacity: int):
        self.capacity = capacity
        self.token = np.zeros(capacity, np.int32)
        self.pos = np.zeros(capacity, np.int32)
        self.n_seq_id = np.ones(capacity, np.int32)
        self.seq = np.zeros(capacity, np.int32)
        self.logits = np.zeros(capacity, np.int8)
        i32p = ctypes.POINTER(ctypes.c_int32)
        self._seq_ptrs = (i32p * capacity)(*[ctypes.cast(self.seq.ctypes.data + 4 * i, i32p) for i in range(capacity)])
        b = llama_cpp.llama_batch()
        b.n_tokens = 0
        b.token = self.token.ctypes.data_as(i32p)
        b.embd = ctypes.POINTER(ctypes.c_float)()
        b.pos = self.pos.ctypes.data_as(i32p)
        b.n_seq_id = self.n_seq_id.ctypes.data_as(i32p)
        b.seq_id = ctypes.cast(self._seq_ptrs, ctypes.POINTER(i32p))
        b.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.struct = b

    def fill(self, tokens, pos, seq, out) -> None:
        n = len(tokens)
        self.token[:n], self.pos[:n], self.seq[:n], self.logits[:n] = tokens, pos, seq, out
        self.struct.n_tokens = n


@register
class LlamacppAdapter(Adapter):
    name = "llamacpp"
    Options = Options
    quantizations = ("fp32", "fp16", "bf16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0", "gguf")
    install_hint = ("pip install -e '.[llamacpp]'  (llama-cpp-python==0.3.36 builds from source, about 5 minutes "
                    "on 2 cores; add CMAKE_ARGS=-DGGML_CUDA=on for a GPU build)")
    requires_modules = ("llama_cpp", "gguf")
    sampler_order = ("top_k", "top_p", "min_p", "temperature")     # its chain (_sampler_chain; llama_cpp.server's too)

    def __init__(self) -> None:
        self._L = None
        self._model = None
        self._ctx = None
        self._llm = None            # prompt-lookup mode: llama_cpp.Llama
        self._batch: _Batch | None = None
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
        if opts.type_v not in (None, "f32", "f16", "bf16") and _flash_attn_mode(opts.flash_attn) == "off":
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
        self.flash_attn = _flash_attn_mode(opts.flash_attn)

        notes: list[str] = list(facts.pop("conversion_notes", []))
        types = _tensor_types(path)
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
                raise RuntimeError(f"llama.cpp could not load {self.gguf_path}: {_last_error(logs)}")
            self._vocab = llama_cpp.llama_model_get_vocab(self._model)
            self._n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)
            # llama_get_logits returning the address as an int: the per-step check in _logits
            self._logits_addr = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(
                ctypes.cast(llama_cpp.llama_get_logits, ctypes.c_void_p).value)
            self._ensure_context(1, 256, logs)

        versions = {"llama_cpp_python": llama_cpp.__version__}
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
        self.info = LoadFacts(versions=versions, engine_args=engine_args, batch_mode=batch_mode, notes=notes)
        self.info.notes.append("llama.cpp system info: " + llama_cpp.llama_print_system_info().decode().strip())
        self._record_context(logs)
        return self.info

    @staticmethod
    def _model_file(spec: LoadSpec):
        """The GGUF this group runs (converted and quantized on first use, cached) and the conversion facts."""
        from adapters import gguf_convert

        quant = normalize_quantization(spec.quantization)
        if quant not in LlamacppAdapter.quantizations:
            raise Unsupported(f"llamacpp does not run quantization {quant} (runs: {', '.join(LlamacppAdapter.quantizations)})")
        # a builtin: model arrives here already built (the driver resolves it)
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
    # Chat: without a chat_format, Llama.__init__ takes the GGUF's tokenizer.chat_template (gguf_convert writes
    # the checkpoint's) unless it is byte-equal to one of its built-in formats, and falls back to "llama-2"
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
        n_ctx = opts.n_ctx or -(-int(spec.context_len * 1.25 + 64) // _CTX_ROUND) * _CTX_ROUND
        flash = _flash_attn_mode(opts.flash_attn)
        args = ["--model", str(path), "--host", "127.0.0.1", "--port", str(port), "--model_alias", spec.model.name,
                "--n_threads", str(n_threads), "--n_threads_batch", str(n_threads), "--n_ctx", str(n_ctx),
                "--n_batch", str(opts.n_batch), "--n_ubatch", str(min(opts.n_ubatch, opts.n_batch)),
                "--n_gpu_layers", str(n_gpu_layers), "--seed", str(spec.seed), "--flash_attn", str(flash == "on"),
                "--interrupt_requests", "False", "--verbose", "False"]
        for name in ("type_k", "type_v"):
            if getattr(opts, name):
                args += [f"--{name}", str(_KV_TYPES[getattr(opts, name)][0])]
        if opts.prompt_lookup:
            args += ["--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", str(opts.num_pred_tokens)]
        argv = [sys.executable, "-c", "from adapters.llamacpp import serve_main; serve_main()",
                str(opts.use_extra_bufts), flash, "--", *args]
        engine_args = {"server": "llama_cpp.server", "server_args": [a if a != str(path) else "<gguf>" for a in args],
                       "use_extra_bufts": opts.use_extra_bufts, "flash_attn": flash,
                       "gguf_file_size_bytes": path.stat().st_size, **facts}
        notes = list(engine_args.pop("conversion_notes", []))
        if opts.prompt_lookup:
            notes.append("prompt_lookup: the server's draft_model prompt-lookup-decoding (its max_ngram_size is fixed)")
        # serve_main is imported from this checkout, wherever the server's working directory is
        root = str(Path(__file__).resolve().parent.parent)
        env = {"PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        return ServerLaunch(argv=argv, model_name=spec.model.name, env=env, engine_args=engine_args, notes=notes,
                            versions={"llama_cpp_python": llama_cpp.__version__}, to_id=VocabMap(path).id)

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

    def _ensure_context(self, n_seq: int, tokens_per_seq: int, logs: list[str] | None = None) -> None:
        """A context holding n_seq sequences of tokens_per_seq tokens; rebuilt (outside any timing) only
        when a call needs more. A rebuilt context starts with an empty KV cache."""
        L = self._L
        max_seq = L.llama_max_parallel_sequences()
        if n_seq > max_seq:
            raise Unsupported(f"llama.cpp runs at most {max_seq} parallel sequences; batch of {n_seq} asked")
        if self.opts.n_ctx and tokens_per_seq > self.opts.n_ctx:
            raise ValueError(f"a request needs {tokens_per_seq} tokens per sequence but n_ctx is {self.opts.n_ctx}")
        if self._ctx and n_seq <= self._ctx_seqs and tokens_per_seq <= self._ctx_len:
            return
        per_seq = self.opts.n_ctx or -(-max(tokens_per_seq, self._ctx_len) // _CTX_ROUND) * _CTX_ROUND
        n_seq = max(n_seq, self._ctx_seqs)
        if self._ctx:
            L.llama_free(self._ctx)
            self._ctx = None
        cp = L.llama_context_default_params()
        cp.n_ctx = per_seq * n_seq  # split evenly between sequences unless kv_unified (then shared)
        cp.n_batch = self.opts.n_batch
        cp.n_ubatch = min(self.opts.n_ubatch, self.opts.n_batch)
        cp.n_seq_max = n_seq
        cp.n_threads = cp.n_threads_batch = self.n_threads
        cp.flash_attn_type = _FLASH_ATTN[self.flash_attn]
        if self.opts.type_k:
            cp.type_k = _KV_TYPES[self.opts.type_k][0]
        if self.opts.type_v:
            cp.type_v = _KV_TYPES[self.opts.type_v][0]
        cp.kv_unified = self.opts.kv_unified
        cp.no_perf = False
        own_logs = logs if logs is not None else []
        with captured_llama_logs(own_logs):
            self._ctx = L.llama_init_from_model(self._model, cp)
        if not self._ctx:
            raise RuntimeError(f"llama.cpp could not create a context ({n_seq} sequences x {per_seq} tokens): "
                               f"{_last_error(own_logs)}")
        self._ctx_seqs = n_seq
        self._ctx_len = min(per_seq, L.llama_n_ctx_seq(self._ctx))
        self._n_ctx_total = L.llama_n_ctx(self._ctx)
        # llama.cpp clamps n_batch to n_ctx: a llama_decode call may carry at most llama_n_batch tokens
        self._batch = _Batch(L, L.llama_n_batch(self._ctx))
        self._cached = {}
        self._logits_key = None
        if logs is None:
            self._record_context(own_logs)

    def _record_context(self, logs: list[str]) -> None:
        if self.info is None:
            return
        args = self.info.engine_args
        if self._llm is not None:
            args["n_ctx_per_seq"] = self._llm.n_ctx()
            args["n_seq_max"] = 1
            self.info.kv_budget_bytes = self._kv_bytes(self._llm.model, self._llm.n_ctx())
        elif self._ctx:
            args["n_ctx_per_seq"] = self._ctx_len
            args["n_ctx_total"] = self._n_ctx_total
            args["n_seq_max"] = self._ctx_seqs
            self.info.kv_budget_bytes = self._kv_bytes(self._model, self._n_ctx_total)
        if self.flash_attn != "auto":
            args["flash_attn_resolved"] = self.flash_attn
        for line in logs:  # llama.cpp resolves flash_attn=auto while it reserves the graphs
            if "Flash Attention enabled" in line:
                args["flash_attn_resolved"] = "on"
            elif "Flash Attention not supported" in line:
                args["flash_attn_resolved"] = "off"

    def _kv_bytes(self, model, n_ctx: int) -> int:
        L = self._L
        n_layer, n_head, n_head_kv = L.llama_model_n_layer(model), L.llama_model_n_head(model), L.llama_model_n_head_kv(model)
        head_dim = self.info.engine_args.get("head_dim") if self.info else None
        if not head_dim:
            head_dim = _gguf_head_dim(self.gguf_path) or L.llama_model_n_embd(model) // max(n_head, 1)
            if self.info:
                self.info.engine_args["head_dim"] = head_dim
        kb = _KV_TYPES[self.opts.type_k or "f16"][1]
        vb = _KV_TYPES[self.opts.type_v or "f16"][1]
        return int(n_ctx * n_layer * n_head_kv * head_dim * (kb + vb))

    def _memory(self):
        return self._L.llama_get_memory(self._ctx)

    def _clear_kv(self) -> None:
        self._L.llama_memory_clear(self._memory(), True)
        self._cached = {}

    def _decode(self, tokens: np.ndarray, pos: np.ndarray, seq: np.ndarray, out: np.ndarray):
        """llama_decode over chunks of at most n_batch tokens. Yields (indices of output rows in this
        chunk, logits view [rows, vocab]) after each call; the view is valid until the next call."""
        L, batch = self._L, self._batch
        cap = batch.capacity
        for lo in range(0, len(tokens), cap):
            hi = min(lo + cap, len(tokens))
            batch.fill(tokens[lo:hi], pos[lo:hi], seq[lo:hi], out[lo:hi])
            rc = L.llama_decode(self._ctx, batch.struct)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc} ({'no KV slot' if rc == 1 else 'error'}) "
                                   f"for {hi - lo} tokens")
            rows = np.nonzero(out[lo:hi])[0] + lo
            if len(rows):
                ptr = L.llama_get_logits(self._ctx)
                yield rows, np.ctypeslib.as_array(ptr, shape=(len(rows), self._n_vocab))
            else:
                yield rows, None

    def _logits(self, rows: int) -> np.ndarray:
        """The last llama_decode's logits [rows, vocab], a view on llama.cpp's output buffer (valid until the
        next call). The view is made again only when the buffer or the row count changes (~4 us saved a step);
        the buffer's address comes as a plain int (no ctypes pointer objects built per step)."""
        key = (self._logits_addr(self._ctx), rows)
        if key != self._logits_key:
            ptr = ctypes.cast(key[0], ctypes.POINTER(ctypes.c_float))
            self._logits_view, self._logits_key = np.ctypeslib.as_array(ptr, shape=(rows, self._n_vocab)), key
        return self._logits_view

    def _perf_ms(self) -> float:
        p = self._L.llama_perf_context(self._ctx)
        return float(p.t_p_eval_ms + p.t_eval_ms)

    # ------------------------------------------------------------------------------------------
    # batched generation (shared by generate and greedy)

    def _run(self, prompts: list[list[int]], n_tokens: int | list[int], stop_at_eos: bool,
             keep_logits: bool) -> dict[str, Any]:
        L = self._L
        B = len(prompts)
        # per sequence: its own output length (a drawn workload), its sequence leaves the batch there
        limits = [n_tokens] * B if isinstance(n_tokens, int) else list(n_tokens)
        n_tokens = max(limits)
        stop_steps = set(limits) if len(set(limits)) > 1 else set()
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt")
        self._ensure_context(B, max(len(p) for p in prompts) + n_tokens)
        # Which prompt tokens must be decoded: all of them, unless the KV cache is kept on purpose and a
        # sequence already holds a prefix (then only the suffix; at least the last token, for its logits).
        starts = [0] * B
        if self.opts.keep_kv_between_runs:
            mem = self._memory()
            for s, p in enumerate(prompts):
                cached = self._cached.get(s, [])
                common = 0
                for a, b in zip(cached, p):
                    if a != b:
                        break
                    common += 1
                common = min(common, len(p) - 1)
                if not L.llama_memory_seq_rm(mem, s, common, -1):
                    L.llama_memory_seq_rm(mem, s, -1, -1)
                    common = 0
                starts[s] = common
            for s in list(self._cached):
                if s >= B:
                    L.llama_memory_seq_rm(mem, s, -1, -1)
                    del self._cached[s]
        else:
            self._clear_kv()

        tok = np.concatenate([np.asarray(p[st:], np.int32) for p, st in zip(prompts, starts)])
        pos = np.concatenate([np.arange(st, len(p), dtype=np.int32) for p, st in zip(prompts, starts)])
        seq = np.concatenate([np.full(len(p) - st, s, np.int32) for s, (p, st) in enumerate(zip(prompts, starts))])
        out = np.zeros(len(tok), np.int8)
        ends = np.cumsum([len(p) - st for p, st in zip(prompts, starts)]) - 1
        out[ends] = 1
        row_seq = {int(e): s for s, e in enumerate(ends)}

        generated: list[list[int]] = [[] for _ in range(B)]
        times: list[list[float]] = [[] for _ in range(B)]
        logits: list[list[np.ndarray]] = [[] for _ in range(B)]
        engine_ttft = [0.0] * B
        done = [False] * B
        eog = L.llama_vocab_is_eog
        # each decode step's positions, [step, sequence] (step k decodes the token chosen at step k - 1),
        # built before the clock starts: an in-place `pos += 1` on the batch cost ~6 us a step
        step_pos = np.add.outer(np.arange(n_tokens + 1, dtype=np.int32),
                                np.asarray([len(p) for p in prompts], np.int32)) - 1

        L.llama_perf_context_reset(self._ctx)
        t0_perf = self._perf_ms()
        start = time.perf_counter()
        for rows, view in self._decode(tok, pos, seq, out):
            if view is None:
                continue
            best = view.argmax(axis=1)
            if keep_logits:
                kept = view.copy()
            now = time.perf_counter()
            eng = (self._perf_ms() - t0_perf) / 1e3
            for j, r in enumerate(rows):
                s = row_seq[int(r)]
                generated[s].append(int(best[j]))
                times[s].append(now)
                engine_ttft[s] = eng
                if keep_logits:
                    logits[s].append(kept[j])
                if (stop_at_eos and eog(self._vocab, int(best[j]))) or limits[s] <= 1:
                    done[s] = True
        # Decode steps: one token per live sequence (at most n_seq_max <= n_batch: one llama_decode call).
        # This loop is the timed path, and on a small model a step takes ~0.1 ms: the batch is written
        # once and then advanced in place (tokens <- argmax, positions <- the step's row of step_pos), and
        # a step only appends its time and its argmax array; who got which token when is sorted out after
        # the clock stops (building arrays per step, as _decode does, cost 20-30% of the throughput on the
        # built-in model; per-sequence list appends, a tolist and `pos += 1` another ~8 us a step).
        batch, ctx = self._batch, self._ctx
        decode, struct, view_of, clock = L.llama_decode, batch.struct, self._logits, time.perf_counter
        live = [s for s in range(B) if not done[s]]
        n = len(live)
        steps: list[tuple[list[int], list[float], list[np.ndarray], list[np.ndarray]]] = []
        if n and n_tokens > 1:
            pos_rows = step_pos if n == B else step_pos[:, live]
            batch.fill([generated[s][-1] for s in live], pos_rows[1], live, 1)
            tok_n, pos_n = batch.token[:n], batch.pos[:n]
            stamps: list[float] = []
            bests: list[np.ndarray] = []
            kepts: list[np.ndarray] = []
            steps.append((live, stamps, bests, kepts))
        for step in range(1, n_tokens):
            if not n:
                break
            rc = decode(ctx, struct)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc} ({'no KV slot' if rc == 1 else 'error'}) for {n} tokens")
            view = view_of(n)
            best = view.argmax(axis=1)
            stamps.append(clock())
            bests.append(best)
            if keep_logits:
                kepts.append(view.copy())
            if (stop_at_eos and any(eog(self._vocab, t) for t in best.tolist())) or step + 1 in stop_steps:
                toks = best.tolist()
                for s, t in zip(live, toks):
                    # every live sequence holds step + 1 tokens now (they go to `generated` after the clock)
                    done[s] = done[s] or (stop_at_eos and bool(eog(self._vocab, t))) or step + 1 >= limits[s]
                live = [s for s in live if not done[s]]
                n = len(live)
                if n:
                    pos_rows = step_pos[:, live]
                    batch.fill([t for s, t in zip(steps[-1][0], toks) if not done[s]], pos_rows[step + 1], live, 1)
                    tok_n, pos_n = batch.token[:n], batch.pos[:n]
                    stamps, bests, kepts = [], [], []
                    steps.append((live, stamps, bests, kepts))
                continue
            tok_n[:] = best
            pos_n[:] = pos_rows[step + 1]
        end = time.perf_counter()
        for seqs, stamps_, bests_, kepts_ in steps:   # each step's tokens and time to their sequences
            toks_by_seq = np.stack(bests_, axis=1).tolist() if bests_ else [[] for _ in seqs]
            for j, s in enumerate(seqs):
                generated[s] += toks_by_seq[j]
                times[s] += stamps_
                if keep_logits:
                    logits[s] += [k[j] for k in kepts_]
        perf = L.llama_perf_context(self._ctx)
        self.last_perf = {"t_p_eval_ms": perf.t_p_eval_ms, "t_eval_ms": perf.t_eval_ms,
                          "n_p_eval": perf.n_p_eval, "n_eval": perf.n_eval, "prefix_reused": list(starts)}
        if self.opts.keep_kv_between_runs:
            # in the cache: the prompt and every generated token but the last (never decoded)
            self._cached = {s: list(prompts[s]) + generated[s][:-1] for s in range(B)}
        return {"start": start, "end": end, "generated": generated, "times": times, "logits": logits,
                "engine_ttft": engine_ttft}

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

    # ------------------------------------------------------------------------------------------
    # prompt-lookup speculative decoding: llama-cpp-python's Llama, one sequence at a time

    def _ensure_llama(self, tokens: int, logs: list[str] | None = None) -> None:
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        need = tokens + self.opts.num_pred_tokens + 1  # drafts may run past the last kept token
        if self.opts.n_ctx and need > self.opts.n_ctx:
            raise ValueError(f"a request needs {need} tokens (with drafts) but n_ctx is {self.opts.n_ctx}")
        if self._llm is not None and need <= self._llm.n_ctx():
            return
        n_ctx = self.opts.n_ctx or -(-need // _CTX_ROUND) * _CTX_ROUND
        if self._llm is not None:
            self._llm.close()
            self._llm = None
        kwargs = dict(n_gpu_layers=self.n_gpu_layers, n_ctx=n_ctx, n_batch=self.opts.n_batch,
                      n_ubatch=min(self.opts.n_ubatch, self.opts.n_batch), n_threads=self.n_threads,
                      n_threads_batch=self.n_threads, flash_attn=self.flash_attn == "on",
                      type_k=_KV_TYPES[self.opts.type_k][0] if self.opts.type_k else None,
                      type_v=_KV_TYPES[self.opts.type_v][0] if self.opts.type_v else None,
                      draft_model=self._counting_drafter(LlamaPromptLookupDecoding),
                      logits_all=True, seed=self.spec.seed, verbose=False)
        own_logs = logs if logs is not None else []
        with _llama_defaults(self.opts.use_extra_bufts, _FLASH_ATTN[self.flash_attn]), captured_llama_logs(own_logs):
            self._llm = llama_cpp.Llama(self.gguf_path, **kwargs)
        self._n_vocab = self._llm.n_vocab()
        if logs is None:
            self._record_context(own_logs)

    def _fresh_llm(self, prompt: list[int], extra: int) -> None:
        self._ensure_llama(len(prompt) + extra)
        if not self.opts.keep_kv_between_runs:
            self._llm.reset()
            self._L.llama_memory_clear(self._L.llama_get_memory(self._llm.ctx), True)

    def _greedy_stream(self, prompt: list[int]):
        # temp=0 -> llama-cpp-python's greedy sampler; reset=True lets Llama reuse a cached prefix only
        # when keep_kv_between_runs left one there (otherwise _fresh_llm emptied it)
        return self._llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                  reset=True)

    def _generate_sequential(self, prompts: list[list[int]], output_len: int | list[int], ignore_eos: bool) -> TimedRun:
        L = self._L
        lens = [output_len] * len(prompts) if isinstance(output_len, int) else list(output_len)
        for p, n in zip(prompts, lens):
            self._ensure_llama(len(p) + n)  # any context rebuild happens before the clock starts
        times: list[list[float]] = []
        engine_ttft: list[float] = []
        drafted: list[tuple[list[int], list[int], list]] = []   # per prompt: its tokens, output, draft calls
        start = time.perf_counter()
        for p, output_len in zip(prompts, lens):
            self._fresh_llm(p, output_len)
            ctx = self._llm.ctx
            L.llama_perf_context_reset(ctx)
            ts: list[float] = []
            out: list[int] = []
            for token in self._greedy_stream(p):
                ts.append(time.perf_counter())
                out.append(token)
                if len(ts) == 1:
                    perf = L.llama_perf_context(ctx)
                    engine_ttft.append((perf.t_p_eval_ms + perf.t_eval_ms) / 1e3)
                if len(ts) >= output_len or (not ignore_eos and self._llm.token_eos() == token):
                    break
            times.append(ts)
            drafted.append((p, out, self._drafter.take()))
        end = time.perf_counter()
        for p, out, calls in drafted:   # counted after the clock stopped
            self._tally_drafts(p, out, calls)
        # the batch was handed over at `start`: a request's TTFT includes its wait behind the ones before it
        return per_token_run(start, end, times, prompts, engine_ttft)

    def _score_one(self, prompt: list[int], top_k: int) -> TokenScores:
        self._ensure_llama(len(prompt))
        self._llm.reset()
        self._L.llama_memory_clear(self._L.llama_get_memory(self._llm.ctx), True)
        self._llm.eval(prompt)
        lp = log_softmax(np.array(self._llm.scores[: len(prompt) - 1]))
        return topk_dense(lp, np.asarray(prompt[1:], np.int64), top_k)

    def _greedy_one(self, prompt: list[int], n_tokens: int, top_k: int) -> TokenScores:
        self._fresh_llm(prompt, n_tokens)
        tokens: list[int] = []
        for token in self._greedy_stream(prompt):
            tokens.append(int(token))
            if len(tokens) >= n_tokens:
                break
        self._tally_drafts(prompt, tokens, self._drafter.take())
        # row i of Llama.scores holds the logits after position i; token j was chosen from row n-1+j
        rows = np.array(self._llm.scores[len(prompt) - 1: len(prompt) - 1 + n_tokens])
        return topk_dense(log_softmax(rows), np.asarray(tokens, np.int64), top_k)

    def _sample_one(self, prompt: list[int], seed: int, settings: SamplerSettings, n_tokens: int) -> TokenScores:
        """Prompt-lookup mode: llama-cpp-python's Llama.generate, whose sampler chain (penalties off,
        top_k, typical off, top_p, min_p, temp, dist(seed)) is built afresh on every call with the seed
        set_seed gave it; with the draft model it samples each verified position in order with that one
        chain, so the ids are those of plain sampling with the same seed."""
        _check_seed(seed)
        self._fresh_llm(prompt, n_tokens)
        self._llm.set_seed(seed)
        tokens: list[int] = []
        for token in self._llm.generate(prompt, top_k=settings.top_k, top_p=settings.top_p, min_p=settings.min_p,
                                        typical_p=1.0, temp=settings.temperature, repeat_penalty=1.0,
                                        frequency_penalty=0.0, presence_penalty=0.0, reset=True):
            tokens.append(int(token))
            if len(tokens) >= n_tokens:
                break
        self._tally_drafts(prompt, tokens, self._drafter.take())
        rows = np.array(self._llm.scores[len(prompt) - 1: len(prompt) - 1 + n_tokens])
        return _sampled_scores(log_softmax(rows), tokens)

    def sample(self, prompts: list[list[int]], seeds: list[int], settings: SamplerSettings,
               n_tokens: int) -> list[TokenScores]:
        """Seeded sampling by llama.cpp's own sampler: one llama_sampler chain per sequence (llama.cpp's
        order: top_k -> top_p -> min_p -> temp -> dist(seed), each filter only when the settings turn it
        on), sampling that sequence's logits row of each llama_decode of the batched loop, so a sample
        depends only on its prompt, its seed and its logits. Raw logprobs from the same rows."""
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
        for seed in seeds:
            _check_seed(seed)
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

    # prompt-lookup acceptance: llama-cpp-python counts nothing, so the draft model is wrapped and every
    # draft it returns is kept with the position it starts at; after a sequence, a draft's accepted tokens
    # are its longest prefix that the sequence (prompt + output) holds from that position (Llama.generate
    # keeps a draft token only while each sampled token equals it). Drafts past the output taken count as
    # proposed and not accepted.
    def _counting_drafter(self, base):
        if self._drafter is None:
            adapter = self

            class CountingPromptLookup(base):
                def __init__(self, **kwargs) -> None:
                    super().__init__(**kwargs)
                    self.calls: list[tuple[int, list[int]]] = []

                def __call__(self, input_ids, /, **kwargs):
                    draft = super().__call__(input_ids, **kwargs)
                    room = adapter._llm.n_ctx() - len(input_ids) if adapter._llm is not None else len(draft)
                    self.calls.append((len(input_ids), [int(t) for t in draft[:max(room, 0)]]))
                    return draft

                def take(self) -> list[tuple[int, list[int]]]:
                    calls, self.calls = self.calls, []
                    return calls

            self._drafter = CountingPromptLookup(max_ngram_size=self.opts.max_ngram_size,
                                                 num_pred_tokens=self.opts.num_pred_tokens)
        return self._drafter

    def _tally_drafts(self, prompt: list[int], output: list[int], calls: list[tuple[int, list[int]]]) -> None:
        seq = [int(t) for t in prompt] + [int(t) for t in output]
        for start, draft in calls:
            n = 0
            while n < len(draft) and start + n < len(seq) and seq[start + n] == draft[n]:
                n += 1
            self._spec[0] += len(draft)
            self._spec[1] += n

    def spec_counters(self) -> tuple[int, int] | None:
        """Prompt lookup's (draft tokens proposed, accepted) since load, over generate, greedy and sample."""
        if not self.opts.prompt_lookup:
            return None
        return self._spec[0], self._spec[1]


def _check_seed(seed: int) -> None:
    if not 0 <= int(seed) < 0xFFFFFFFF:
        raise Unsupported(f"llama.cpp sampler seeds are 32-bit and 0xFFFFFFFF means 'random': seed {seed} "
                          "is outside 0 .. 4294967294")


def _sampled_scores(lp: np.ndarray, tokens: list[int]) -> TokenScores:
    return topk_dense(lp, np.asarray(tokens, np.int64), 0)


def _last_error(logs: list[str]) -> str:
    text = "".join(logs).strip().splitlines()
    errs = [line for line in text if "error" in line.lower() or "failed" in line.lower()]
    return (errs or text or ["no log output"])[-1]


def _tensor_types(path) -> dict[str, int]:
    import gguf

    counts: dict[str, int] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return dict(sorted(counts.items()))


def _gguf_head_dim(path) -> int | None:
    import gguf

    reader = gguf.GGUFReader(str(path))
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        return None
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode()

    def val(key):
        f = reader.fields.get(f"{arch}.{key}")
        return int(f.parts[f.data[0]][0]) if f is not None else None

    if val("attention.key_length"):
        return val("attention.key_length")
    emb, heads = val("embedding_length"), val("attention.head_count")
    return emb // heads if emb and heads else None


class VocabMap:
    """Token string -> token id, built from a GGUF's vocabulary exactly as llama-cpp-python's server
    renders tokens in logprobs (detokenize one id, decode UTF-8 ignoring errors). Strings shared by
    several ids are ambiguous (-1)."""

    def __init__(self, gguf_path) -> None:
        import llama_cpp

        with captured_llama_logs([]):
            llm = llama_cpp.Llama(str(gguf_path), vocab_only=True, verbose=False)
        ids: dict[str, list[int]] = {}
        for i in range(llm.n_vocab()):
            ids.setdefault(llm.detokenize([i]).decode("utf-8", errors="ignore"), []).append(i)
        llm.close()
        self.ids = {s: (v[0] if len(v) == 1 else -1) for s, v in ids.items()}
        self.ambiguous = sum(1 for v in ids.values() if len(v) > 1)

    def id(self, token: str) -> int:
        return self.ids.get(token, -1)


def serve_main(argv: list[str] | None = None) -> None:
    """llama-cpp-python's server with use_extra_bufts and the flash-attention mode set:
    `python -c 'from adapters.llamacpp import serve_main; serve_main()' USE_EXTRA_BUFTS FLASH_ATTN -- ARGS`."""
    argv = sys.argv[1:] if argv is None else argv
    use_extra_bufts, flash = argv[0] == "True", argv[1]
    from llama_cpp.server.__main__ import main

    sys.argv = ["llama_cpp.server", *argv[3:]]
    # --flash_attn True selects "on"; False writes LLAMA_FLASH_ATTN_TYPE_DISABLED, which is set to auto's -1 or off's 0
    with _llama_defaults(use_extra_bufts, _FLASH_ATTN[flash] if flash != "on" else _FLASH_ATTN["off"]):
        main()
