"""What a cell's measurement becomes: `CellRecord` (with `missing`: metric -> why it is null), the
probes of an SLO search, what its engine produced for each task (`TaskOutput`: greedy ids, choice
logprobs, lm-eval's scored items), the logprob and sample row layouts (`LOGPROB_COLUMNS`,
`SAMPLE_COLUMNS`: the store derives its Parquet schemas from them) and the one sparse top-k rule
(`topk_dense`, `topk_sparse`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Iterable, Literal, Sequence, Union

import numpy as np
from pydantic import Field, TypeAdapter

from adapters.contract.specs import ContractModel
from adapters.contract.timing import CellMetrics, Int32

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


class GenerationOutput(ContractModel):
    kind: Literal["generation"] = "generation"
    name: str
    tokens: list[list[int]]                  # per prompt: the greedy token ids


class ChoiceOutput(ContractModel):
    kind: Literal["choice"] = "choice"
    name: str
    logprobs: list[list[list[float]]]        # item -> choice -> the logprob of each continuation token
    greedy: list[list[bool]]                 # item -> choice: every continuation token was the top-1


class LmEvalItem(ContractModel):
    doc_id: int
    score: float | None                      # the task's chosen metric for this item (a perplexity metric: its loglikelihood)
    weight: float | None = None              # a perplexity metric's words or bytes (lm-eval's (loglikelihood, weight))
    prediction: str                          # the filtered response (multiple choice: the pick of the chosen metric)
    target: str
    metrics: dict[str, float] = Field(default_factory=dict)
    choice_logprobs: list[float] | None = None   # multiple choice: each choice's loglikelihood


class LmEvalOutput(ContractModel):
    kind: Literal["lm_eval"] = "lm_eval"
    name: str
    metric: str
    aggregation: str = "mean"                # lm-eval's aggregation of the metric over the items
    higher_is_better: bool = True
    items: list[LmEvalItem]
    lm_eval_value: float | None = None       # lm-eval's own aggregate of the metric over these items


class TaskError(ContractModel):
    """A task that could not run on this cell: its figures are null with this reason."""

    kind: Literal["error"] = "error"
    name: str
    reason: str


TaskOutput = Annotated[Union[GenerationOutput, ChoiceOutput, LmEvalOutput, TaskError], Field(discriminator="kind")]


TASK_OUTPUTS = TypeAdapter(list[TaskOutput])


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


# the base_* fields' null, named by the worker: the launcher fills them (and drops these) where a timing twin ran;
# the worker fills them where the cell's baseline is in its own group (adapters/worker/timing_partner.py)
NO_TIMING_TWIN = dict.fromkeys(
    ("base_timing_cell", "base_output_tok_s_runs", "base_host_busy_runs", "base_gpu_busy_runs",
     "base_repeat_started_at", "base_repeat_ended_at"),
    "the baseline's repeats did not take turns with this cell's: its baseline is itself, or in another engine load "
    "and measure.paired_timing is not true, or paired_timing is false; or not applicable here (serve mode, an env "
    "pair, a baseline another cell of the group already has as its timing twin)")


class CellRecord(CellMetrics):
    """A cell's measurements as the worker writes them (<cell_id>.json); the launcher adds the load
    facts and stores the row. Every field here is a column of the cells table."""

    peak_mem_bytes: int | None
    repeats: Int32                            # timed batches or runs made (measure.repeats, or as many as auto took)
    repeats_halfwidth: float | None = None    # relative half-width of the throughput's 95% interval
    spec_draft_tokens: int | None = None      # speculative decoding over the timed batches: tokens drafted,
    spec_accepted_tokens: int | None = None   # accepted, and accepted / drafted (None: no speculation)
    spec_acceptance: float | None = None
    # the engine's own metrics over the timed runs (adapters/meters/telemetry.py: one definition of each)
    prefix_cache_queries: int | None = None   # prompt tokens looked up in the prefix cache (vLLM counts tokens)
    prefix_cache_hits: int | None = None      # of those, tokens found there (whole KV blocks)
    prefix_cache_hit_rate: float | None = None   # hits / queries
    preemptions: int | None = None            # requests preempted (KV cache full)
    kv_cache_usage_max: float | None = None   # served: the largest KV-cache share used (0-1) in the gauge samples
    requests_waiting_max: int | None = None   # served: the longest server queue in the gauge samples
    gauge_samples: Int32 | None = None        # served: gauge samples taken during the timed runs
    # energy of the timed runs from the hardware's counters (adapters/meters/energy.py)
    energy_j: float | None = None
    energy_j_per_token: float | None = None   # energy_j / output tokens
    energy_source: str | None = None          # which counters: rapl:package-0,... | nvml:N GPU(s)
    duration_s: float | None = None
    repeat_started_at: list[float] | None = None   # wall clock (epoch s) of each timed repeat's start and end: an env
    repeat_ended_at: list[float] | None = None     # pair's interleaving is visible in them (None: not recorded)
    # per timed repeat, how disturbed it was (adapters/contract/disturbance.py): the share of the engine cores'
    # time other processes took, and other processes' mean SM use of the engine's GPUs (None: not measured)
    host_busy_runs: list[float] | None = None
    gpu_busy_runs: list[float] | None = None
    # the cell's timed batch measured once more, at its group's start (the drift check, adapters.worker.group):
    # the judge pools the drift between a cell's two measurements over the run, widening its speed intervals
    output_tok_s_recheck_runs: list[float] | None = None
    # the baseline cell whose timed repeats took turns with this cell's (ABBA), and what they measured: the judge pairs
    # repeat i with repeat i. Its engine loaded beside this cell's (measure.paired_timing: a timing twin), or this
    # cell's own engine where the baseline is in its group (adapters/worker/timing_partner.py)
    base_timing_cell: str | None = None
    base_output_tok_s_runs: list[float] | None = None
    base_host_busy_runs: list[float] | None = None
    base_gpu_busy_runs: list[float] | None = None
    base_repeat_started_at: list[float] | None = None
    base_repeat_ended_at: list[float] | None = None
    notes: list[str] = Field(default_factory=list)
    # serve.search (adapters/serving/slo_search.py). A probe's row: its number, whether it met every SLO, what it
    # missed and each SLO's check. The search's own row: the highest load that met them, the first load
    # above it that missed (and what it missed), the probes made, the search's config (SLOs, bounds, judge).
    search_variable: str | None = None       # rate | concurrency
    search_probe: Int32 | None = None
    search_meets: bool | None = None
    search_checks: dict[str, dict[str, Any]] | None = None   # per SLO: value, interval lo/hi, slo, n, met
    search_missed: str | None = None
    search_max: float | None = None
    search_fail: float | None = None
    search_probes: Int32 | None = None
    search_slos: dict[str, Any] | None = None


class Probe(ContractModel):
    """One load point an SLO search measured (<cell_id>.probes.json holds them in order): at `rate`
    requests/s (None: a closed loop) with at most `concurrency` in flight; its record becomes its own row."""

    rate: float | None
    concurrency: int
    record: CellRecord


PROBES = TypeAdapter(list[Probe])
