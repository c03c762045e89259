"""The matrix YAML as pydantic models: the axes, models, workloads, measure, serve, tolerances and
run sections, each with its defaults. Checks across sections live in orchestrator/matrix/validate.py.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictInt, field_validator

from adapters.contract.arrivals import MatrixArrival, PoissonArrival
from adapters.contract.specs import RepeatsAuto, SeedsAuto
from orchestrator.inputs import task_sets
from orchestrator.inputs.lengths import LengthDist
from orchestrator.inputs.task_sets import TaskEntry
from orchestrator.values import shown

AXES = ("framework", "model", "quantization", "batch_size", "flags", "input_len", "output_len", "mode", "request_rate",
        "workload", "env")


MODES = ("offline", "serve", "stream")

# bounds on every size a cell is made of: far above any real run, below what overflows an engine or fills a disk
MAX_BATCH = 65_536
MAX_TOKENS = 2**20      # input_len, output_len, scoring_len, sampled tokens: 1M tokens
MAX_REPEATS = 100_000   # repeats, score_repeats, seeds, stream requests, prompts
MAX_SEED = 2**32 - 1
Seed = Annotated[StrictInt, Field(ge=0, le=MAX_SEED)]


DEFAULT_FLAGS = "default"
SAMPLING_OVERRIDE = "sampling"   # the key of a flag set that is not an engine option


class MatrixError(ValueError):
    """All the mistakes found in one matrix, one `path: message` per line."""

    def __init__(self, problems: list[str], source: str = "matrix"):
        self.problems = problems
        super().__init__(f"{source}: {len(problems)} problem(s)\n" + "\n".join(f"  {p}" for p in problems))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelEntry(_Strict):
    source: str = Field(description="Local checkpoint dir, .gguf file, hub id, or builtin:tiny / builtin:tiny-qwen2")
    tokenizer: str | None = Field(None, description="Tokenizer dir, where the source has none (e.g. a .gguf)")
    trust_remote_code: bool = False
    revision: str | None = None
    endpoint: str | None = Field(None, description="Base URL of a server already running this model "
                                 "(OpenAI-compatible, e.g. http://10.0.0.5:8000): its cells are serve cells only, "
                                 "and nothing is started or stopped; `source` then only gives the tokenizer")
    api_key_env: str | None = Field(None, description="Environment variable holding the endpoint's API key "
                                    "(sent as a bearer token; the key itself is never stored)")

    @field_validator("endpoint")
    @classmethod
    def _http_url(cls, v: str | None) -> str | None:
        if v is not None and not (v.startswith("http://") or v.startswith("https://")):
            raise ValueError(f"expected an http:// or https:// URL, got {shown(v)}")
        return v.rstrip("/") if v else v


class RecipeRef(_Strict):
    """`quantization: {recipe: path}`: a per-tensor recipe (the YAML `bench explain --recipe` writes,
    orchestrator/matrix/recipes.py). The path is looked up like the matrix's other paths; the rest is filled
    from the file when the matrix is loaded, so the run's manifest holds what ran."""

    recipe: str = Field(description="The recipe's YAML file (relative: to the matrix file's folder)")
    name: str | None = Field(None, description="Filled when loaded: the file's name, else its digest's first 8")
    base: str | None = Field(None, description="Filled when loaded: the ggml level the overrides apply over")
    tensor_types: dict[str, str] | None = Field(None, description="Filled when loaded: regex -> ggml type")
    digest: str | None = Field(None, description="Filled when loaded: sha256 of the file's bytes")
    imatrix: str | None = Field(None, description="Filled when loaded: the recipe's importance matrix file, if it names one")

    @property
    def label(self) -> str:
        """The cell's quantization as rows and tables name it: recipe-<name>."""
        return f"recipe-{self.name or 'unloaded'}"


class Axes(_Strict):
    framework: list[str] = Field(min_length=1)
    model: list[str] = Field(min_length=1)
    quantization: list[Union[str, RecipeRef]] = Field(["fp32"], min_length=1, description="A level (fp32, q4_0, ...) "
                                                      "or {recipe: path} (llamacpp: a per-tensor recipe)")
    batch_size: list[Annotated[StrictInt, Field(ge=1, le=MAX_BATCH)]] = Field([1], min_length=1)
    flags: list[str] = Field([DEFAULT_FLAGS], min_length=1)
    input_len: list[Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)]] = Field([32], min_length=1)
    output_len: list[Annotated[StrictInt, Field(ge=1, le=MAX_TOKENS)]] = Field([16], min_length=1)
    mode: list[Literal["offline", "serve", "stream"]] = Field(["offline"], min_length=1, description="offline: the engine's Python "
                                                              "API, static batches; stream: its Python API, every "
                                                              "request submitted at once, at most batch_size running "
                                                              "(the engine's continuous batching); serve: its own "
                                                              "OpenAI-compatible server under load")
    request_rate: list[Annotated[float, Field(gt=0)]] = Field([math.inf], min_length=1, description="Serve cells: requests/s "
                                                              "arriving (see serve.arrival), at most batch_size in "
                                                              "flight; .inf: a closed loop of batch_size requests")
    workload: list[str] | None = Field(None, min_length=1, description="Names of `workloads` entries, each cell running one "
                                       "(default: every entry, in order); none with a single `workload` section")
    env: list[str] | None = Field(None, min_length=1, description="Names of `envs` entries: the same cell in each engine "
                                  "environment (default: every entry, in order); cells that differ only in env run on "
                                  "one node with their timed repeats interleaved")


class SyntheticWorkload(_Strict):
    kind: Literal["synthetic"] = "synthetic"
    seed: Seed = 0
    shared_prefix_len: int = Field(0, ge=0, description="Tokens every prompt of a prefix group shares "
                                   "(prefix-cache workloads)")
    prefix_groups: int = Field(1, ge=1, description="Distinct shared prefixes (N system prompts, each shared by "
                               "every N-th request); 1: one prefix for all")
    input_lengths: LengthDist | None = Field(None, description="Prompt lengths drawn per request (seeded) instead "
                                             "of the input_len axis")
    output_lengths: LengthDist | None = Field(None, description="Output lengths drawn per request (seeded) "
                                              "instead of the output_len axis")


class DatasetWorkload(_Strict):
    kind: Literal["jsonl", "text"]
    path: str
    field: str = Field("text", description="JSONL field holding the prompt text, or a list of token ids")
    output_field: str | None = Field(None, description="JSONL field holding a reference output: each request's "
                                     "output length is its token count (capped by output_len)")
    seed: Seed = 0
    cluster_only: bool = Field(False, description="The path exists only where the run happens (a cluster's "
                               "storage): bench validate does not open it")


class ShareGptWorkload(_Strict):
    """ShareGPT-style conversations (JSON list or JSONL of {conversations: [{from, value}]} or {messages:
    [{role, content}]}). Single-turn: each conversation's first user turn, output length from the reply
    that follows. Multi-turn: every user turn of a conversation is a request whose prompt is the whole
    conversation so far (the earlier replies as the file has them), sent when the previous turn has
    ended plus think_time_s; a conversation stops at the first turn that would exceed input_len."""

    kind: Literal["sharegpt"] = "sharegpt"
    path: str
    multi_turn: bool = False
    think_time_s: float = Field(0.0, ge=0, description="Multi-turn, serve cells: wait between a turn's end and "
                                "the next turn of its conversation")
    max_turns: int | None = Field(None, ge=1, description="Most user turns taken per conversation")
    chat: bool = Field(False, description="Render each request's messages with the model's chat template "
                       "(offline, stream) and send them to /v1/chat/completions (serve); false: 'User: ...' text "
                       "to /v1/completions")
    seed: Seed = 0
    cluster_only: bool = Field(False, description="The path exists only where the run happens: bench validate "
                               "does not open it")


class HfWorkload(_Strict):
    """A Hugging Face `datasets` dataset (the optional extra `datasets`): a hub id, a local dataset dir, or
    a data file (parquet, json, jsonl, csv), read with datasets.load_dataset. Either `field` (prompts, as
    kind jsonl) or `messages_field` (conversations, as kind sharegpt, with its multi-turn and chat options)."""

    kind: Literal["hf"] = "hf"
    name: str = Field(description="Hub id (fetched on the node that runs the cell), local dataset dir, or data file")
    config: str | None = Field(None, description="The dataset's configuration (subset) name")
    split: str = "train"
    field: str | None = Field(None, description="Column holding the prompt text, or a list of token ids")
    messages_field: str | None = Field(None, description="Column holding a conversation: [{from, value}] or "
                                       "[{role, content}]")
    output_field: str | None = Field(None, description="With field: column holding a reference output (each "
                                     "request's output length is its token count, capped by output_len)")
    multi_turn: bool = False
    think_time_s: float = Field(0.0, ge=0)
    max_turns: int | None = Field(None, ge=1)
    chat: bool = Field(False, description="With messages_field: the model's chat template and "
                       "/v1/chat/completions, as for kind sharegpt")
    seed: Seed = 0


class TraceWorkload(_Strict):
    """A timestamped request log replayed (orchestrator/inputs/traces.py): Mooncake's JSONL, one request a line
    with `timestamp` (ms), `input_length`, `output_length` and `hash_ids` (one id per block of block_size prompt
    tokens; requests that share an id share that block). Serve cells send each request at its timestamp x
    time_scale after the first (the trace's own schedule: no request_rate); every mode gets its prompts and
    output lengths (capped at the input_len and output_len axes)."""

    kind: Literal["trace"] = "trace"
    path: str
    time_scale: float = Field(1.0, gt=0, allow_inf_nan=False, description="Multiplies the trace's times: 0.5 replays it twice as fast")
    block_size: int = Field(512, ge=1, description="Prompt tokens per hash id (Mooncake's traces: 512)")
    seed: Seed = Field(0, description="Draws each block's tokens (the same hash id: the same tokens)")
    cluster_only: bool = Field(False, description="The path exists only where the run happens: bench validate "
                               "does not open it")


Workload = Annotated[Union[SyntheticWorkload, DatasetWorkload, ShareGptWorkload, HfWorkload, TraceWorkload],
                     Field(discriminator="kind")]


# fields added after cell ids existed: left out of a cell's canonical form at their defaults, so the
# cells of an older matrix keep their ids
_NEW_WORKLOAD_FIELDS = {"prefix_groups": 1, "input_lengths": None, "output_lengths": None, "output_field": None,
                        "cluster_only": False, "chat": False}


_NEW_MEASURE_FIELDS = {"stream_requests": 64}


def stable_dump(section: BaseModel) -> dict:
    """A workload or measure section as cell ids hash it: fields newer than cell ids only where set."""
    new = _NEW_WORKLOAD_FIELDS | _NEW_MEASURE_FIELDS
    # paired_timing is how a run arranges its timings (orchestrator/execution/engine_child/spec.py: timing_twins),
    # not what a cell is: never in an id
    out = {k: v for k, v in section.model_dump().items() if not (k in new and v == new[k]) and k != "paired_timing"}
    if isinstance(out.get("sampling"), dict):
        # rescore is the run's step after its cells, not what a cell measures: never in an id
        default_auto = out["sampling"].get("auto_seeds") == SeedsAuto().model_dump()
        out["sampling"] = {k: v for k, v in out["sampling"].items()
                           if k != "rescore" and not (k == "auto_seeds" and default_auto)}
    return out


def _count_or_auto(what: str):
    """A count of at least 1, or 'auto' (the harness decides when it has enough)."""
    def check(v):
        if isinstance(v, int) and not 1 <= v <= MAX_REPEATS:
            raise ValueError(f"expected a number of {what} from 1 to {MAX_REPEATS:,}, or 'auto'")
        return v
    return Annotated[Union[StrictInt, Literal["auto"]], AfterValidator(check)]


SeedCount, RepeatCount = _count_or_auto("seeds"), _count_or_auto("timed batches")


class Sampling(_Strict):
    """measure.sampling: seeded samples through each engine's own sampler (the sampling layer)."""

    temperature: float = Field(0.8, gt=0)
    top_p: float = Field(1.0, gt=0, le=1, description="1.0: off")
    top_k: StrictInt = Field(0, ge=0, le=MAX_REPEATS, description="0: off")
    min_p: float = Field(0.0, ge=0, lt=1, description="0: off (vLLM refuses min_p with speculative decoding)")
    seeds: SeedCount = Field(16, description="Seeds per prompt (seed_offset .. seed_offset + seeds - 1); auto: "
                             "until the distribution test could see tolerances.sampling_shift (auto_seeds)")
    auto_seeds: SeedsAuto = Field(default_factory=SeedsAuto, description="seeds: auto draws min_seeds, then more "
                                  "until the cell's own spread says its test has 80% power for the tolerance's "
                                  "shift, at most max_seeds")
    seed_offset: StrictInt = Field(0, ge=0, le=MAX_SEED)
    tokens: StrictInt = Field(16, ge=1, le=MAX_TOKENS, description="Tokens per sample (EOS ignored)")
    prompts: StrictInt | None = Field(None, ge=1, le=MAX_REPEATS, description="How many scoring prompts to sample (default: all)")
    repeats: StrictInt = Field(2, ge=1, le=MAX_REPEATS, description="The same seeds again: is a seed repeatable within one engine?")
    next_top_k: int = Field(128, ge=0, description="Candidates stored for each prompt's next token, which the "
                            "first sampled token is tested against (vLLM caps it at its max_logprobs option, 128); "
                            "0: no first-token test")
    rescore: bool = Field(True, description="After the cells, the baseline's engine scores every cell's samples "
                          "(teacher forced), so the distribution test judges both sides under one model's "
                          "probabilities; false: each sample is scored by the engine that drew it")


class Measure(_Strict):
    warmup: StrictInt = Field(1, ge=0, le=MAX_REPEATS)
    repeats: RepeatCount = Field(3, description="Timed batches (serve: timed runs) per cell; auto: until the "
                                 "throughput's 95% interval is narrow enough (auto_repeats)")
    auto_repeats: RepeatsAuto = Field(default_factory=RepeatsAuto, description="repeats: auto stops when the output "
                                      "throughput's 95% interval is within half_width (relative), after min_repeats, "
                                      "at max_repeats or after max_s seconds of timed batches")
    ignore_eos: bool = Field(True, description="Fixed output length for throughput")
    stream_requests: StrictInt = Field(64, ge=1, le=MAX_REPEATS, description="Stream cells: requests per timed run (all submitted at "
                                 "once, at most batch_size running)")
    top_k: StrictInt = Field(20, ge=1, le=MAX_REPEATS, description="Candidates stored per scored position")
    scoring_prompts: StrictInt = Field(8, ge=1, le=MAX_REPEATS)
    scoring_len: StrictInt = Field(64, ge=2, le=MAX_TOKENS, description="Tokens per scoring prompt (teacher forced)")
    greedy_tokens: StrictInt = Field(16, ge=1, le=MAX_TOKENS, description="Greedy tokens generated after each scoring prompt")
    score_repeats: StrictInt = Field(2, ge=1, le=MAX_REPEATS, description="Scoring passes per cell; 2 gives the run-to-run noise floor")
    scoring_text: str = Field("builtin", description="Text the scoring prompts are cut from: 'builtin' or a path")
    sampling: Sampling | None = Field(None, description="Seeded samples of the scoring prompts (the sampling "
                                      "layer): compared seed by seed and as a distribution")
    paired_timing: bool | None = Field(None, description="The timed repeats of each cell and of its baseline take "
                                       "turns, so the speed ratio is paired. null: only where the baseline is in the "
                                       "cell's own engine load (a selector fixing batch_size: batch 4 against batch 1), "
                                       "inside that engine; true: also the baseline's engine loaded beside the cell's "
                                       "as a timing twin on one node; false: never (Welch against the baseline's own "
                                       "row). docs/matrix.md says what each costs")


class Search(_Strict):
    """serve.search: per serve configuration, the highest load meeting every SLO given (adapters/serving/slo_search.py)."""

    variable: Literal["rate", "concurrency"] = Field("rate", description="rate: requests/s arriving (serve.arrival), "
                                                     "at most batch_size in flight; concurrency: requests in flight "
                                                     "in a closed loop (batch_size is then the search's)")
    low: float = Field(gt=0, description="The first load probed; a miss there: no load meets the SLOs")
    high: float = Field(gt=0, description="The highest load probed")
    growth: float = Field(4.0, gt=1, description="Bracketing: each probe's load x growth until one misses")
    resolution: float = Field(0.1, gt=0, description="rate: bisection stops when first miss / max met - 1 <= this "
                              "(concurrency: when they are adjacent integers)")
    max_probes: int = Field(8, ge=2, description="At most this many probes per configuration")
    ttft_p99_ms: float | None = Field(None, gt=0, description="SLO: TTFT p99 at most this")
    tpot_p99_ms: float | None = Field(None, gt=0, description="SLO: TPOT p99 at most this")
    e2e_p99_ms: float | None = Field(None, gt=0, description="SLO: end-to-end latency p99 at most this")
    goodput: float | None = Field(None, gt=0, le=1, description="SLO: at least this share of the planned requests "
                                  "within the per-request SLOs (serve.slo_ttft_ms, slo_tpot_ms, slo_e2e_ms)")
    judge: Literal["point", "interval"] = Field("point", description="point: a p99 as measured meets its SLO; "
                                                "interval: the upper end of its distribution-free interval does "
                                                "(needs 368 requests per probe at level 0.95)")
    level: float = Field(0.95, gt=0, lt=1, description="Confidence level of the intervals stored with every check")


class Serve(_Strict):
    """Serve cells: each is one load point (batch_size = requests in flight at most, request_rate) run
    `measure.repeats` times against the engine's server, after `measure.warmup` x batch_size untimed requests."""

    requests: StrictInt = Field(32, ge=1, le=MAX_REPEATS, description="Requests per timed run of a load point")
    time_limit_s: float = Field(120, gt=0, description="A timed run sends nothing after this, and requests still "
                                "running then are cut (and counted as errors)")
    arrival: MatrixArrival = Field(default_factory=PoissonArrival, description="How requests arrive: constant "
                                   "(evenly spaced) or poisson (exponential gaps, seeded) at request_rate; {kind: gamma, "
                                   "burstiness: B} gamma gaps at request_rate (vllm bench serve --burstiness: 1 "
                                   "Poisson, < 1 bursty); {kind: ramp, start_rate, end_rate, duration_s, burstiness} a "
                                   "rate rising linearly over duration_s (its own rates: no request_rate axis). A trace "
                                   "workload's cells arrive at the trace's times instead")
    request_timeout_s: float = Field(60, gt=0, description="Per request; a request over it is an error")
    slo_ttft_ms: float | None = Field(None, gt=0, description="Goodput counts requests within both SLOs")
    slo_tpot_ms: float | None = Field(None, gt=0)
    slo_e2e_ms: float | None = Field(None, gt=0, description="Goodput also counts requests within this end-to-end latency")
    search: Search | None = Field(None, description="Search each serve configuration for the highest request rate "
                                  "(or concurrency) meeting the SLOs, instead of the request_rate axis")
    capture_logprobs: bool = Field(True, description="Capture greedy outputs with logprobs through the API "
                                   "(measure.scoring_*), so served cells compare with offline ones")


class Tolerances(_Strict):
    """Thresholds for verdicts (orchestrator/judge/logits.py says how each is used; the report and the
    gate read them from here, never restating a default). Each is a finite number: a NaN or infinite bound
    would decide every verdict one way."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    atol: float = Field(1e-3, ge=0, description="Max abs difference of the actual token's teacher-forced logprob "
                        "for 'lossless' (above it: at best 'near-lossless')")
    kl_lossless: float = Field(1e-4, ge=0, description="Max mean KL(baseline || cell) over positions for 'lossless'")
    kl_near: float = Field(1e-2, ge=0, description="Max mean KL for 'near-lossless' (above it: 'lossy')")
    top1_lossless: float = Field(1.0, ge=0, le=1, description="Min share of positions with the same top-1 token for 'lossless'")
    top1_near: float = Field(0.95, ge=0, le=1, description="Min top-1 agreement for 'near-lossless'")
    greedy_match_lossless: float = Field(1.0, ge=0, le=1, description="Min share of prompts whose greedy tokens equal "
                                         "the baseline's exactly, for 'lossless'")
    greedy_match_near: float = Field(0.9, ge=0, le=1, description="Min share of prompts that match or are 'close' "
                                     "(vLLM check_logprobs_close) for 'near-lossless'")
    ppl_rel_lossless: float = Field(1e-3, ge=0, description="Max |perplexity / baseline perplexity - 1| for 'lossless'")
    ppl_rel_near: float = Field(2e-2, ge=0, description="Max |relative perplexity change| for 'near-lossless'")
    noise_factor: float = Field(1.0, ge=0, description="A metric no further from exact than noise_factor x the "
                                "baseline's own noise floor (run-to-run, batch 1 vs largest batch) counts as "
                                "'lossless'; 0 turns the noise floor off")
    sampling_alpha: float = Field(0.01, gt=0, lt=1, description="Level of the sampling layer's distribution tests "
                                  "together (each test at sampling_alpha / tests run): below it, 'different'")
    sampling_shift: float = Field(0.05, gt=0, description="The largest shift of the mean sampled-token logprob "
                                  "(nats/token) a 'same distribution' may hide: where the smallest shift the "
                                  "two-sample test could see (80% power at its level) is larger, the verdict is "
                                  "'not distinguishable'; 'seeds needed' is sized for it")
    task_alpha: float = Field(0.05, gt=0, lt=1, description="Level of the paired tests of the task layer: a change "
                              "with p >= task_alpha is 'no change' (McNemar's exact test, or a paired bootstrap)")
    task_tolerance: float = Field(0.02, gt=0, description="The largest relative change of a task's figure "
                                  "(|cell / baseline - 1|) a 'no change' may hide: where the smallest change the "
                                  "paired test could see (80% power at task_alpha) is larger, the verdict is "
                                  "'not distinguishable'")
    speed_tolerance: float = Field(0.05, gt=0, description="The largest relative speed change (|ratio - 1|) a "
                                   "'no difference' may hide: where the ratio's 95% interval holds 1 but reaches "
                                   "past 1 / (1 + speed_tolerance) or 1 + speed_tolerance, the call is 'not "
                                   "distinguishable'")


class EngineEnv(_Strict):
    """One engine environment of the env axis: its interpreter (one for every framework, or per framework) and
    environment variables its engine children get."""

    python: str | dict[str, str] = Field(description="The interpreter, e.g. .venvs/vllm-0.31/bin/python, or framework "
                                         "-> interpreter (a framework it does not name: run.python's, else .venvs/<fw>)")
    env_vars: dict[str, str] = Field(default_factory=dict, description="Environment variables of its engine children "
                                     "(e.g. a changed default); recorded in each cell's provenance")
    cluster_only: bool = Field(False, description="The interpreter exists only on the nodes: not checked by validate")

    def python_for(self, framework: str) -> str | None:
        return self.python if isinstance(self.python, str) else self.python.get(framework)


class Run(_Strict):
    device: Literal["auto", "cpu", "cuda"] = "auto"
    cpus_per_group: int | Literal["node"] = Field("node", description="'node' gives a CPU group a whole node, so timings are not shared")
    gpus_per_group: int | None = Field(None, ge=0, description="Default: the tensor-parallel size, 1 on CUDA")
    load_timeout_s: float = Field(1800, gt=0)
    cell_timeout_s: float = Field(900, gt=0)
    python: dict[str, str] = Field(default_factory=dict, description="Per-framework Python interpreter, e.g. vllm: .venvs/vllm/bin/python")
    env_resources: bool = Field(False, description="Send each group only to nodes that declared its framework's "
                                "environment as a Ray custom resource env_<framework> (ray start --resources)")
    accelerator_type: str | None = Field(None, description="Ray accelerator type every group needs, e.g. H100")
    node_retries: int = Field(2, ge=0, description="Times a group is run again elsewhere when its node dies")
    split_groups: bool = Field(True, description="Cut an engine group estimated to outlast the rest of the run into "
                               "parts on several nodes (each part loads the engine once)")
    steal_cells: bool = Field(True, description="Once nothing waiting can use a node, move the unstarted cells of the "
                              "part projected to end last there (it loads the engine again; each cell runs once)")


def _synthetic_kind(v):
    return {"kind": "synthetic", **v} if isinstance(v, dict) and "kind" not in v else v


class Matrix(_Strict):
    name: str = Field("matrix", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
                      description="The run's name: results/NAME is its default run dir, so a safe file name "
                      "(letters, digits, '.', '_', '-'; not starting with '.' or '-')")
    models: dict[str, Union[str, ModelEntry]]
    axes: Axes
    flags: dict[str, dict[str, dict[str, Any]]] = Field(default_factory=dict, description="framework -> flag-set name -> "
                                                        "engine options; a `sampling` key in a set overrides "
                                                        "measure.sampling fields for its cells (a sampler change "
                                                        "as a cell beside its baseline)")
    include: list[dict[str, Any]] = Field(default_factory=list, description="Extra cells: one value per axis")
    exclude: list[dict[str, Any]] = Field(default_factory=list, description="Cells matching every key are dropped; a value may be a list")
    workload: Workload = Field(default_factory=SyntheticWorkload, description="The one workload of every cell "
                               "(or give named `workloads` and the `workload` axis instead)")
    workloads: dict[str, Workload] | None = Field(None, description="Named workloads, a `workload` axis of the "
                                                  "matrix: each cell runs the one its axis value names")
    envs: dict[str, EngineEnv] | None = Field(None, description="Named engine environments, an `env` axis of the "
                                              "matrix: the same configuration run in each (e.g. two engine versions)")
    measure: Measure = Field(default_factory=Measure)
    baseline: dict[str, Any] = Field(default_factory=lambda: {"framework": "hf", "quantization": "fp32", "flags": DEFAULT_FLAGS,
                                                              "mode": "offline"},
                                     description="Axis values of the baseline; axes not named match the cell's own")
    tolerances: Tolerances = Field(default_factory=Tolerances)
    tasks: list[Union[str, TaskEntry]] = Field(default_factory=list, description="Task sets every cell runs after "
                                               "its timings and logprobs (orchestrator/inputs/task_sets.py): built-in names "
                                               "(" + ", ".join(task_sets.BUILTIN_TASKS) + ") or mappings with kind: "
                                               "generation | choice | lm_eval")
    serve: Serve = Field(default_factory=Serve)
    run: Run = Field(default_factory=Run)

    @field_validator("workload", mode="before")
    @classmethod
    def _synthetic_by_default(cls, v):
        return _synthetic_kind(v)

    @field_validator("workloads", mode="before")
    @classmethod
    def _each_synthetic_by_default(cls, v):
        return {k: _synthetic_kind(w) for k, w in v.items()} if isinstance(v, dict) else v

    def workload_of(self, name: str | None) -> Workload:
        """A cell's workload: the named entry, or the single `workload` section (name None)."""
        return self.workload if name is None else self.workloads[name]

    def named_workloads(self) -> list[tuple[str, Workload]]:
        """(YAML path, workload) of every workload the cells run, for per-workload checks."""
        if not self.workloads:
            return [("workload", self.workload)]
        return [(f"workloads.{n}", self.workloads[n]) for n in axis_values(self, "workload") if n in self.workloads]

    def model_entry(self, name: str) -> ModelEntry:
        entry = self.models[name]
        return ModelEntry(source=entry) if isinstance(entry, str) else entry

    def flag_sets(self, framework: str) -> dict[str, dict[str, Any]]:
        sets = {DEFAULT_FLAGS: {}}
        sets.update(self.flags.get(framework, {}))
        return sets

    def engine_options(self, framework: str, flags: str) -> dict[str, Any]:
        """A flag set's engine options: everything in it but its `sampling` override."""
        return {k: v for k, v in (self.flag_sets(framework)[flags] or {}).items() if k != SAMPLING_OVERRIDE}

    def sampling_override(self, framework: str, flags: str) -> dict[str, Any]:
        """The measure.sampling fields a flag set sets for its cells (empty: none)."""
        return dict((self.flag_sets(framework).get(flags) or {}).get(SAMPLING_OVERRIDE) or {})

    def sampling_for(self, framework: str, flags: str) -> Sampling | None:
        """The seeded-sampling settings of a flag set's cells: measure.sampling with the set's override."""
        override = self.sampling_override(framework, flags)
        if self.measure.sampling is None or not override:
            return self.measure.sampling
        return Sampling.model_validate(self.measure.sampling.model_dump() | override)


def axis_values(m: Matrix, axis: str) -> list:
    """An axis' values; the workload axis defaults to every named workload, and is [None] (one cell each)
    with a single `workload` section; the env axis likewise with `envs` ([None]: no env axis)."""
    if axis == "workload":
        return list(m.axes.workload or m.workloads or [None])
    if axis == "env":
        return list(m.axes.env or m.envs or [None])
    return getattr(m.axes, axis)
