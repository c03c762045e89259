"""The run directory's tables: their fixed Parquet schemas (cells, and the side tables logprobs,
tasks and samples), the writer settings of each, and the cells columns that hold JSON.

The cells table's measured columns are the worker's `CellRecord` fields, typed from it, as the logprob
table is the worker's `LOGPROB_COLUMNS`: a figure added to the contract is a column, or an error here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin, get_type_hints

import numpy as np
import pyarrow as pa

from adapters.contract.records import LOGPROB_COLUMNS, CellRecord

SCHEMA_VERSION = 1

_f64 = pa.float64()
_list_f64 = pa.list_(pa.float64())

# The driver's own columns of the cells table: the cell's configuration, where and how it ran, the
# facts its engine reported after load. Every other column is a field of the worker's CellRecord.
DRIVER_COLUMNS: dict[str, pa.DataType] = {
    "run_id": pa.string(),
    "cell_id": pa.string(),
    "engine_key": pa.string(),
    "framework": pa.string(),
    "model": pa.string(),
    "quantization": pa.string(),
    "flags": pa.string(),               # flag-set name
    "flags_json": pa.string(),          # the resolved engine options
    "batch_size": pa.int32(),
    "input_len": pa.int32(),
    "output_len": pa.int32(),
    "mode": pa.string(),                # offline (the engine's Python API) | stream | serve (its OpenAI-compatible server)
    "request_rate": _f64,               # serve: requests/s arriving (inf: a closed loop); offline: null
    "load": pa.string(),                # batch (offline static batch) | stream | closed | constant | poisson | gamma | ramp | trace
    "endpoint": pa.string(),            # serve: the given server's base URL; null when the cell started its own
    "workload": pa.string(),            # the named workload (matrix workloads); null: the single workload section
    "env": pa.string(),                 # the named engine environment (matrix envs); null: no env axis
    "env_facts": pa.string(),           # that environment's packages, interpreter and variables (EnvFacts)
    "device": pa.string(),
    "node_id": pa.string(),             # the Ray node that ran the cell
    "status": pa.string(),              # ok | unsupported | failed | crashed | timeout
    "reason": pa.string(),              # why the status (null for ok)
    "batch_mode": pa.string(),          # batched | sequential (never silent)
    "load_s": _f64,
    "warmup": pa.int32(),
    "load_peak_mem_bytes": pa.int64(),
    "mem_source": pa.string(),          # rss-peak-tree | rss-tree | nvml-tree | ...
    "kv_budget_bytes": pa.int64(),
    "versions": pa.string(),            # library versions in the engine's environment
    "model_fingerprint": pa.string(),   # content hash of the model's weights, config and tokenizer files
    "host": pa.string(),                # the node's CPU, memory, GPUs and NVIDIA driver (adapters/contract/host.py)
    "engine_args": pa.string(),         # the arguments given to the engine
    "engine_deviation": pa.string(),    # LoadFacts.engine_deviation: a by-design difference the verdict names
    "attempt": pa.int32(),              # which engine process of the group ran the cell
    "group_tries": pa.int32(),          # times the group was sent to Ray (over 1: its node was lost)
    "started_at": pa.string(),
    "search_id": pa.string(),           # serve.search: the search's cell_id (on its own row too); null: no search
    "workload_json": pa.string(),       # the cell's workload section (before it: in `workload`)
}

# The cells table's columns in the order its files and exports list them; each is a driver column or
# a CellRecord field (adapters/contract/records.py says what each figure is).
CELL_COLUMNS = (
    "run_id", "cell_id", "engine_key", "framework", "model", "quantization", "flags", "flags_json", "batch_size",
    "input_len", "output_len", "mode", "request_rate", "load", "endpoint", "workload", "env", "device", "node_id", "status",
    "reason", "batch_mode", "load_s", "warmup", "repeats", "repeats_halfwidth",
    "spec_draft_tokens", "spec_accepted_tokens", "spec_acceptance",
    "prefix_cache_queries", "prefix_cache_hits", "prefix_cache_hit_rate", "preemptions", "kv_cache_usage_max",
    "requests_waiting_max", "gauge_samples", "energy_j", "energy_j_per_token", "energy_source", "requests",
    "ttft_ms_p50", "ttft_ms_p90", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p90", "tpot_ms_p99",
    "itl_ms_p50", "itl_ms_p90", "itl_ms_p99", "chunk_tokens_mean", "itl_samples", "e2e_ms_p50", "e2e_ms_p90",
    "e2e_ms_p99", "output_tok_s", "total_tok_s", "req_s", "output_tokens", "prompt_tokens", "requests_planned",
    "requests_sent", "errors", "errors_by_kind", "goodput", "goodput_req_s", "slo_ttft_ms", "slo_tpot_ms",
    "slo_e2e_ms", "queue_ms_p50", "queue_ms_p90", "queue_ms_p99", "ttft_ms", "tpot_ms", "e2e_ms",
    "output_tok_s_runs", "ttft_ms_p50_runs", "ttft_ms_p99_runs", "tpot_ms_p50_runs", "tpot_ms_p99_runs",
    "scheduled_ms", "sent_ms",
    "engine_ttft_ms", "engine_ttft_ms_p50", "engine_ttft_agrees", "peak_mem_bytes", "load_peak_mem_bytes",
    "mem_source", "kv_budget_bytes", "versions", "model_fingerprint", "host", "engine_args", "engine_deviation",
    "notes", "missing",
    "attempt", "group_tries", "started_at", "duration_s", "repeat_started_at", "repeat_ended_at", "host_busy_runs",
    "gpu_busy_runs", "output_tok_s_recheck_runs", "base_timing_cell", "base_output_tok_s_runs",
    "base_host_busy_runs", "base_gpu_busy_runs", "base_repeat_started_at", "base_repeat_ended_at", "search_id",
    "search_variable", "search_probe",
    "search_meets", "search_checks", "search_missed", "search_max", "search_fail", "search_probes", "search_slos",
    "workload_json", "env_facts",
)

_SCALARS = {int: pa.int64(), float: _f64, bool: pa.bool_(), str: pa.string()}


def _arrow_type(annotation: Any) -> tuple[pa.DataType, bool]:
    """(Arrow type, stored as JSON text) of a CellRecord field's annotation: Int32-marked ints in 32 bits,
    lists of floats as lists, dicts and lists of anything else as JSON text."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return _arrow_type(inner)
    if origin is Annotated:
        t, json_text = _arrow_type(args[0])
        return (pa.int32(), json_text) if "int32" in args[1:] else (t, json_text)
    if origin is list and args == (float,):
        return _list_f64, False
    if origin in (list, dict):
        return pa.string(), True
    return _SCALARS[annotation], False


def _record_columns() -> dict[str, tuple[pa.DataType, bool]]:
    hints = get_type_hints(CellRecord, include_extras=True)
    return {name: _arrow_type(hints[name]) for name in CellRecord.model_fields}


_RECORD = _record_columns()
_unplaced = (set(_RECORD) | set(DRIVER_COLUMNS)) ^ set(CELL_COLUMNS)
if _unplaced or set(_RECORD) & set(DRIVER_COLUMNS):
    raise RuntimeError(f"the cells table and CellRecord disagree on {sorted(_unplaced)}: place each CellRecord "
                       "field in CELL_COLUMNS (orchestrator/store/schema.py)")

CELLS_SCHEMA = pa.schema([(c, DRIVER_COLUMNS[c] if c in DRIVER_COLUMNS else _RECORD[c][0]) for c in CELL_COLUMNS])

# The cells columns that hold JSON text. Only the store writes them (from dicts and lists) and reads
# them back (json_value, json_object): no other module parses or encodes a JSON column.
JSON_COLUMNS = ("flags_json", "versions", "host", "engine_args", "workload_json", "env_facts",
                *(c for c, (_, json_text) in _RECORD.items() if json_text))


def encode_json(value: Any) -> str | None:
    """A JSON column's text: keys sorted, anything JSON cannot say (a path, an enum) as its text."""
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def json_value(text: Any, default: Any = None) -> Any:
    """A JSON column's value read back: a dict or list, or `default` for null (NaN in pandas), text that
    is not JSON, or a value of the wrong kind."""
    if isinstance(text, (dict, list)):
        return text
    if not isinstance(text, str) or not text:
        return default
    try:
        value = json.loads(text)
    except ValueError:
        return default
    return value if default is None or isinstance(value, type(default)) else default


def json_object(text: Any) -> dict:
    """A JSON column that holds an object, as a dict ({} for null, malformed or not an object)."""
    return json_value(text, {})


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
    ("score_weight", _f64),                  # a perplexity metric's words or bytes (score: the loglikelihood)
    ("aggregation", pa.string()),            # how the scores aggregate (lm-eval's name; null: mean)
    ("higher_is_better", pa.bool_()),        # null: higher is better
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
    return {"compression": "zstd", "use_dictionary": others, "use_byte_stream_split": floats,
            "write_page_checksum": True}


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
CELL_FILE_OPTIONS = {"compression": "none", "use_dictionary": False, "write_statistics": False,
                     "write_page_checksum": True}
