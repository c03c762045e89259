"""rescored.parquet in a run dir: every sampled cell's samples as its baseline's engine scored them (teacher
forced, orchestrator/execution/rescore.py), one row per (scorer, cell, prompt, seed) of repeat 0.

A row holds the sample's ids (a cell stored again with other samples no longer matches its old rows), each
token's raw logprob under the scorer and the scorer's top-k at each position; or, where the scorer could not
score it, null figures and the reason. Written whole (atomically) by the driver after its cells; a resumed run
rewrites it with what it adds.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.store.run_store import atomic_write_table

RESCORED_FILE = "rescored.parquet"

RESCORED_SCHEMA = pa.schema([
    ("scorer_cell_id", pa.string()),       # the baseline cell whose engine scored
    ("scorer_engine_key", pa.string()),    # its engine: the judge uses rows whose scorer is the baseline's engine
    ("cell_id", pa.string()),              # whose sample
    ("prompt_index", pa.int32()),
    ("seed", pa.int64()),
    ("token_ids", pa.list_(pa.int32())),
    ("logprobs", pa.list_(pa.float32())),                      # null: not scored (reason)
    ("topk_ids", pa.list_(pa.list_(pa.int32()))),              # [tokens][k]; empty lists: k = 0
    ("topk_logprobs", pa.list_(pa.list_(pa.float32()))),
    ("reason", pa.string()),
])


def read_rescored(run_dir: str | Path, columns: list[str] | None = None) -> pa.Table:
    """The table, or an empty one where the run has none (a run before rescoring, or without samples)."""
    path = Path(run_dir) / RESCORED_FILE
    if not path.exists():
        schema = RESCORED_SCHEMA if columns is None else pa.schema([RESCORED_SCHEMA.field(c) for c in columns])
        return schema.empty_table()
    return pq.read_table(path, columns=columns, schema=RESCORED_SCHEMA)


def write_rescored(run_dir: str | Path, table: pa.Table) -> None:
    atomic_write_table(table.cast(RESCORED_SCHEMA), Path(run_dir) / RESCORED_FILE)
