"""The small interface every engine adapter implements, and the registry that finds adapters.

An adapter is one file: a subclass of `Adapter` decorated with `@register`, an `Options` model
listing the engine flags it understands, and the logical quantization levels it can run. Engine
imports happen inside `load()` only, so the orchestrator can validate a matrix without any engine.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict

from adapters.contract.events import LoadFacts
from adapters.contract.records import TokenScores
from adapters.contract.specs import LoadSpec, ModelFacts, SamplerSettings
from adapters.contract.timing import TimedRun

if TYPE_CHECKING:
    from adapters.contract.openai_api import ServerApi, ServerLaunch

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


@dataclass(frozen=True)
class NumericsFlag:
    """A group of an engine's options that can change its outputs' numbers: a suspect of `bench explain`
    (orchestrator/explain/). `reference` maps each EngineOptions field to its value on the exact side (an f32
    KV cache, eager execution, no speculation; None: the engine's default), where a probe moves it when the
    baseline is another engine; against a baseline of the same engine a probe moves it to the baseline's value."""

    name: str                                                  # how reports name it, e.g. "kv_cache_types"
    reference: Mapping[str, object] = field(default_factory=dict)
    why: str = ""                                              # what it changes, said in the explain output


@dataclass(frozen=True)
class SeedPromise:
    """What an engine documents about its seeded sampling, for one range of its versions: the sampling verdict
    (orchestrator/judge/sampling_verdicts.py) reads it before it calls a seed-by-seed difference a broken
    promise. It is the engine's word, not what was seen here."""

    package: str            # the key of the cell's `versions` provenance the version is read from
    versions: str           # the versions this entry was read for (a PEP 440 specifier)
    same_batch: bool        # the same seed, settings and batch -> the same sample
    across_batch: bool      # ... and in another batch size (batch invariance)
    source: str             # where the engine says so


class Unsupported(Exception):
    """Raised by an adapter when a cell cannot run on this engine/hardware; becomes an `unsupported` row."""


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
    # The order in which the engine's own sampler applies temperature and its filters (the steps of
    # orchestrator.judge.sampling_stats.SAMPLER_STEPS); None where not checked (the first-token test then says so).
    sampler_order: ClassVar[tuple[str, ...] | None] = None
    # The option groups that can change the numbers (`bench explain`'s suspects, each a NumericsFlag naming fields
    # of Options); batch size 1 and the quantization are suspects of every engine, added by the search itself.
    numerics_flags: ClassVar[tuple[NumericsFlag, ...]] = ()
    # What the driver reads from the registry rather than from tables of its own, so that an engine is declared in
    # its own module alone: the scheduler's first guess before any run measured it (orchestrator/execution/
    # estimate.py: seconds to load its engine; a cell's time relative to vLLM's), its seed promises per version,
    # and the distributions whose versions a run's manifest records.
    load_fixed_s: ClassVar[float] = 30.0
    cell_speed: ClassVar[float] = 1.0
    convert_s_per_gb: ClassVar[float] = 0.0   # turning a checkpoint into the engine's own format, where it must
    seed_promises: ClassVar[tuple[SeedPromise, ...]] = ()
    packages: ClassVar[tuple[str, ...]] = ()
    # False for an engine that runs in any engine environment (needs nothing beyond numpy, pydantic and psutil): no
    # environment, image or node resource of its own (cluster/ and orchestrator/matrix/placement.py)
    own_environment: ClassVar[bool] = True

    def check(self, spec: LoadSpec) -> str | None:
        """Return why this group cannot run here (an `unsupported` reason), before anything loads."""
        return None

    @classmethod
    def model_problem(cls, model: ModelFacts, quantization: str, options: Mapping, device: str) -> str | None:
        """Why this engine cannot run this model at all, from what the driver's preflight resolved (config,
        architecture, head size), without importing the engine: an `unsupported` reason written for the
        group's cells before any engine starts. None where nothing rules it out (load may still)."""
        return None

    def load(self, spec: LoadSpec) -> LoadFacts:
        raise NotImplementedError

    def generate(self, prompts: list[list[int]], output_len: int | list[int], ignore_eos: bool) -> TimedRun:
        """Generate for all prompts together as one batch, timing each request: every output chunk's
        time is when it becomes available to this process (adapters.contract.timing.RequestTiming). output_len
        is one length for all, or one per prompt (a workload with drawn or dataset lengths)."""
        raise NotImplementedError

    # Stream cells: every request handed to the engine at once, its own scheduler running at most
    # LoadSpec.max_running together (continuous batching). An engine that has such a scheduler sets
    # `streams` and honours max_running at load; `generate` then takes the whole stream in one call.
    streams: ClassVar[bool] = False
    no_stream_reason: ClassVar[str] = "this adapter has no continuous-batching scheduler"
    # A stream cell with a request rate, a ramp or a trace hands each request to the engine at its arrival
    # time: an adapter that can sets `follows_arrivals`, and its generate takes `arrivals_s` (seconds after
    # the run's start, per request) and fills each RequestTiming's `scheduled` and `sent`.
    follows_arrivals: ClassVar[bool] = False

    def score(self, prompts: list[list[int]], top_k: int) -> list[TokenScores]:
        """Teacher-forced logprobs: for each prompt, scores of tokens 1..n-1 given their prefix."""
        raise NotImplementedError

    def greedy(self, prompts: list[list[int]], n_tokens: int, top_k: int) -> list[TokenScores]:
        """Greedy generation of n_tokens per prompt (EOS ignored), with top-k logprobs per step."""
        raise NotImplementedError

    def sample(self, prompts: list[list[int]], seeds: list[int], settings: SamplerSettings,
               n_tokens: int) -> list[TokenScores]:
        """One seeded sample per (prompts[i], seeds[i]), generated together as one batch by the engine's
        own sampler, n_tokens each (EOS ignored): the sampled ids and each one's raw logprob (the
        log-softmax of the raw logits, before temperature and filters); top-k lists empty (k = 0).
        A sample must depend only on its prompt and seed, not on the rest of the batch, where the
        engine can promise that; Unsupported where the engine has no per-request seed."""
        raise Unsupported(f"{self.name}: seeded sampling is not implemented in this adapter")

    def hidden_states(self, prompts: list[list[int]]) -> list[np.ndarray]:
        """The residual stream of each prompt, one float32 array [layers + 1, positions, hidden] each: the
        embeddings, then the output of every block, the last one after the final norm (transformers'
        `output_hidden_states` convention). Unsupported where the engine cannot expose it (`no_hidden_reason`)."""
        raise Unsupported(f"{self.name}: {self.no_hidden_reason}")

    no_hidden_reason: ClassVar[str] = "per-layer hidden states are not exposed by this adapter"

    def residual_states(self, prompts: list[list[int]]) -> list[np.ndarray]:
        """hidden_states with each block split in two, [2 x layers + 1, positions, hidden] float32 per prompt: the
        embeddings, then per block the residual stream after its attention (the residual add) and after the whole
        block (the last one after the final norm). Index 2i + 2 is hidden_states' index i + 1. Unsupported where
        the engine cannot split a block (`bench explain --layers` then reports whole blocks)."""
        raise Unsupported(f"{self.name}: the residual stream inside a block is not exposed by this adapter")

    def spec_counters(self) -> tuple[int, int] | None:
        """Speculative decoding's (draft tokens proposed, draft tokens accepted) since load, where the
        engine speculates and counts them; None otherwise. The worker takes differences per cell."""
        return None

    def engine_metrics(self) -> dict[str, float] | None:
        """The engine's own Prometheus-style metrics now ({family: value}, adapters.meters.telemetry), where its
        Python API exports them; None otherwise (`no_metrics_reason` says why). The worker takes
        differences over each cell's timed batches."""
        return None

    no_metrics_reason: ClassVar[str] = "this engine's Python API exports no metrics"

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


class Registry(Mapping[str, "type[Adapter]"]):
    """Framework name -> adapter class. Each adapter's module is imported the first time its framework is
    looked up, so a process imports only the adapters it uses (an hf group's engine child: adapters.engines.hf)."""

    def __init__(self) -> None:
        self.modules: dict[str, str] = {}            # framework name -> its module (adapters/__init__.py)
        self._classes: dict[str, type[Adapter]] = {}

    def __getitem__(self, name: str) -> type[Adapter]:
        if name not in self._classes and name in self.modules:
            importlib.import_module(self.modules[name])   # its @register adds it
        return self._classes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self.modules, *self._classes]))

    def __len__(self) -> int:
        return len(dict.fromkeys([*self.modules, *self._classes]))

    def __contains__(self, name: object) -> bool:
        return name in self.modules or name in self._classes

    def add(self, cls: type[Adapter]) -> None:
        if self._classes.get(cls.name, cls) is not cls:
            raise ValueError(f"two adapters register the framework name {cls.name!r}")
        self._classes[cls.name] = cls


ADAPTERS = Registry()


def register(cls: type[Adapter]) -> type[Adapter]:
    ADAPTERS.add(cls)
    return cls


def no_cuda_reason(engine: str) -> str | None:
    """Why a CUDA engine cannot start here, checked in the engine's own environment (its torch)."""
    import torch

    return None if torch.cuda.is_available() else f"{engine} needs CUDA, and torch sees no GPU here"


def one_length(output_len: int | list[int], engine: str) -> int:
    """The one output length of a batch, for an engine that takes a single length per call."""
    if isinstance(output_len, int):
        return output_len
    if len(set(output_len)) > 1:
        raise Unsupported(f"{engine}: one output length per batch call; this workload asks for "
                          f"{min(output_len)}-{max(output_len)} tokens per request within a batch")
    return output_len[0]


def normalize_quantization(name: str) -> str:
    return QUANTIZATION_ALIASES.get(name.lower(), name.lower())


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
