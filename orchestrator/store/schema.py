"""The run directory's tables: their fixed Parquet schemas (cells, and the side tables logprobs,
tasks and samples) and the writer settings of each.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from adapters.contract.records import LOGPROB_COLUMNS

SCHEMA_VERSION = 1


_f64 = pa.float64()


_list_f64 = pa.list_(pa.float64())


CELLS_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("cell_id", pa.string()),
    ("engine_key", pa.string()),
    ("framework", pa.string()),
    ("model", pa.string()),
    ("quantization", pa.string()),
    ("flags", pa.string()),               # flag-set name
    ("flags_json", pa.string()),          # the resolved engine options
    ("batch_size", pa.int32()),
    ("input_len", pa.int32()),
    ("output_len", pa.int32()),
    ("mode", pa.string()),                # offline (the engine's Python API) | serve (its OpenAI-compatible server)
    ("request_rate", _f64),               # serve: requests/s arriving (inf: a closed loop); offline: null
    ("load", pa.string()),                # batch (offline static batch) | closed | constant | poisson
    ("endpoint", pa.string()),            # serve: the given server's base URL; null when the cell started its own
    ("workload", pa.string()),            # the named workload (matrix workloads); null: the single workload section
    ("device", pa.string()),
    ("node_id", pa.string()),             # the Ray node that ran the cell
    ("status", pa.string()),              # ok | unsupported | failed | crashed | timeout
    ("reason", pa.string()),
    ("batch_mode", pa.string()),          # batched | sequential (never silent)
    ("load_s", _f64),
    ("warmup", pa.int32()),
    ("repeats", pa.int32()),              # timed batches (serve: runs) made; with repeats: auto, as many as it took
    ("repeats_halfwidth", _f64),          # relative half-width of the output throughput's 95% interval
    ("spec_draft_tokens", pa.int64()),    # speculative decoding in the timed batches: draft tokens proposed,
    ("spec_accepted_tokens", pa.int64()),  # accepted,
    ("spec_acceptance", _f64),            # and accepted / proposed (null: no speculation, see missing)
    ("prefix_cache_queries", pa.int64()),  # engine telemetry over the timed runs (adapters/meters/telemetry.py):
    ("prefix_cache_hits", pa.int64()),     # prompt tokens looked up in the prefix cache, and found there,
    ("prefix_cache_hit_rate", _f64),       # hits / queries,
    ("preemptions", pa.int64()),           # requests preempted,
    ("kv_cache_usage_max", _f64),          # served: largest KV-cache share in the gauge samples,
    ("requests_waiting_max", pa.int64()),  # served: longest server queue in them,
    ("gauge_samples", pa.int32()),         # served: how many samples (one a second during the timed runs)
    ("energy_j", _f64),                    # energy of the timed runs from RAPL / NVML (adapters/meters/energy.py),
    ("energy_j_per_token", _f64),          # per output token,
    ("energy_source", pa.string()),        # and which counters (whole packages / GPUs)
    ("requests", pa.int32()),             # timed requests (repeats x batch_size)
    ("ttft_ms_p50", _f64), ("ttft_ms_p90", _f64), ("ttft_ms_p99", _f64),
    ("tpot_ms_p50", _f64), ("tpot_ms_p90", _f64), ("tpot_ms_p99", _f64),
    ("itl_ms_p50", _f64), ("itl_ms_p90", _f64), ("itl_ms_p99", _f64),   # gaps between output chunks
    ("chunk_tokens_mean", _f64),          # tokens per output chunk (1.0: every ITL gap is one token)
    ("itl_samples", pa.int64()),          # ITL gaps behind the percentiles (chunks - 1 per request)
    ("e2e_ms_p50", _f64), ("e2e_ms_p90", _f64), ("e2e_ms_p99", _f64),
    ("output_tok_s", _f64),               # mean over repeats
    ("total_tok_s", _f64),
    ("req_s", _f64),
    ("output_tokens", pa.int64()),        # output tokens of the timed requests (serve: as the server counted them)
    ("prompt_tokens", pa.int64()),        # prompt tokens of the timed requests
    ("requests_planned", pa.int32()),     # serve: requests the timed runs meant to send
    ("requests_sent", pa.int32()),        # serve: requests sent (the rest: time limit reached first)
    ("errors", pa.int32()),               # serve: sent requests that failed (errors_by_kind: JSON kind -> count)
    ("errors_by_kind", pa.string()),
    ("goodput", _f64),                    # serve: share of planned requests within the SLOs
    ("goodput_req_s", _f64),              # serve: requests/s within the SLOs
    ("slo_ttft_ms", _f64), ("slo_tpot_ms", _f64), ("slo_e2e_ms", _f64),   # the per-request SLOs goodput counts
    ("queue_ms_p50", _f64), ("queue_ms_p90", _f64), ("queue_ms_p99", _f64),  # serve: wait for a free slot
    ("ttft_ms", _list_f64),               # per request (the samples behind the percentiles)
    ("tpot_ms", _list_f64),
    ("e2e_ms", _list_f64),
    ("output_tok_s_runs", _list_f64),     # per repeat
    ("ttft_ms_p50_runs", _list_f64), ("ttft_ms_p99_runs", _list_f64),   # per repeat: its own percentiles
    ("tpot_ms_p50_runs", _list_f64), ("tpot_ms_p99_runs", _list_f64),
    ("engine_ttft_ms", _list_f64),        # the engine's own TTFT where it reports one (per request)
    ("engine_ttft_ms_p50", _f64),
    ("engine_ttft_agrees", pa.bool_()),   # |ttft_ms_p50 - engine_ttft_ms_p50| <= max(1 ms, 10% of ours)
    ("peak_mem_bytes", pa.int64()),       # during this cell's timed runs
    ("load_peak_mem_bytes", pa.int64()),
    ("mem_source", pa.string()),          # rss-peak-tree | rss-tree | nvml-tree | ...
    ("kv_budget_bytes", pa.int64()),
    ("versions", pa.string()),            # JSON: library versions in the engine's environment
    ("model_fingerprint", pa.string()),   # content hash of the model's weights, config and tokenizer files
    ("host", pa.string()),                # JSON: the node's CPU, GPUs and NVIDIA driver (adapters/meters/provenance.py)
    ("engine_args", pa.string()),         # JSON: the arguments given to the engine
    ("notes", pa.string()),               # JSON list of caveats the adapter reported
    ("missing", pa.string()),             # JSON: figure -> why it is null (nothing unmeasured is a number)
    ("attempt", pa.int32()),              # which engine process of the group ran the cell
    ("group_tries", pa.int32()),          # times the group was sent to Ray (over 1: its node was lost)
    ("started_at", pa.string()),
    ("duration_s", _f64),
    # serve.search (adapters/serving/slo_search.py): a search's own row (load "search rate" | "search concurrency")
    # and one row per probe, both naming the search's cell in search_id
    ("search_id", pa.string()),           # the search's cell_id (on its own row too); null: no search
    ("search_variable", pa.string()),     # rate | concurrency
    ("search_probe", pa.int32()),         # a probe's number, in the order made; null on the search's own row
    ("search_meets", pa.bool_()),         # the probe met every SLO (judged as serve.search.judge says)
    ("search_checks", pa.string()),       # JSON per SLO: value, interval lo/hi, slo, n, met
    ("search_missed", pa.string()),       # what a probe missed; on the search's row: what its first miss above the max missed
    ("search_max", _f64),                 # the highest load that met every SLO (null: none did, see missing)
    ("search_fail", _f64),                # the lowest load above it that missed (null: none up to high did)
    ("search_probes", pa.int32()),        # probes made
    ("search_slos", pa.string()),         # JSON: the search config (SLOs, bounds, judge)
    ("workload_json", pa.string()),       # JSON of the cell's workload section (before it: in `workload`)
])


def _logprobs_schema() -> pa.Schema:
    """The worker's row layout (adapters.contract.records.LOGPROB_COLUMNS) as Parquet columns, after the run
    and cell ids; `kind` is stored by name (prompt: teacher forced | generation: greedy)."""
    fields = [("run_id", pa.string()), ("cell_id", pa.string())]
    for name, dtype, is_list in LOGPROB_COLUMNS:
        t = pa.string() if name == "kind" else pa.from_numpy_dtype(np.dtype(dtype))
        fields.append((name, pa.list_(t) if is_list else t))
    return pa.schema(fields)


LOGPROBS_SCHEMA = _logprobs_schema()


# The task layer: one row per (cell, task, item), so every comparison pairs items (orchestrator/inputs/task_metrics.py).
TASKS_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("cell_id", pa.string()),
    ("task", pa.string()),
    ("metric", pa.string()),
    ("item_index", pa.int32()),              # the item's line (generation, choice) or lm-eval's doc_id
    ("score", _f64),                         # the metric for this item (null: lm-eval gave none)
    ("prediction", pa.string()),             # the generated text, or the chosen choice's index
    ("target", pa.string()),                 # the answers as JSON, or the right choice's index
    ("choice_logprobs", _list_f64),          # choice: each choice's summed continuation logprob
    ("choice_tokens", pa.list_(pa.int32())),  # choice: each choice's continuation length in tokens
])


TASKS_WRITE_OPTIONS = {"compression": "zstd"}


# The sampling layer: one row per seeded sample (adapters.contract.records.SAMPLE_COLUMNS), with its ids and
# each sampled token's raw logprob, so samples compare seed by seed and as a distribution.
SAMPLES_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("cell_id", pa.string()),
    ("repeat", pa.int16()),                  # the same seeds again (0, 1, ...)
    ("prompt_index", pa.int32()),            # which scoring prompt
    ("seed", pa.int64()),
    ("token_ids", pa.list_(pa.int32())),     # the sampled ids (EOS ignored)
    ("logprobs", pa.list_(pa.float32())),    # each sampled token's raw logprob (before temperature and filters)
    ("next_topk_ids", pa.list_(pa.int32())),         # the prompt's next-token candidates (measure.sampling.next_top_k)
    ("next_topk_logprobs", pa.list_(pa.float32())),  # their raw logprobs
])


SAMPLES_WRITE_OPTIONS = {"compression": "zstd"}


STATUSES = ("ok", "unsupported", "failed", "crashed", "timeout")


# The framework lives in the partition directory name only: a column of the same name inside the
# files would clash with the hive partition when pandas or DuckDB read the directory.
CELLS_FILE_SCHEMA = CELLS_SCHEMA.remove(CELLS_SCHEMA.get_field_index("framework"))


def _parquet_options(schema: pa.Schema) -> dict:
    """Writer settings: zstd; float columns (and float lists) as BYTE_STREAM_SPLIT without a
    dictionary (a dictionary of ~distinct float32 logprobs only costs, and keeps byte-stream-split
    off); every other column dictionary-encoded where it pays (ids, strings). Lossless: the values
    read back bit for bit."""
    floats, others = [], []
    for field in schema:
        t = field.type
        leaf = t.value_type if pa.types.is_list(t) else t
        path = f"{field.name}.list.element" if pa.types.is_list(t) else field.name
        (floats if pa.types.is_floating(leaf) else others).append(path)
    return {"compression": "zstd", "use_dictionary": others, "use_byte_stream_split": floats}


LOGPROBS_WRITE_OPTIONS = _parquet_options(LOGPROBS_SCHEMA)


@dataclass(frozen=True)
class SideTable:
    """A table of per-cell rows beside the cells table, stored like logprobs: while a run goes one
    file per cell (<name>/framework=<fw>/<cell_id>.parquet, written before the cell's row, removed
    when the cell is stored again without any), after a compaction folded into one file per
    framework (<name>/framework=<fw>/compacted-<g>.parquet, named in compacted.json's <name> entry)."""

    schema: pa.Schema
    write_options: dict


# Every side table, by directory name. Compaction, recovery and the Layout go through this dict:
# a new one is one line here (and its rows handed to write_cell).
SIDE_TABLES: dict[str, SideTable] = {
    "logprobs": SideTable(LOGPROBS_SCHEMA, LOGPROBS_WRITE_OPTIONS),
    "tasks": SideTable(TASKS_SCHEMA, TASKS_WRITE_OPTIONS),
    "samples": SideTable(SAMPLES_SCHEMA, SAMPLES_WRITE_OPTIONS),
}


# A one-row cells file is all footer (~80 column chunks): compression, dictionaries and statistics
# only make it slower to write and to read (~3x and ~2x here); compaction compresses the table.
CELL_FILE_OPTIONS = {"compression": "none", "use_dictionary": False, "write_statistics": False}
