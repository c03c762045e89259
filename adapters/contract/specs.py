"""What the driver hands a worker, typed: the group's spec (`GroupSpec`: `LoadSpec`, `CellSpec`,
`ScoringSpec`, `ServeSpec`, the sampler and the seeded samples, and the tasks as token ids: `TaskSpec`).
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal, Union

from pydantic import Field, model_validator

from adapters.contract.arrivals import Arrival, MatrixArrival
from adapters.contract.model import ContractModel


class ModelSpec(ContractModel):
    name: str                      # the matrix's name for the model
    source: str                    # local path or hub id (resolved by the driver; builtin: already built)
    trust_remote_code: bool = False
    revision: str | None = None


class ModelFacts(ContractModel):
    """A model as the driver's preflight resolved it, once per model, before any engine starts: what each
    adapter's `model_problem` checks a (framework, model, quantization, flags) pair against."""

    source: str                    # resolved: builtin: built, a hub id as given
    kind: Literal["dir", "gguf", "hub", "endpoint", "elsewhere"]   # elsewhere: a path not on this machine
    config: dict[str, Any] | None = None    # config.json, where one is here (a hub model's from the hub or its cache)
    architecture: str | None = None         # config's architectures[0] (text_config's for multimodal configs)
    head_dim: int | None = None             # attention head size (config head_dim, else hidden / heads)


class LoadSpec(ContractModel):
    """What one engine group hands its adapter: everything that needs a fresh engine."""

    framework: str
    model: ModelSpec
    quantization: str
    options: dict[str, Any] = Field(default_factory=dict)
    device: Literal["cpu", "cuda"] = "cpu"
    gpus: int = 0
    cache_dir: str = ""            # where conversions and quantized files are cached
    seed: int = 0
    context_len: int = 0           # tokens the group's longest request needs (prompt + output)
    max_running: int | None = None # stream cells: the most requests the engine's scheduler runs at once


class RepeatsAuto(ContractModel):
    """Timed batches repeat until the throughput's 95% interval is within `half_width` (relative), at
    least `min_repeats` and at most `max_repeats` times, or until `max_s` seconds of timed batches."""

    half_width: float = Field(0.02, gt=0)
    min_repeats: int = Field(3, ge=2)
    max_repeats: int = Field(50, ge=2)
    max_s: float = Field(60.0, gt=0)


class SeedsAuto(ContractModel):
    """measure.sampling.seeds: auto draws `min_seeds` seeds, then `step` more (or as many as the estimate
    asks) until the cell's own spread says the two-sample test could see the sampling tolerance's shift
    (adapters/contract/seed_power.py), at most `max_seeds`."""

    min_seeds: int = Field(16, ge=2)
    step: int = Field(16, ge=1)
    max_seeds: int = Field(256, ge=2)

    @model_validator(mode="after")
    def _budget_above_the_first_draw(self) -> "SeedsAuto":
        if self.max_seeds < self.min_seeds:
            raise ValueError(f"max_seeds ({self.max_seeds}) is below min_seeds ({self.min_seeds})")
        return self


class CellSpec(ContractModel):
    cell_id: str
    batch_size: int
    output_len: int
    warmup: int
    repeats: int                   # timed batches (serve: timed runs); with `auto`, the most prompts prepared for
    auto: RepeatsAuto | None = None
    ignore_eos: bool = True
    timing_prompts: list[list[int]]
    timing_texts: list[str] | None = None     # serve: for a server that takes text only
    timing_messages: list[list[dict[str, str]]] | None = None   # serve, chat workloads: each prompt's messages,
                                               # sent to /v1/chat/completions (timing_prompts: our template's ids)
    request_rate: float | None = None          # serve and stream: requests/s; None: a closed loop, or a
                                               # stream submitted at once (or on a ramp's or trace's times)
    output_lens: list[int] | None = None       # per timing prompt (a drawn or dataset workload); None: output_len
    follows: list[int] | None = None           # serve, multi-turn: k > 0 sends request i after request i - k ends
    think_time_s: float = 0.0                  # ... plus this wait
    stream_requests: int = 0                   # stream cells: requests per timed run
    # serve: a trace workload's own times (over serve.arrival); stream: how the timed runs' requests arrive
    # (serve.arrival at request_rate, a ramp, a trace's times); None: a stream submitted at once
    arrival: Arrival | None = None
    notes: list[str] = Field(default_factory=list)   # what the workload drew (lengths, groups), for the row
    # its baseline cell where that is in this group (e.g. batch 4 against batch 1): that cell's timed batch takes
    # turns with this cell's repeats, in one engine (adapters/worker/timing_partner.py)
    timing_partner: str | None = None


class ScoringSpec(ContractModel):
    prompts: list[list[int]]
    texts: list[str] | None = None
    top_k: int
    greedy_tokens: int
    repeats: int


class SearchSpec(ContractModel):
    """serve.search: the highest load (request rate, or concurrency in a closed loop) whose probes meet
    every SLO given, by bracketing up from `low` by `growth` and bisecting; see adapters/serving/slo_search.py."""

    variable: Literal["rate", "concurrency"] = "rate"
    low: float
    high: float
    growth: float = 4.0
    resolution: float = 0.1          # rate: stop when first miss / max met - 1 <= this (concurrency: adjacent)
    max_probes: int = 8
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    e2e_p99_ms: float | None = None
    goodput: float | None = None     # least share of planned requests within the per-request SLOs
    judge: Literal["point", "interval"] = "point"
    level: float = 0.95


class ServeSpec(ContractModel):
    """The matrix's serve section, resolved for one group."""

    requests: int
    time_limit_s: float
    arrival: MatrixArrival
    request_timeout_s: float
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_e2e_ms: float | None = None
    capture_logprobs: bool = True
    endpoint: str | None = None    # someone else's server: nothing is started or stopped
    api_key_env: str | None = None
    startup_timeout_s: float = 600.0
    seed: int = 0
    search: SearchSpec | None = None   # every cell of the group is an SLO search (adapters/serving/slo_search.py)


class SamplerSettings(ContractModel):
    """The engine's own sampler, as the matrix sets it (measure.sampling). 0 turns top_k and min_p off."""

    temperature: float = Field(gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0, lt=1)


def engine_seed(seed: int, prompt_index: int) -> int:
    """The seed an engine gets for sample `seed` of prompt `prompt_index`: a hash of both, below 2^31 (every
    engine takes it). The same seed for every prompt would drive all prompts' samples through one random
    stream (common random numbers: llama.cpp's first uniform picks the same rank everywhere), making the
    samples of one seed dependent across prompts; a stream per (prompt, seed) makes them independent,
    and the same (prompt, seed) still gets the same stream in every cell."""
    digest = hashlib.blake2b(f"{seed}:{prompt_index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


class SamplingSpec(ContractModel):
    """Seeded samples of each prompt: seeds seed_offset .. seed_offset + seeds - 1 (the engine gets
    `engine_seed(seed, prompt)`), `tokens` each (EOS ignored), `repeats` times with the same seeds (is a
    seed repeatable within one engine?)."""

    prompts: list[list[int]]
    settings: SamplerSettings
    seeds: int
    seed_offset: int = 0
    tokens: int
    repeats: int = 2
    next_top_k: int = 128          # candidates stored for each prompt's next token (the first-token test)
    auto: SeedsAuto | None = None  # seeds: auto: `seeds` is the first draw; more until the power is reached
    auto_shift: float = 0.05       # the shift (nats/token) the test must see with 80% power, at auto_level
    auto_level: float = 0.005


class RescoredSample(ContractModel):
    prompt_index: int              # into RescoreSpec.prompts
    tokens: list[int]              # the sampled ids, as another cell's engine drew them


RESCORED_NPZ = "rescored.npz"    # what a rescoring child writes in its work dir (adapters.worker.rescoring)


class RescoreSpec(ContractModel):
    """The baseline's engine scoring seeded samples that other cells (and the baseline itself) drew: for each
    sample, teacher forced after its prompt, each sampled token's raw logprob and the `top_k` most likely
    tokens at its position (adapters.worker.rescoring); `batch_size` sequences per engine call. No cell runs."""

    prompts: list[list[int]]
    samples: list[RescoredSample]
    top_k: int
    batch_size: int = 8


HIDDEN_NPZ = "hidden.npz"        # what a hidden-state child writes in its work dir (adapters.worker.layer_capture)


class HiddenSpec(ContractModel):
    """The engine's residual stream after every block on `prompts` (Adapter.residual_states where the engine splits
    a block, else Adapter.hidden_states), captured `repeats` times (the baseline's own floor), for `bench explain
    --layers`. No cell runs."""

    prompts: list[list[int]]
    repeats: int = 1


class GenerationTaskSpec(ContractModel):
    """Greedy completions of each prompt, `max_tokens` each (EOS ignored: the driver cuts the text at
    EOS and the stop strings, which for greedy decoding is what stopping there would have given)."""

    kind: Literal["generation"] = "generation"
    name: str
    prompts: list[list[int]]
    max_tokens: int


class ChoiceTaskSpec(ContractModel):
    """Teacher-forced logprobs of each choice's continuation ids after its item's context."""

    kind: Literal["choice"] = "choice"
    name: str
    contexts: list[list[list[int]]]          # item -> choice -> context ids (lm-eval's split: the same for every
    choices: list[list[list[int]]]           # choice but an empty context's); item -> choice -> continuation ids


# lm-eval's aggregations (by its registry names) the task layer judges item by item; each is defined once,
# driver side, in orchestrator/inputs/task_metrics.py
JUDGED_AGGREGATIONS = ("mean", "perplexity", "weighted_perplexity", "bits_per_byte")


class LmEvalTaskSpec(ContractModel):
    """An lm-evaluation-harness task run on the cell's engine (adapters.worker.lm_eval_model)."""

    kind: Literal["lm_eval"] = "lm_eval"
    name: str
    task: str                                # the lm-eval task name
    include_path: str | None = None          # a folder of task YAMLs (local datasets)
    num_fewshot: int | None = None
    limit: int | None = None
    metric: str | None = None                # the per-item figure stored as the score (None: the task's first)
    tokenizer: str                           # the group's tokenizer source, so every engine sees the same ids
    trust_remote_code: bool = False
    max_length: int = 2048


TaskSpec = Annotated[Union[GenerationTaskSpec, ChoiceTaskSpec, LmEvalTaskSpec], Field(discriminator="kind")]


class GroupSpec(ContractModel):
    mode: Literal["offline", "serve", "stream"] = "offline"
    load: LoadSpec
    cells: list[CellSpec]
    scoring: ScoringSpec | None = None
    serve: ServeSpec | None = None
    tasks: list[TaskSpec] = Field(default_factory=list)    # run by every cell after its timings and logprobs
    sampling: SamplingSpec | None = None                   # seeded samples, after the logprobs
    rescore: RescoreSpec | None = None    # no cells: the engine scores other cells' samples (rescored.npz)
    hidden: HiddenSpec | None = None      # no cells: the engine captures its per-layer hidden states (hidden.npz)
    claims_dir: str | None = None    # set: a cell runs only if this worker claims it there first (adapters.contract.claims.claim_cell)
    # an env pair (adapters.contract.events.TurnWait): each phase of engine work waits for the supervisor's
    # go-ahead, a line on stdin, so the pair's timed repeats interleave
    turns: bool = False
    # the group's first cell timed twice, at the group's start and (moved) at its end: the run's drift check
    # (adapters.worker.group.drift_order; the judge widens speed intervals by the drift, orchestrator.judge.speed)
    drift_check: bool = True
    env_name: str | None = None      # the matrix env this group runs in: the worker describes the env (EnvFacts)
    env_vars: dict[str, str] = Field(default_factory=dict)   # the variables that env's definition sets (in its environ)
