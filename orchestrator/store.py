"""The run directory: two Parquet tables with fixed schemas, plus a manifest; written atomically.

results/<run>/
  manifest.json                                   the matrix as given, the cells, host, versions
  cells/framework=<fw>/<cell_id>.parquet          one row per cell (CELLS_SCHEMA)
  logprobs/framework=<fw>/<cell_id>.parquet       one row per scored position (LOGPROBS_SCHEMA)

Each file is written to a temporary name and renamed, so a killed driver leaves whole files or
none, and a re-run replaces a cell's files instead of adding rows: no duplicates.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

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
    ("workload", pa.string()),            # JSON of the workload section
    ("device", pa.string()),
    ("node_id", pa.string()),             # the Ray node that ran the cell
    ("status", pa.string()),              # ok | unsupported | failed | crashed | timeout
    ("reason", pa.string()),
    ("batch_mode", pa.string()),          # batched | sequential (never silent)
    ("load_s", _f64),
    ("warmup", pa.int32()),
    ("repeats", pa.int32()),
    ("requests", pa.int32()),             # timed requests (repeats x batch_size)
    ("ttft_ms_p50", _f64), ("ttft_ms_p90", _f64), ("ttft_ms_p99", _f64),
    ("tpot_ms_p50", _f64), ("tpot_ms_p90", _f64), ("tpot_ms_p99", _f64),
    ("itl_ms_p50", _f64), ("itl_ms_p90", _f64), ("itl_ms_p99", _f64),
    ("e2e_ms_p50", _f64), ("e2e_ms_p90", _f64), ("e2e_ms_p99", _f64),
    ("output_tok_s", _f64),               # mean over repeats
    ("total_tok_s", _f64),
    ("req_s", _f64),
    ("ttft_ms", _list_f64),               # per request, for percentiles and bootstrap
    ("tpot_ms", _list_f64),
    ("e2e_ms", _list_f64),
    ("output_tok_s_runs", _list_f64),     # per repeat
    ("engine_ttft_ms", _list_f64),        # the engine's own TTFT where it reports one
    ("peak_mem_bytes", pa.int64()),       # during this cell's timed runs
    ("load_peak_mem_bytes", pa.int64()),
    ("mem_source", pa.string()),          # rss-tree | nvml | ...
    ("kv_budget_bytes", pa.int64()),
    ("versions", pa.string()),            # JSON: library versions in the engine's environment
    ("engine_args", pa.string()),         # JSON: the arguments given to the engine
    ("notes", pa.string()),               # JSON list of caveats the adapter reported
    ("attempt", pa.int32()),              # which engine process of the group ran the cell
    ("group_tries", pa.int32()),          # times the group was sent to Ray (over 1: its node was lost)
    ("started_at", pa.string()),
    ("duration_s", _f64),
])

LOGPROBS_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("cell_id", pa.string()),
    ("kind", pa.string()),                # prompt (teacher forced) | generation (greedy)
    ("repeat", pa.int16()),
    ("prompt_index", pa.int32()),
    ("position", pa.int32()),             # index of the scored token in its sequence
    ("token_id", pa.int32()),
    ("logprob", pa.float32()),
    ("topk_ids", pa.list_(pa.int32())),
    ("topk_logprobs", pa.list_(pa.float32())),
])

STATUSES = ("ok", "unsupported", "failed", "crashed", "timeout")
# The framework lives in the partition directory name only: a column of the same name inside the
# files would clash with the hive partition when pandas or DuckDB read the directory.
CELLS_FILE_SCHEMA = CELLS_SCHEMA.remove(CELLS_SCHEMA.get_field_index("framework"))


def _atomic_write_table(table: pa.Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=path.parent)
    os.close(fd)
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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


class RunStore:
    def __init__(self, run_dir: str | Path):
        self.root = Path(run_dir)

    @property
    def run_id(self) -> str:
        return self.root.name

    def cell_path(self, framework: str, cell_id: str) -> Path:
        return self.root / "cells" / f"framework={framework}" / f"{cell_id}.parquet"

    def logprobs_path(self, framework: str, cell_id: str) -> Path:
        return self.root / "logprobs" / f"framework={framework}" / f"{cell_id}.parquet"

    def write_cell(self, row: dict[str, Any], logprobs: pa.Table | None = None) -> None:
        """Logprobs first, then the cell row: a stored cell row means its logprobs are complete."""
        fw, cid = row["framework"], row["cell_id"]
        lp_path = self.logprobs_path(fw, cid)
        if logprobs is not None and logprobs.num_rows:
            _atomic_write_table(logprobs.cast(LOGPROBS_SCHEMA), lp_path)
        else:
            lp_path.unlink(missing_ok=True)  # a re-run that captured nothing leaves no stale rows
        _atomic_write_table(cell_row(row), self.cell_path(fw, cid))

    def remove_partial_writes(self) -> int:
        """Temporary files left by a driver killed mid-write; never read, removed on resume."""
        stale = list(self.root.rglob(".tmp-*")) if self.root.exists() else []
        for path in stale:
            path.unlink(missing_ok=True)
        return len(stale)

    def stored_status(self) -> dict[str, str]:
        """cell_id -> status of every cell stored so far."""
        out = {}
        for path in (self.root / "cells").glob("framework=*/*.parquet"):
            table = pq.read_table(path, columns=["cell_id", "status"])
            for cid, status in zip(table["cell_id"].to_pylist(), table["status"].to_pylist()):
                out[cid] = status
        return out

    def read_cells(self):
        """The cells table as pandas (small: one row per cell)."""
        import pyarrow.dataset as ds

        if not (self.root / "cells").exists():
            return CELLS_SCHEMA.empty_table().to_pandas()
        dataset = ds.dataset(self.root / "cells", format="parquet", partitioning="hive")
        table = dataset.to_table(columns=CELLS_FILE_SCHEMA.names + ["framework"])
        framework = table["framework"].cast(pa.string())
        return table.set_column(table.schema.get_field_index("framework"), "framework", framework).to_pandas()

    def logprobs_dataset(self):
        import pyarrow.dataset as ds

        return ds.dataset(self.root / "logprobs", format="parquet", schema=LOGPROBS_SCHEMA, partitioning="hive")

    def write_manifest(self, manifest: dict) -> None:
        atomic_write_text(self.root / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True, default=str))

    def read_manifest(self) -> dict:
        path = self.root / "manifest.json"
        return json.loads(path.read_text()) if path.exists() else {}

