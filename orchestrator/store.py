"""The run directory: fixed-schema tables (cells, and the side tables: logprobs, tasks, samples)
plus a manifest; every write crash-safe.

results/<run>/
  manifest.json                                   the matrix as given, the cells, host, versions
  journal/<created ns>-<pid>.journal2             while a run goes: each stored cell appended as one
                                                  record, its side rows and its cells row together
                                                  (orchestrator/journal.py), one file per writing process
  compacted.json                                  after a compaction: which compacted files are live
  cells/framework=<fw>/compacted-<g>.parquet      the cells folded by compaction <g> (one file)
  logprobs/framework=<fw>/compacted-<g>.parquet   their logprobs, grouped by cell (likely references first)
  tasks/, samples/ ... /compacted-<g>.parquet     the other side tables the same way
  cells/framework=<fw>/<cell_id>.parquet          written by earlier versions: one file per cell and
  logprobs/framework=<fw>/<cell_id>.parquet       table (still read, and folded by the next compaction)

A cell is one record appended in one write(): a killed driver leaves whole records and at most a
torn last one, which readers skip, so a cell's row is never seen without its side rows. A cell
stored again (`--rerun-failed`, a retried group) gets a new record, and the newest copy wins: a
journal record over a per-cell file over the compacted files. At a run's end (and with `bench
compact`) everything is folded into one cells file and one file per side table per framework
(orchestrator/compaction.py), and the journal files are deleted.
Readers go through RunStore (read_cells_table, stored_status, logprob_files, logprob_batches) and
Layout, which apply that rule; only compacted files named in compacted.json are live.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from adapters.contract import LOGPROB_COLUMNS
from orchestrator.bulk_parquet import conform
from orchestrator.journal import JOURNAL_DIR, JournalReader, JournalWriter, Record, journal_files, scan

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
    ("prefix_cache_queries", pa.int64()),  # engine telemetry over the timed runs (adapters/telemetry.py):
    ("prefix_cache_hits", pa.int64()),     # prompt tokens looked up in the prefix cache, and found there,
    ("prefix_cache_hit_rate", _f64),       # hits / queries,
    ("preemptions", pa.int64()),           # requests preempted,
    ("kv_cache_usage_max", _f64),          # served: largest KV-cache share in the gauge samples,
    ("requests_waiting_max", pa.int64()),  # served: longest server queue in them,
    ("gauge_samples", pa.int32()),         # served: how many samples (one a second during the timed runs)
    ("energy_j", _f64),                    # energy of the timed runs from RAPL / NVML (adapters/energy.py),
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
    ("host", pa.string()),                # JSON: the node's CPU, GPUs and NVIDIA driver (adapters/provenance.py)
    ("engine_args", pa.string()),         # JSON: the arguments given to the engine
    ("notes", pa.string()),               # JSON list of caveats the adapter reported
    ("missing", pa.string()),             # JSON: figure -> why it is null (nothing unmeasured is a number)
    ("attempt", pa.int32()),              # which engine process of the group ran the cell
    ("group_tries", pa.int32()),          # times the group was sent to Ray (over 1: its node was lost)
    ("started_at", pa.string()),
    ("duration_s", _f64),
    # serve.search (adapters/slo_search.py): a search's own row (load "search rate" | "search concurrency")
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
    """The worker's row layout (adapters.contract.LOGPROB_COLUMNS) as Parquet columns, after the run
    and cell ids; `kind` is stored by name (prompt: teacher forced | generation: greedy)."""
    fields = [("run_id", pa.string()), ("cell_id", pa.string())]
    for name, dtype, is_list in LOGPROB_COLUMNS:
        t = pa.string() if name == "kind" else pa.from_numpy_dtype(np.dtype(dtype))
        fields.append((name, pa.list_(t) if is_list else t))
    return pa.schema(fields)


LOGPROBS_SCHEMA = _logprobs_schema()

# The task layer: one row per (cell, task, item), so every comparison pairs items (orchestrator/task_metrics.py).
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

# The sampling layer: one row per seeded sample (adapters.contract.SAMPLE_COLUMNS), with its ids and
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


def _atomic_write_table(table: pa.Table, path: Path, options: dict | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp, **(options or {"compression": "zstd"}))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    return table.combine_chunks().to_batches()[0]


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def cell_row(values: dict[str, Any]) -> pa.Table:
    """One cells-file row (no framework column); missing columns are null, unknown keys an error."""
    unknown = set(values) - set(CELLS_SCHEMA.names)
    if unknown:
        raise KeyError(f"not in the cells schema: {sorted(unknown)}")
    names = CELLS_FILE_SCHEMA.names
    return pa.Table.from_pylist([{name: values.get(name) for name in names}], schema=CELLS_FILE_SCHEMA)


def is_run_dir(path: Path) -> bool:
    """A run directory: a manifest, stored cells, or a journal."""
    path = Path(path)
    return (path / "manifest.json").is_file() or (path / "cells").is_dir() or (path / JOURNAL_DIR).is_dir()


_JOURNALS: dict[tuple[str, int], JournalWriter] = {}   # (resolved run dir, pid) -> this process's journal


class RunStore:
    def __init__(self, run_dir: str | Path):
        self.root = Path(run_dir)

    @property
    def run_id(self) -> str:
        return self.root.name

    def cell_path(self, framework: str, cell_id: str) -> Path:
        return self.root / "cells" / f"framework={framework}" / f"{cell_id}.parquet"

    def side_path(self, name: str, framework: str, cell_id: str) -> Path:
        """The per-cell file of side table `name` (SIDE_TABLES)."""
        return self.root / name / f"framework={framework}" / f"{cell_id}.parquet"

    def logprobs_path(self, framework: str, cell_id: str) -> Path:
        return self.side_path("logprobs", framework, cell_id)

    def write_cell(self, row: dict[str, Any], logprobs: pa.Table | None = None, tasks: pa.Table | None = None,
                   samples: pa.Table | None = None) -> None:
        """One record in the journal: the logprob, task and sample rows, then the cell row, in one
        write(), so a stored cell row means its rows are complete. A cell stored again without rows
        of a table has none (its older rows are not read)."""
        batches = []
        for name, table in (("logprobs", logprobs), ("tasks", tasks), ("samples", samples)):
            if table is not None and table.num_rows:
                batches.append((name, _one_batch(table.cast(SIDE_TABLES[name].schema))))
        batches.append(("cells", _one_batch(cell_row(row))))
        key = (str(self.root.resolve()), os.getpid())   # a forked child writes its own file
        writer = _JOURNALS.get(key)
        if writer is None:
            schemas = {"cells": CELLS_FILE_SCHEMA, **{n: t.schema for n, t in SIDE_TABLES.items()}}
            writer = _JOURNALS[key] = JournalWriter(self.root, schemas)
        writer.append(row["cell_id"], row["framework"], batches)

    def write_cell_files(self, row: dict[str, Any], logprobs: pa.Table | None = None, tasks: pa.Table | None = None,
                         samples: pa.Table | None = None) -> None:
        """The layout earlier versions wrote (a Parquet file per cell and table, side rows first, each
        renamed into place): still read and folded; kept so tests can build such run dirs."""
        fw, cid = row["framework"], row["cell_id"]
        for name, table in (("logprobs", logprobs), ("tasks", tasks), ("samples", samples)):
            path, side = self.side_path(name, fw, cid), SIDE_TABLES[name]
            if table is not None and table.num_rows:
                _atomic_write_table(table.cast(side.schema), path, side.write_options)
            else:
                path.unlink(missing_ok=True)
        _atomic_write_table(cell_row(row), self.cell_path(fw, cid), CELL_FILE_OPTIONS)

    @contextlib.contextmanager
    def writing(self):
        """Hold the run dir's writer lock (re-entrant in this process): one writer per run dir.
        An flock, so a killed writer leaves no stale lock."""
        key = str(self.root.resolve())
        held = _WRITER_LOCKS.get(key)
        if held:
            held[1] += 1
        else:
            self.root.mkdir(parents=True, exist_ok=True)
            f = open(self.root / ".lock", "w")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                raise RuntimeError(f"another bench process is writing {self.root} (bench run or bench compact)") from None
            except OSError:  # a file system without locks: one writer by convention, as before
                pass
            _WRITER_LOCKS[key] = held = [f, 1]
        try:
            yield self
        finally:
            held[1] -= 1
            if not held[1]:
                del _WRITER_LOCKS[key]
                held[0].close()

    # ------------------------------------------------------------------ reading (both layouts)

    def layout(self) -> "Layout":
        """Which files hold the run's rows now: per-cell files, and the compacted ones compacted.json names."""
        return Layout.scan(self.root)

    def read_cells_table(self, columns: list[str] | None = None) -> pa.Table:
        """The cells table as Arrow (CELLS_SCHEMA order, or `columns`): one row per cell, its newest copy."""
        return self.layout().read_cells(columns)

    def stored_status(self) -> dict[str, str]:
        """cell_id -> status of every cell stored so far."""
        t = self.read_cells_table(["cell_id", "status"])
        return dict(zip(t["cell_id"].to_pylist(), t["status"].to_pylist()))

    def read_cells(self):
        """The cells table as pandas (small: one row per cell)."""
        return self.read_cells_table().to_pandas()

    def logprob_files(self) -> dict[str, Path]:
        """cell_id -> the file holding its logprobs, for every stored cell that has logprobs. A
        compacted file also holds other cells (and maybe older rows of a cell stored again since):
        select its rows by cell_id and file."""
        return self.layout().logprob_files()

    def logprob_batches(self, columns: list[str] | None = None, batch_size: int = 65536):
        """The logprobs table as Arrow record batches: every stored cell's rows once (its newest copy)."""
        return self.layout().logprob_batches(columns, batch_size)

    def read_logprobs(self, columns: list[str] | None = None) -> pa.Table:
        """The whole logprobs table as Arrow (large runs: prefer logprob_batches)."""
        schema = LOGPROBS_SCHEMA if columns is None else pa.schema([LOGPROBS_SCHEMA.field(c) for c in columns])
        return pa.Table.from_batches(list(self.logprob_batches(columns)), schema=schema)

    def read_tasks(self, columns: list[str] | None = None) -> pa.Table:
        """The tasks table: every stored cell's per-item task rows (small: items x tasks x cells)."""
        return self._read_side_table("tasks", columns)

    def read_samples(self, columns: list[str] | None = None) -> pa.Table:
        """The samples table: every stored cell's seeded samples (prompts x seeds x repeats per cell)."""
        return self._read_side_table("samples", columns)

    def _read_side_table(self, name: str, columns: list[str] | None) -> pa.Table:
        schema = SIDE_TABLES[name].schema
        schema = schema if columns is None else pa.schema([schema.field(c) for c in columns])
        return pa.Table.from_batches(list(self.layout().side_batches(name, columns)), schema=schema)

    def write_manifest(self, manifest: dict) -> None:
        atomic_write_text(self.root / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True, default=str))

    def read_manifest(self) -> dict:
        path = self.root / "manifest.json"
        return json.loads(path.read_text()) if path.exists() else {}



# ------------------------------------------------------------------ layout: per-cell and compacted files

_WRITER_LOCKS: dict[str, list] = {}   # resolved run dir -> [open lock file, depth]
COMMIT_FILE = "compacted.json"        # the commit record of the last compaction
COMPACTED_PREFIX = "compacted-"       # cells|logprobs/framework=<fw>/compacted-<generation>.parquet
STAGING_PREFIX = ".compacting-"       # a compaction's files before its commit (hidden from pandas/DuckDB globs)


def is_cell_file(name: str) -> bool:
    """A per-cell file (<cell_id>.parquet), not a compacted, temporary or staging one."""
    return name.endswith(".parquet") and not name.startswith((".", "_", COMPACTED_PREFIX))


_CELL_FILES_PER_SCAN = 4000


def read_cell_files(paths: list[str], columns: list[str]) -> pa.Table:
    """`columns` (of CELLS_FILE_SCHEMA) of many per-cell files, in one DuckDB scan (about half the
    per-file cost of a pyarrow dataset on ~80-column files); a column a file lacks (written before
    the schema grew) reads as null."""
    import duckdb

    schema = pa.schema([CELLS_FILE_SCHEMA.field(c) for c in columns])
    names = ", ".join(f'"{c}"' for c in columns)
    out = []
    # a few thousand files per scan: DuckDB holds every file's metadata of a scan (100k files at
    # once took 11 GiB here; 4,000 at a time stays under 1 GiB, and is as fast)
    for i in range(0, len(paths), _CELL_FILES_PER_SCAN):
        batch = paths[i:i + _CELL_FILES_PER_SCAN]
        con = duckdb.connect(config={"memory_limit": "1GB", "enable_external_file_cache": False})
        try:
            con.execute("SET enable_progress_bar = false")
            try:   # only the columns wanted (a third of the cost for two), when every file has them all
                t = con.sql(f"SELECT {names} FROM read_parquet($files, hive_partitioning = false)",
                            params={"files": batch}).to_arrow_table()
            except duckdb.Error:   # files written before the schema grew: a column a file lacks reads as null
                t = con.sql("SELECT * FROM read_parquet($files, union_by_name = true, hive_partitioning = false)",
                            params={"files": batch}).to_arrow_table()
        finally:
            con.close()
        # copied into whole buffers: DuckDB's result holds a 2048-row vector per one-row file (~100 KB each)
        t = t.combine_chunks()
        cols = [t[c].cast(f.type) if c in t.column_names else pa.nulls(t.num_rows, f.type) for c, f in zip(columns, schema)]
        out.append(pa.Table.from_arrays(cols, schema=schema))
    return pa.concat_tables(out) if out else schema.empty_table()


def _upgrade_workload(t: pa.Table) -> pa.Table:
    """Rows stored before named workloads held the workload section's JSON in `workload` and had no
    `workload_json`: read them as the single section's rows of today (name null, JSON in workload_json)."""
    import pyarrow.compute as pc

    if "workload_json" not in t.column_names:
        return t
    old = pc.is_null(t["workload_json"])
    if not pc.any(old).as_py():
        return t
    fixed_json = pc.if_else(old, t["workload"], t["workload_json"])
    fixed_name = pc.if_else(old, pa.nulls(t.num_rows, pa.string()), t["workload"])
    t = t.set_column(t.column_names.index("workload_json"), "workload_json", fixed_json)
    return t.set_column(t.column_names.index("workload"), "workload", fixed_name)


def read_commit(root: Path) -> dict:
    path = Path(root) / COMMIT_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def _per_cell(table_dir: Path, compacted: list | None = None) -> dict[tuple[str, str], Path]:
    """(framework, cell_id) -> path of every per-cell file under cells/ or logprobs/ (one listing, no
    opens); the compacted files seen go to `compacted`."""
    out: dict[tuple[str, str], Path] = {}
    if not table_dir.is_dir():
        return out
    for part in os.scandir(table_dir):
        if not (part.is_dir() and part.name.startswith("framework=")):
            continue
        fw = part.name.split("=", 1)[1]
        for entry in os.scandir(part.path):
            if is_cell_file(entry.name):
                out[(fw, entry.name[: -len(".parquet")])] = Path(entry.path)
            elif compacted is not None and entry.name.startswith(COMPACTED_PREFIX):
                compacted.append(Path(entry.path))
    return out


class Layout:
    """The files that hold a run's rows, and the rule that picks each cell's newest copy.

    A cell is stored as a record in a journal file (journal/, orchestrator/journal.py), as its own
    files (cells/framework=<fw>/<cell_id>.parquet and its side rows beside it: the layout of
    earlier versions), or inside the compacted files the commit record names. Newest first: the
    last journal record of the cell (files by name, records in order), then its own files (written
    only after the compaction that folded the older copy, or that copy itself when a compaction was
    killed before it removed them), then the compacted files. A cell's side rows come from the same
    place as its cells row; a per-cell side file without a cells row is an interrupted write and is
    not read.
    """

    def __init__(self, root: Path, record: dict, percell: dict, percell_side: dict[str, dict],
                 journals: list[tuple[Path, dict[str, pa.Schema], list[Record]]] | None = None):
        self.root, self.record = Path(root), record
        staged = record.get("staged") or {}

        def resolve(rel: str) -> Path:  # after the commit, before the rename: the staging name
            final = self.root / rel
            return final if final.exists() or rel not in staged else self.root / staged[rel]

        self.generation = int(record.get("generation", 0))
        self.cells_parts: dict[str, Path] = {fw: resolve(rel) for fw, rel in (record.get("cells") or {}).items()}
        # journal: every file (to fold and delete), its schemas, and each cell's last record
        self.journal_files: list[Path] = [path for path, _, _ in journals or []]
        self.journal_schemas: dict[Path, dict[str, pa.Schema]] = {path: sch for path, sch, _ in journals or []}
        self.journal: dict[str, Record] = {}
        for _, _, records in journals or []:
            self.journal.update((r.cell_id, r) for r in records)
        # per-cell files (earlier versions): all of them (to fold and delete), and the live ones
        self.percell_files: dict[tuple[str, str], Path] = percell
        self.percell_paths: dict[str, Path] = {cid: p for (fw, cid), p in percell.items()}
        self.percell: dict[str, str] = {cid: fw for fw, cid in percell if cid not in self.journal}  # cell_id -> fw
        self.newer: set[str] = set(self.journal) | set(self.percell)   # what the compacted copies lose to
        # per side table (SIDE_TABLES): its compacted files (path -> their record entry) and per-cell files
        self.side_parts: dict[str, dict[Path, dict]] = {
            name: {resolve(rel): info for rel, info in (record.get(name) or {}).items()} for name in SIDE_TABLES}
        self.percell_side: dict[str, dict[tuple[str, str], Path]] = percell_side
        self.lp_parts, self.percell_lp = self.side_parts["logprobs"], percell_side["logprobs"]

    @classmethod
    def scan(cls, root: Path) -> "Layout":
        root = Path(root)
        compacted: list[Path] = []
        record = read_commit(root)
        percell = _per_cell(root / "cells", compacted)
        percell_side = {name: _per_cell(root / name, compacted) for name in SIDE_TABLES}
        if compacted and not record:  # never guess, and never write over them
            raise RuntimeError(f"{root} has compacted files ({compacted[0].relative_to(root)}, ...) but no "
                               f"{COMMIT_FILE}, which says which rows they hold: restore it (it was copied or "
                               f"removed without them?), or move the compacted files away")
        journals = [(path, *scan(path)) for path in journal_files(root)]
        return cls(root, record, percell, percell_side, journals)

    @property
    def compacted(self) -> bool:
        return bool(self.cells_parts)

    def journal_cells(self, columns: list[str], cell_ids=None) -> pa.Table:
        """The cells rows (`columns` of CELLS_FILE_SCHEMA, then framework) of the journal's live
        records, or of `cell_ids` among them, in that order."""
        schema = pa.schema([CELLS_FILE_SCHEMA.field(c) for c in columns])
        recs = list(self.journal.values()) if cell_ids is None else [self.journal[c] for c in cell_ids]
        by_file: dict[Path, list[int]] = {}
        for i, rec in enumerate(recs):
            by_file.setdefault(rec.path, []).append(i)
        tables, where, have = [], np.empty(len(recs), np.int64), 0
        for path, idx in by_file.items():   # the rows of one file share its schema
            group = [recs[i] for i in idx]
            with JournalReader(path, self.journal_schemas[path]) as r:
                t, pos = r.cells(group)
            fws = np.full(t.num_rows, None, object)   # a row no record asked for (an older copy) is dropped below
            fws[pos] = [rec.framework for rec in group]
            tables.append(conform(t.select([c for c in columns if c in t.column_names]), schema).append_column(
                "framework", pa.array(fws, pa.string())))
            where[idx] = pos + have
            have += t.num_rows
        if not tables:
            return schema.append(pa.field("framework", pa.string())).empty_table()
        t = pa.concat_tables(tables)
        # in the order asked for: one take of all files' rows
        return t if len(where) == have and (where == np.arange(have)).all() else t.take(pa.array(where))

    def read_cells(self, columns: list[str] | None = None) -> pa.Table:
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        names = list(columns or CELLS_SCHEMA.names)
        out_schema = pa.schema([CELLS_SCHEMA.field(c) for c in names])
        read = [c for c in names if c != "framework"]
        read += [] if "cell_id" in read else ["cell_id"]
        if {"workload", "workload_json"} & set(read):   # both: a row of before named workloads is upgraded
            read += [c for c in ("workload", "workload_json") if c not in read]
        tables = []
        newer = pa.array(sorted(self.newer), pa.string())
        for fw, path in sorted(self.cells_parts.items()):
            t = ds.dataset(str(path), format="parquet", schema=CELLS_FILE_SCHEMA).to_table(columns=read)
            if len(newer):
                t = t.filter(pc.invert(pc.is_in(t["cell_id"], value_set=newer)))
            tables.append(t.append_column("framework", pa.array([fw] * t.num_rows, pa.string())))
        if self.percell:
            t = read_cell_files([str(self.percell_paths[c]) for c in sorted(self.percell)], read)
            fws = pa.array([self.percell[c] for c in t["cell_id"].to_pylist()], pa.string())
            tables.append(t.append_column("framework", fws))
        if self.journal:
            tables.append(self.journal_cells(read))
        if not tables:
            return out_schema.empty_table()
        return _upgrade_workload(pa.concat_tables(tables)).select(names).cast(out_schema)

    def logprob_files(self) -> dict[str, Path]:
        return self.side_files("logprobs")

    def side_files(self, name: str) -> dict[str, Path]:
        """cell_id -> the file holding its rows of side table `name`, for every stored cell with some.
        A compacted or journal file also holds other cells (and maybe older rows of a cell stored
        again since): select by cell_id and file; a journal file is read through journal_rows."""
        out: dict[str, Path] = {}
        for path, info in self.side_parts[name].items():
            out.update(dict.fromkeys(info["cells"], path))
        percell = self.percell_side[name]
        for cid, fw in self.percell.items():
            own = percell.get((fw, cid))
            if own is None:
                out.pop(cid, None)   # stored again without rows: the compacted ones are stale
            else:
                out[cid] = own
        for cid, rec in self.journal.items():
            if name in rec.parts:
                out[cid] = rec.path
            else:
                out.pop(cid, None)
        return out

    def compacted_rows(self, name: str = "logprobs") -> dict[str, tuple[Path, int, int]]:
        """cell_id -> (compacted file of side table `name`, first row, rows) of every cell read from one."""
        out: dict[str, tuple[Path, int, int]] = {}
        for path, info in self.side_parts[name].items():
            start = 0
            for cid, n in zip(info["cells"], info["rows"]):
                if cid not in self.newer:
                    out[cid] = (path, start, n)
                start += n
        return out

    def journal_rows(self, name: str, path: Path, cell_ids, columns: list[str] | None = None) -> pa.Table:
        """Side table `name`'s rows of those of `cell_ids` whose live record is in journal file `path`."""
        schema = SIDE_TABLES[name].schema
        schema = schema if columns is None else pa.schema([schema.field(c) for c in columns])
        path = Path(path)
        recs = [self.journal[c] for c in cell_ids if c in self.journal and self.journal[c].path == path]
        tables = [t for _, t in self.journal_batches(name, recs, columns)]
        return pa.concat_tables(tables) if tables else schema.empty_table()

    def journal_batches(self, name: str, records, columns: list[str] | None = None):
        """(cell_id, its rows of side table `name` in the current schema) of the journal `records`
        that have some, in the given order."""
        schema = SIDE_TABLES[name].schema
        schema = schema if columns is None else pa.schema([schema.field(c) for c in columns])
        readers: dict[Path, JournalReader] = {}
        try:
            for rec in records:
                r = readers.get(rec.path)
                if r is None:
                    r = readers[rec.path] = JournalReader(rec.path, self.journal_schemas[rec.path])
                b = r.batch(rec, name)
                if b is not None:
                    yield rec.cell_id, conform(pa.Table.from_batches([b]), schema)
        finally:
            for r in readers.values():
                r.close()

    def logprob_batches(self, columns: list[str] | None = None, batch_size: int = 65536):
        return self.side_batches("logprobs", columns, batch_size)

    def side_batches(self, name: str, columns: list[str] | None = None, batch_size: int = 65536):
        """Side table `name` as Arrow record batches: every stored cell's rows once (its newest copy)."""
        import pyarrow.compute as pc
        import pyarrow.dataset as ds

        schema = SIDE_TABLES[name].schema
        columns = list(columns or schema.names)
        for path, info in sorted(self.side_parts[name].items()):
            stale = [c for c in info["cells"] if c in self.newer]
            where = pc.invert(pc.field("cell_id").isin(pa.array(stale, pa.string()))) if stale else None
            yield from ds.dataset(str(path), format="parquet", schema=schema).to_batches(
                columns=columns, filter=where, batch_size=batch_size)
        live = [str(p) for (fw, cid), p in sorted(self.percell_side[name].items()) if self.percell.get(cid) == fw]
        if live:
            yield from ds.dataset(live, format="parquet", schema=schema).to_batches(
                columns=columns, batch_size=batch_size)
        for _, t in self.journal_batches(name, self.journal.values(), columns):
            yield from t.to_batches()
