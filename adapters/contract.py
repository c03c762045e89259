"""The contract between the orchestrator and the engine processes: what crosses the boundary, typed.

Both sides import this module and nothing else of each other; it depends on pydantic and numpy only,
so every engine environment can import it. It holds:

- the specs the driver writes for a worker (`GroupSpec`: `LoadSpec`, `CellSpec`, `ScoringSpec`, `ServeSpec`,
  and the tasks as token ids: `TaskSpec`),
- the worker's events (`WorkerEvent`, one typed kind per line of events.jsonl) and the facts an adapter
  reports after load (`LoadFacts`),
- what a cell's measurement becomes (`CellRecord`), with `missing`: metric -> why it is null, and what its
  engine produced for each task (`TaskOutput`: greedy ids, choice logprobs, lm-eval's scored items),
- the logprob row layout (`LOGPROB_COLUMNS`; the store derives its Parquet schema from it) and the one
  sparse top-k rule (`topk_dense`, `topk_sparse`),
- the timing types every adapter and the load generator fill (`RequestTiming`, `TimedRun`) and the one
  function that turns them into every latency, throughput and goodput figure (`summarize`).

Where each figure is taken, per adapter and mode, is written in results/README.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Annotated, Any, Iterable, Literal, Sequence, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ------------------------------------------------------------------------------------------------
# specs: what the driver hands a worker


class ModelSpec(_Model):
    name: str                      # the matrix's name for the model
    source: str                    # local path or hub id (resolved by the driver; builtin: already built)
    trust_remote_code: bool = False
    revision: str | None = None


class LoadSpec(_Model):
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


class RepeatsAuto(_Model):
    """Timed batches repeat until the throughput's 95% interval is within `half_width` (relative), at
    least `min_repeats` and at most `max_repeats` times, or until `max_s` seconds of timed batches."""

    half_width: float = Field(0.02, gt=0)
    min_repeats: int = Field(3, ge=2)
    max_repeats: int = Field(50, ge=2)
    max_s: float = Field(60.0, gt=0)


class CellSpec(_Model):
    cell_id: str
    batch_size: int
    output_len: int
    warmup: int
    repeats: int                   # timed batches (serve: timed runs); with `auto`, the most prompts prepared for
    auto: RepeatsAuto | None = None
    ignore_eos: bool = True
    timing_prompts: list[list[int]]
    timing_texts: list[str] | None = None     # serve: for a server that takes text only
    request_rate: float | None = None          # serve: requests/s; None: a closed loop
    output_lens: list[int] | None = None       # per timing prompt (a drawn or dataset workload); None: output_len
    follows: list[int] | None = None           # serve, multi-turn: k > 0 sends request i after request i - k ends
    think_time_s: float = 0.0                  # ... plus this wait
    stream_requests: int = 0                   # stream cells: requests per timed run, submitted at once
    notes: list[str] = Field(default_factory=list)   # what the workload drew (lengths, groups), for the row


class ScoringSpec(_Model):
    prompts: list[list[int]]
    texts: list[str] | None = None
    top_k: int
    greedy_tokens: int
    repeats: int


class SearchSpec(_Model):
    """serve.search: the highest load (request rate, or concurrency in a closed loop) whose probes meet
    every SLO given, by bracketing up from `low` by `growth` and bisecting; see adapters/slo_search.py."""

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


class ServeSpec(_Model):
    """The matrix's serve section, resolved for one group."""

    requests: int
    time_limit_s: float
    arrival: Literal["constant", "poisson"]
    request_timeout_s: float
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_e2e_ms: float | None = None
    capture_logprobs: bool = True
    endpoint: str | None = None    # someone else's server: nothing is started or stopped
    api_key_env: str | None = None
    startup_timeout_s: float = 600.0
    seed: int = 0
    search: SearchSpec | None = None   # every cell of the group is an SLO search (adapters/slo_search.py)


class SamplerSettings(_Model):
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


class SamplingSpec(_Model):
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


class GenerationTaskSpec(_Model):
    """Greedy completions of each prompt, `max_tokens` each (EOS ignored: the driver cuts the text at
    EOS and the stop strings, which for greedy decoding is what stopping there would have given)."""

    kind: Literal["generation"] = "generation"
    name: str
    prompts: list[list[int]]
    max_tokens: int


class ChoiceTaskSpec(_Model):
    """Teacher-forced logprobs of each choice's continuation ids after its item's context."""

    kind: Literal["choice"] = "choice"
    name: str
    contexts: list[list[int]]
    choices: list[list[list[int]]]           # item -> choice -> continuation ids


class LmEvalTaskSpec(_Model):
    """An lm-evaluation-harness task run on the cell's engine (adapters.lm_eval_model)."""

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


class GroupSpec(_Model):
    mode: Literal["offline", "serve", "stream"] = "offline"
    load: LoadSpec
    cells: list[CellSpec]
    scoring: ScoringSpec | None = None
    serve: ServeSpec | None = None
    tasks: list[TaskSpec] = Field(default_factory=list)    # run by every cell after its timings and logprobs
    sampling: SamplingSpec | None = None                   # seeded samples, after the logprobs
    claims_dir: str | None = None    # set: a cell runs only if this worker claims it there first (adapters.claims.claim_cell)


# ------------------------------------------------------------------------------------------------
# facts and events: what a worker reports


class LoadFacts(_Model):
    """Facts an adapter reports after load, stored with every cell of the group."""

    versions: dict[str, str] = Field(default_factory=dict)
    engine_args: dict[str, Any] = Field(default_factory=dict)
    kv_budget_bytes: int | None = None
    batch_mode: Literal["batched", "sequential"] = "batched"
    notes: list[str] = Field(default_factory=list)
    memory_pids: list[int] = Field(default_factory=list)   # extra processes to count (engine children)


class _Event(_Model):
    t: float = 0.0                 # wall clock (time.time) when emitted


class Started(_Event):
    event: Literal["start"] = "start"
    pid: int
    python: str


class Loaded(_Event):
    event: Literal["loaded"] = "loaded"
    load_s: float | None           # None: nothing was loaded here (someone else's server)
    load_peak_mem_bytes: int | None
    mem_source: str
    facts: LoadFacts
    model_fingerprint: str | None = None   # adapters.provenance: the model files' content hash
    host: dict[str, Any] = Field(default_factory=dict)   # the node's CPU, GPUs, NVIDIA driver
    missing: dict[str, str] = Field(default_factory=dict)   # load-level figure -> why it is null


class GroupUnsupported(_Event):
    event: Literal["unsupported"] = "unsupported"
    cells: list[str]
    reason: str


class LoadFailed(_Event):
    event: Literal["load_failed"] = "load_failed"
    cells: list[str]
    reason: str
    traceback: str | None = None


class CellStart(_Event):
    event: Literal["cell_start"] = "cell_start"
    cell_id: str


class CellDone(_Event):
    event: Literal["cell_done"] = "cell_done"
    cell_id: str                   # its CellRecord is <cell_id>.json, its logprob rows <cell_id>.npz


class CellFailed(_Event):
    event: Literal["cell_failed"] = "cell_failed"
    cell_id: str
    reason: str
    traceback: str | None = None


class CellUnsupported(_Event):
    event: Literal["cell_unsupported"] = "cell_unsupported"
    cell_id: str
    reason: str


class End(_Event):
    event: Literal["end"] = "end"


WorkerEvent = Annotated[Union[Started, Loaded, GroupUnsupported, LoadFailed, CellStart, CellDone, CellFailed,
                              CellUnsupported, End], Field(discriminator="event")]
_EVENT = TypeAdapter(WorkerEvent)


def parse_event(line: str | bytes) -> WorkerEvent:
    return _EVENT.validate_json(line)


# The samples a cell stores (<cell_id>.samples.npz): one row per (repeat, prompt, seed), its ids and
# each sampled token's raw logprob (log-softmax of the raw logits: before temperature and filters).
SAMPLE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("repeat", "int16"),
    ("prompt_index", "int32"),
    ("seed", "int64"),
    ("token_ids", "int32"),      # [rows, tokens]
    ("logprobs", "float32"),     # [rows, tokens]
    # the prompt's next-token top-k (raw logprobs, the one top-k rule), repeated on each of its rows: the
    # distribution the first sampled token is tested against; width 0 where the engine could not give it
    ("next_topk_ids", "int32"),          # [rows, next_top_k]
    ("next_topk_logprobs", "float32"),   # [rows, next_top_k]
)


# ------------------------------------------------------------------------------------------------
# task outputs: what a cell's engine produced for each task (<cell_id>.tasks.json); the driver scores
# generation and choice outputs (orchestrator/task_metrics.py), lm-eval scores its own items


class GenerationOutput(_Model):
    kind: Literal["generation"] = "generation"
    name: str
    tokens: list[list[int]]                  # per prompt: the greedy token ids


class ChoiceOutput(_Model):
    kind: Literal["choice"] = "choice"
    name: str
    logprobs: list[list[list[float]]]        # item -> choice -> the logprob of each continuation token
    greedy: list[list[bool]]                 # item -> choice: every continuation token was the top-1


class LmEvalItem(_Model):
    doc_id: int
    score: float | None                      # the task's chosen metric for this item
    prediction: str                          # the filtered response (multiple choice: the highest loglikelihood's index)
    target: str
    metrics: dict[str, float] = Field(default_factory=dict)
    choice_logprobs: list[float] | None = None   # multiple choice: each choice's loglikelihood


class LmEvalOutput(_Model):
    kind: Literal["lm_eval"] = "lm_eval"
    name: str
    metric: str
    items: list[LmEvalItem]


class TaskError(_Model):
    """A task that could not run on this cell: its figures are null with this reason."""

    kind: Literal["error"] = "error"
    name: str
    reason: str


TaskOutput = Annotated[Union[GenerationOutput, ChoiceOutput, LmEvalOutput, TaskError], Field(discriminator="kind")]
TASK_OUTPUTS = TypeAdapter(list[TaskOutput])


# ------------------------------------------------------------------------------------------------
# the logprob rows


LOGPROB_KINDS = ("prompt", "generation")      # teacher forced | greedy; stored as these strings
# (name, numpy dtype, is a top-k list). Row i of a prompt block scores token i+1 of the prompt; of a
# generation block, the i-th generated token. The store's Parquet schema is derived from this.
LOGPROB_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("kind", "int8", False),              # index into LOGPROB_KINDS
    ("repeat", "int16", False),
    ("prompt_index", "int32", False),
    ("position", "int32", False),         # index of the scored token in its sequence
    ("token_id", "int32", False),         # -1: a served token that maps to no single id
    ("logprob", "float32", False),
    ("topk_ids", "int32", True),
    ("topk_logprobs", "float32", True),
)
# The one top-k rule: candidates ranked by logprob descending, ties by the lower token id; every row
# has exactly k entries, and where fewer than k candidates exist (a vocabulary smaller than k, an
# engine or server that returned fewer) the list is padded with id -1 and logprob -inf. Ids that
# name no token (-1 from a server's string that maps to no single id) are not candidates.
TOPK_PAD_ID = -1
TOPK_PAD_LOGPROB = -math.inf


@dataclass
class TokenScores:
    """Logprobs of a token sequence. Row i scores token_ids[i]; top-k by the one rule above."""

    token_ids: np.ndarray          # int32 [n]
    logprobs: np.ndarray           # float32 [n]
    topk_ids: np.ndarray           # int32 [n, k]
    topk_logprobs: np.ndarray      # float32 [n, k]

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])


def topk_dense(logprobs: np.ndarray, actual: Sequence[int] | np.ndarray, k: int) -> TokenScores:
    """Full-vocabulary logprobs [n, vocab] -> TokenScores with each actual token's logprob."""
    logprobs = np.asarray(logprobs, dtype=np.float32)
    actual = np.asarray(actual, dtype=np.int64)
    n, vocab = logprobs.shape
    # a stable sort of -logprob keeps equal logprobs in id order
    order = np.argsort(-logprobs, axis=1, kind="stable")[:, :k]
    ids = np.full((n, k), TOPK_PAD_ID, np.int32)
    lps = np.full((n, k), TOPK_PAD_LOGPROB, np.float32)
    w = order.shape[1]
    ids[:, :w] = order
    lps[:, :w] = np.take_along_axis(logprobs, order, axis=1)
    return TokenScores(token_ids=actual.astype(np.int32),
                       logprobs=logprobs[np.arange(n), actual] if n else np.zeros(0, np.float32),
                       topk_ids=ids, topk_logprobs=lps)


SparseRow = tuple[int, float, Iterable[tuple[int, float]]]   # (token id, its logprob, (id, logprob) candidates)


def topk_sparse(rows: Sequence[SparseRow], k: int) -> TokenScores:
    """Rows of (token id, its logprob, candidate pairs), as engines and servers return them -> TokenScores.
    A token whose logprob the engine did not return is NaN (never a stand-in number)."""
    n = len(rows)
    ids = np.full((n, k), TOPK_PAD_ID, np.int32)
    lps = np.full((n, k), TOPK_PAD_LOGPROB, np.float32)
    for i, (_, _, pairs) in enumerate(rows):
        ranked = sorted(((float(lp), int(tid)) for tid, lp in pairs if int(tid) >= 0), key=lambda x: (-x[0], x[1]))[:k]
        for j, (lp, tid) in enumerate(ranked):
            ids[i, j], lps[i, j] = tid, lp
    return TokenScores(token_ids=np.array([r[0] for r in rows], np.int32).reshape(n),
                       logprobs=np.array([math.nan if r[1] is None else r[1] for r in rows], np.float32).reshape(n),
                       topk_ids=ids, topk_logprobs=lps)


# ------------------------------------------------------------------------------------------------
# timings: one measurement type for offline batches and served requests


@dataclass
class RequestTiming:
    """One request, on the calling process's clock (time.perf_counter seconds).

    `chunk_times[i]` is when output chunk i became available to the process that called the engine
    (offline: the step's tokens returned or were handed to our callback; served: the client received
    the SSE chunk), and `chunk_tokens[i]` how many tokens it carried. Empty: the times were not measured,
    and `missing` in the run says why."""

    sent: float                               # handed to the engine / sent to the server
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    output_tokens: int = 0                    # the authoritative count (a server's usage where it gives one)
    prompt_tokens: int | None = None
    end: float | None = None                  # the call or the stream ended
    scheduled: float | None = None            # served: its arrival time (queue = sent - scheduled)
    engine_ttft_s: float | None = None        # the engine's own TTFT figure, stored beside ours
    finish_reason: str | None = None
    error: str | None = None                  # None when ok
    error_kind: str | None = None             # http, timeout, time_limit, connection, truncated, protocol

    @property
    def ok(self) -> bool:
        return self.error is None

    def add_chunk(self, now: float, tokens: int) -> None:
        if tokens > 0:
            self.chunk_times.append(now)
            self.chunk_tokens.append(tokens)


@dataclass
class TimedRun:
    """One timed batch (offline) or one timed run of a load point (served)."""

    start: float
    end: float
    requests: list[RequestTiming]
    not_sent: int = 0                         # served: requests the time limit left unsent
    missing: dict[str, str] = field(default_factory=dict)   # figure -> why it was not measured


def per_token_run(start: float, end: float, token_times: Sequence[Sequence[float]], prompts: Sequence[Sequence[int]],
                  engine_ttft_s: Sequence[float | None] | None = None) -> TimedRun:
    """An offline batch whose tokens each became available on their own (one chunk per token), all
    requests handed to the engine at `start`."""
    return TimedRun(start=start, end=end, requests=[
        RequestTiming(sent=start, chunk_times=list(times), chunk_tokens=[1] * len(times), output_tokens=len(times),
                      prompt_tokens=len(p), end=end, engine_ttft_s=engine_ttft_s[i] if engine_ttft_s else None)
        for i, (times, p) in enumerate(zip(token_times, prompts))])


PERCENTILES = (50, 90, 99)
_PER_RUN = ("ttft_ms_p50_runs", "ttft_ms_p99_runs", "tpot_ms_p50_runs", "tpot_ms_p99_runs")
LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms")
# our TTFT and the engine's own agree when within this many ms, or this share of ours, whichever is larger
ENGINE_TTFT_MARGIN_MS = 1.0
ENGINE_TTFT_MARGIN_REL = 0.10


class CellMetrics(_Model):
    """Every speed figure of one cell, from `summarize`. A null figure has its reason in `missing`."""

    requests: int                             # ok timed requests
    requests_planned: int
    requests_sent: int
    errors: int
    errors_by_kind: str                       # JSON kind -> count
    output_tokens: int
    prompt_tokens: int | None
    output_tok_s: float | None                # mean over runs of (output tokens / run wall time)
    total_tok_s: float | None
    req_s: float | None
    output_tok_s_runs: list[float]
    goodput: float | None                     # share of planned requests within every per-request SLO
    goodput_req_s: float | None
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_e2e_ms: float | None = None
    ttft_ms: list[float]                      # per request (null entries never: unmeasured requests are left out)
    tpot_ms: list[float]
    e2e_ms: list[float]
    ttft_ms_p50_runs: list[float] = Field(default_factory=list)   # per timed run: what cross-run intervals use
    ttft_ms_p99_runs: list[float] = Field(default_factory=list)
    tpot_ms_p50_runs: list[float] = Field(default_factory=list)
    tpot_ms_p99_runs: list[float] = Field(default_factory=list)
    chunk_tokens_mean: float | None           # tokens per output chunk: 1.0 means every ITL sample is one token
    itl_samples: int                          # ITL gaps: over the measured requests, chunks - 1 each
    engine_ttft_ms: list[float] | None
    engine_ttft_ms_p50: float | None
    engine_ttft_agrees: bool | None           # |p50 ours - p50 engine's| within the stated margin
    ttft_ms_p50: float | None = None
    ttft_ms_p90: float | None = None
    ttft_ms_p99: float | None = None
    tpot_ms_p50: float | None = None
    tpot_ms_p90: float | None = None
    tpot_ms_p99: float | None = None
    itl_ms_p50: float | None = None
    itl_ms_p90: float | None = None
    itl_ms_p99: float | None = None
    e2e_ms_p50: float | None = None
    e2e_ms_p90: float | None = None
    e2e_ms_p99: float | None = None
    queue_ms_p50: float | None = None
    queue_ms_p90: float | None = None
    queue_ms_p99: float | None = None
    missing: dict[str, str] = Field(default_factory=dict)


def _pct(values: list[float]) -> list[float | None]:
    if not values:
        return [None] * len(PERCENTILES)
    return [float(x) for x in np.percentile(np.asarray(values, dtype=np.float64), PERCENTILES)]


def summarize(runs: Sequence[TimedRun], slo_ttft_ms: float | None = None,
              slo_tpot_ms: float | None = None, slo_e2e_ms: float | None = None) -> CellMetrics:
    """The one place every latency, throughput and goodput figure is computed, offline and served alike.

    Per ok request: TTFT = first chunk - sent; TPOT = (last chunk - first chunk) / (output tokens - 1);
    ITL = the gaps between consecutive chunks (a chunk of several tokens is one gap, never zeros);
    e2e = last chunk - sent; queue = sent - scheduled (served arrivals only). Per run: throughputs over
    the run's wall time. Goodput: ok requests within both SLOs over every request the runs meant to
    send (an error, or a request never sent, meets none): within TTFT, TPOT and e2e where each is given."""
    ttft, tpot, itl, e2e, queue, engine, paired = [], [], [], [], [], [], []
    tok_s, total_s, req_s, good_s = [], [], [], []
    errors: dict[str, int] = {}
    missing: dict[str, str] = {}
    planned = sent = ok_n = good = out_total = chunks = 0
    prompt_total: int | None = 0
    unmeasured = 0
    per_run: dict[str, list[float]] = {k: [] for k in _PER_RUN}
    for run in runs:
        for key, why in run.missing.items():
            missing.setdefault(key, why)
        elapsed = max(run.end - run.start, 1e-9)
        first = (len(ttft), len(tpot))
        ok = [r for r in run.requests if r.ok]
        run_good = 0
        for r in ok:
            if r.engine_ttft_s is not None:
                engine.append(r.engine_ttft_s * 1e3)
            if r.scheduled is not None:
                queue.append(max(0.0, r.sent - r.scheduled) * 1e3)
            if not r.chunk_times:
                unmeasured += 1
                continue
            t = (r.chunk_times[0] - r.sent) * 1e3
            ttft.append(t)
            if r.engine_ttft_s is not None:
                paired.append((t, r.engine_ttft_s * 1e3))
            e2e.append((r.chunk_times[-1] - r.sent) * 1e3)
            e = e2e[-1]
            p = (r.chunk_times[-1] - r.chunk_times[0]) * 1e3 / (r.output_tokens - 1) if r.output_tokens > 1 else None
            if p is not None:
                tpot.append(p)
            itl.extend(np.diff(r.chunk_times) * 1e3)
            chunks += len(r.chunk_times)
            if ((slo_ttft_ms is None or t <= slo_ttft_ms) and (slo_tpot_ms is None or (p or 0.0) <= slo_tpot_ms)
                    and (slo_e2e_ms is None or e <= slo_e2e_ms)):
                run_good += 1
        for name, values in (("ttft_ms", ttft[first[0]:]), ("tpot_ms", tpot[first[1]:])):
            if values:   # each run's own percentiles: the repeats a cross-run interval is built from
                p50, _, p99 = _pct(values)
                per_run[f"{name}_p50_runs"].append(p50)
                per_run[f"{name}_p99_runs"].append(p99)
        for r in run.requests:
            if not r.ok:
                errors[r.error_kind or "error"] = errors.get(r.error_kind or "error", 0) + 1
        out_tokens = sum(r.output_tokens for r in ok)
        in_tokens = None if any(r.prompt_tokens is None for r in ok) else sum(r.prompt_tokens for r in ok)
        tok_s.append(out_tokens / elapsed)
        total_s.append((out_tokens + (in_tokens or 0)) / elapsed)
        req_s.append(len(ok) / elapsed)
        good_s.append(run_good / elapsed)
        planned += len(run.requests) + run.not_sent
        sent += len(run.requests)
        ok_n += len(ok)
        good += run_good
        out_total += out_tokens
        prompt_total = None if prompt_total is None or in_tokens is None else prompt_total + in_tokens

    if unmeasured:
        why = missing.get("token_times", "the engine gave no time for its tokens")
        for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
            missing.setdefault(key, f"{unmeasured} of {ok_n} requests unmeasured: {why}")
        missing.setdefault("goodput", f"TTFT of {unmeasured} requests unmeasured")
    if not ok_n:
        missing.setdefault("ttft_ms", "no request succeeded")
    if not queue:
        missing.setdefault("queue_ms", "no arrival queue: an offline batch, or a closed loop" if ok_n else "no request")
    if not itl and ttft:
        missing.setdefault("itl_ms", "every request came back in one chunk (or had one token)")
    if not tpot and ttft:
        missing.setdefault("tpot_ms", "no request had more than one output token")
    if prompt_total is None:
        missing.setdefault("total_tok_s", "prompt lengths not known for every request")
        total_s = []
    if not engine:
        missing.setdefault("engine_ttft_ms", "the engine reports no TTFT of its own")
    engine_p50, agrees = _pct(engine)[0], None
    if paired:   # medians over the same requests
        ours, theirs = (float(np.median(x)) for x in zip(*paired))
        agrees = abs(ours - theirs) <= max(ENGINE_TTFT_MARGIN_MS, ENGINE_TTFT_MARGIN_REL * ours)
    out = CellMetrics(
        requests=ok_n, requests_planned=planned, requests_sent=sent, errors=sum(errors.values()),
        errors_by_kind=json.dumps(errors, sort_keys=True), output_tokens=out_total, prompt_tokens=prompt_total,
        output_tok_s=float(np.mean(tok_s)) if tok_s else None,
        total_tok_s=float(np.mean(total_s)) if total_s else None,
        req_s=float(np.mean(req_s)) if req_s else None, output_tok_s_runs=[float(x) for x in tok_s],
        goodput=(good / planned if planned else None) if "goodput" not in missing else None,
        goodput_req_s=(float(np.mean(good_s)) if good_s else None) if "goodput" not in missing else None,
        slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, slo_e2e_ms=slo_e2e_ms,
        ttft_ms=ttft if "ttft_ms" not in missing else [], tpot_ms=tpot if "tpot_ms" not in missing else [],
        e2e_ms=e2e if "e2e_ms" not in missing else [],
        chunk_tokens_mean=(out_total / chunks) if chunks and not unmeasured else None,
        itl_samples=len(itl) if "itl_ms" not in missing else 0,
        engine_ttft_ms=engine or None, engine_ttft_ms_p50=engine_p50, engine_ttft_agrees=agrees,
        **{k: (v if k.rsplit("_p", 1)[0] not in missing else []) for k, v in per_run.items()},
        missing=missing)
    values = {"ttft_ms": out.ttft_ms, "tpot_ms": out.tpot_ms, "e2e_ms": out.e2e_ms,
              "itl_ms": [float(x) for x in itl] if "itl_ms" not in missing else [], "queue_ms": queue}
    for name in LATENCIES:
        for q, v in zip(PERCENTILES, _pct(values[name])):
            setattr(out, f"{name}_p{q}", v)
    return out


# ------------------------------------------------------------------------------------------------
# what a worker writes per cell


class CellRecord(CellMetrics):
    """A cell's measurements as the worker writes them (<cell_id>.json); the launcher adds the load
    facts and stores the row. Every field here is a column of the cells table."""

    peak_mem_bytes: int | None
    repeats: int                              # timed batches or runs made (measure.repeats, or as many as auto took)
    repeats_halfwidth: float | None = None    # relative half-width of the throughput's 95% interval
    spec_draft_tokens: int | None = None      # speculative decoding over the timed batches: tokens drafted,
    spec_accepted_tokens: int | None = None   # accepted, and accepted / drafted (None: no speculation)
    spec_acceptance: float | None = None
    # the engine's own metrics over the timed runs (adapters/telemetry.py: one definition of each)
    prefix_cache_queries: int | None = None   # prompt tokens looked up in the prefix cache (vLLM counts tokens)
    prefix_cache_hits: int | None = None      # of those, tokens found there (whole KV blocks)
    prefix_cache_hit_rate: float | None = None   # hits / queries
    preemptions: int | None = None            # requests preempted (KV cache full)
    kv_cache_usage_max: float | None = None   # served: the largest KV-cache share used (0-1) in the gauge samples
    requests_waiting_max: int | None = None   # served: the longest server queue in the gauge samples
    gauge_samples: int | None = None          # served: gauge samples taken during the timed runs
    # energy of the timed runs from the hardware's counters (adapters/energy.py)
    energy_j: float | None = None
    energy_j_per_token: float | None = None   # energy_j / output tokens
    energy_source: str | None = None          # which counters: rapl:package-0,... | nvml:N GPU(s)
    duration_s: float | None = None
    notes: list[str] = Field(default_factory=list)
    # serve.search (adapters/slo_search.py). A probe's row: its number, whether it met every SLO, what it
    # missed and each SLO's check as JSON. The search's own row: the highest load that met them, the
    # first load above it that missed (and what it missed), the probes made, the SLOs as JSON.
    search_variable: str | None = None       # rate | concurrency
    search_probe: int | None = None
    search_meets: bool | None = None
    search_checks: str | None = None
    search_missed: str | None = None
    search_max: float | None = None
    search_fail: float | None = None
    search_probes: int | None = None
    search_slos: str | None = None


class Probe(_Model):
    """One load point an SLO search measured (<cell_id>.probes.json holds them in order): at `rate`
    requests/s (None: a closed loop) with at most `concurrency` in flight; its record becomes its own row."""

    rate: float | None
    concurrency: int
    record: CellRecord


PROBES = TypeAdapter(list[Probe])
