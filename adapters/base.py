"""The small interface every engine adapter implements, and the registry that finds adapters.

An adapter is one file: a subclass of `Adapter` decorated with `@register`, an `Options` model
listing the engine flags it understands, and the logical quantization levels it can run. Engine
imports happen inside `load()` only, so the orchestrator can validate a matrix without any engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:
    from adapters.serving import ServerApi, ServerLaunch

# Logical quantization levels a matrix may name; each adapter maps the ones it runs.
QUANTIZATIONS = (
    "fp32", "fp16", "bf16",
    "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0",
    "fp8", "awq", "gptq", "bnb_4bit", "bnb_8bit", "gguf",
)
QUANTIZATION_ALIASES = {"f32": "fp32", "f16": "fp16", "float32": "fp32", "float16": "fp16",
                        "bfloat16": "bf16", "bitsandbytes": "bnb_4bit"}


class EngineOptions(BaseModel):
    """Flags of one engine. Subclasses declare the options; unknown keys are matrix errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Unsupported(Exception):
    """Raised by an adapter when a cell cannot run on this engine/hardware; becomes an `unsupported` row."""


@dataclass
class ModelSpec:
    name: str                      # the matrix's name for the model
    source: str                    # local path or hub id (resolved by the worker)
    trust_remote_code: bool = False
    revision: str | None = None


@dataclass
class LoadSpec:
    """What one engine group hands its adapter: everything that needs a fresh engine."""

    framework: str
    model: ModelSpec
    quantization: str
    options: dict[str, Any]
    device: str                    # "cpu" or "cuda"
    gpus: int = 0
    cache_dir: str = ""            # where conversions and quantized files are cached
    seed: int = 0
    context_len: int = 0           # tokens the group's longest request needs (prompt + output)


@dataclass
class BatchTiming:
    """Timestamps (time.perf_counter seconds) of one timed batch of requests."""

    start: float
    end: float
    first_token: list[float]               # per request
    token_times: list[list[float]]         # per request, one time per output token (may be empty)
    output_tokens: list[int]               # per request
    prompt_tokens: list[int]               # per request
    engine_ttft_s: list[float] | None = None   # the engine's own TTFT, to cross-check wall clock


@dataclass
class TokenScores:
    """Logprobs of a token sequence. Row i scores token_ids[i]; top-k is by token id."""

    token_ids: np.ndarray          # int32 [n]
    logprobs: np.ndarray           # float32 [n]
    topk_ids: np.ndarray           # int32 [n, k]
    topk_logprobs: np.ndarray      # float32 [n, k]

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])


@dataclass
class AdapterInfo:
    """Facts an adapter reports after load, stored with every cell of the group."""

    versions: dict[str, str] = field(default_factory=dict)
    engine_args: dict[str, Any] = field(default_factory=dict)
    kv_budget_bytes: int | None = None
    batch_mode: str = "batched"    # "batched", or "sequential" where the engine cannot batch
    notes: list[str] = field(default_factory=list)
    memory_pids: list[int] = field(default_factory=list)  # extra processes to count (engine children)


class Adapter:
    """One engine. The worker calls: check -> load -> (generate | score | greedy)* -> close."""

    name: ClassVar[str]
    Options: ClassVar[type[EngineOptions]] = EngineOptions
    quantizations: ClassVar[tuple[str, ...]] = ("fp32",)
    needs_cuda: ClassVar[bool] = False
    # The command that creates this framework's environment, named in rows when it is missing.
    install_hint: ClassVar[str] = ""
    # Modules whose absence means "environment not installed" rather than a crash.
    requires_modules: ClassVar[tuple[str, ...]] = ()

    def check(self, spec: LoadSpec) -> str | None:
        """Return why this group cannot run here (an `unsupported` reason), before anything loads."""
        return None

    def load(self, spec: LoadSpec) -> AdapterInfo:
        raise NotImplementedError

    def generate(self, prompts: list[list[int]], output_len: int, ignore_eos: bool) -> BatchTiming:
        """Generate for all prompts together as one batch, timing each request."""
        raise NotImplementedError

    def score(self, prompts: list[list[int]], top_k: int) -> list[TokenScores]:
        """Teacher-forced logprobs: for each prompt, scores of tokens 1..n-1 given their prefix."""
        raise NotImplementedError

    def greedy(self, prompts: list[list[int]], n_tokens: int, top_k: int) -> list[TokenScores]:
        """Greedy generation of n_tokens per prompt (EOS ignored), with top-k logprobs per step."""
        raise NotImplementedError

    def close(self) -> None:
        pass

    # Serving mode: the engine's own OpenAI-compatible server. An adapter that has one declares how
    # its /v1/completions behaves (`server_api`) and returns the command that starts it.
    server_api: ClassVar["ServerApi | None"] = None
    no_server_reason: ClassVar[str] = ""     # said in the rows of serve cells when server_api is None

    def server(self, spec: LoadSpec, port: int) -> "ServerLaunch":
        """The command that starts this group's server on 127.0.0.1:port (conversions done first)."""
        raise Unsupported(f"{self.name} has no OpenAI-compatible server here")

    def token_strings(self, spec: LoadSpec) -> Callable[[str], int] | None:
        """Token string -> id, for a server that returns token strings rather than ids (None: it returns ids)."""
        return None


ADAPTERS: dict[str, type[Adapter]] = {}


def register(cls: type[Adapter]) -> type[Adapter]:
    ADAPTERS[cls.name] = cls
    return cls


def no_cuda_reason(engine: str) -> str | None:
    """Why a CUDA engine cannot start here, checked in the engine's own environment (its torch)."""
    import torch

    return None if torch.cuda.is_available() else f"{engine} needs CUDA, and torch sees no GPU here"


def normalize_quantization(name: str) -> str:
    return QUANTIZATION_ALIASES.get(name.lower(), name.lower())


def topk_scores(logprobs: np.ndarray, actual: np.ndarray, k: int) -> TokenScores:
    """Top-k by token id from full-vocabulary logprobs [n, vocab], plus each actual token's logprob.

    Ties are broken by the lower token id, so two engines with equal logprobs give equal lists.
    """
    logprobs = np.asarray(logprobs, dtype=np.float32)
    actual = np.asarray(actual, dtype=np.int64)
    n, vocab = logprobs.shape
    k = min(k, vocab)
    # a stable sort of -logprob keeps equal logprobs in id order
    order = np.argsort(-logprobs, axis=1, kind="stable")[:, :k]
    return TokenScores(
        token_ids=actual.astype(np.int32),
        logprobs=logprobs[np.arange(n), actual] if n else np.zeros(0, np.float32),
        topk_ids=order.astype(np.int32),
        topk_logprobs=np.take_along_axis(logprobs, order, axis=1),
    )


def logits_rows(t, rows: int, vocab: int | None) -> np.ndarray:
    """An engine's logits (a torch tensor or an array) as float32 numpy: the first `rows` rows, and
    only the tokenizer's vocabulary (engines pad the vocabulary dimension; padding is not a token)."""
    arr = (t.float().cpu().numpy() if hasattr(t, "float") else np.asarray(t, dtype=np.float32))[:rows]
    return arr[:, :vocab] if vocab and arr.shape[-1] > vocab else arr


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-softmax in float64 (then float32), so every engine's raw logits are normalised alike."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    out = x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))
    return out.astype(np.float32)
