"""What `bench explain RUN CELL --layers` stores, beside the culprit search's explain.json: RUN/explain/<cell_id>/
layers.json (the report: the first layer beyond the floor, the layer where the error grows most, the line said,
the captures' sizes, or why there is none; sealed: a digest of itself in front, checked when read) and
layers.parquet (one row per capture index: embeddings, then block 0 .. n-1, each split in two where captured so; written with page checksums and read
with their verification on), so a flipped byte is a DamagedFile, never a different figure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.store.explain_file import EXPLAIN_DIR
from orchestrator.store.integrity import DamagedFile, read_sealed, seal

LAYERS_FILE = "layers.json"
LAYERS_TABLE = "layers.parquet"

LAYERS_SCHEMA = pa.schema([
    ("cell_id", pa.string()),
    ("layer", pa.int32()),            # -1 the embeddings, then blocks 0 .. n-1 (the last one after the final norm)
    ("part", pa.string()),            # with split blocks: "attention" (the residual after it) or "FFN" (the output)
    ("name", pa.string()),
    ("rel_error", pa.float64()),      # ||h_cell - h_base|| / ||h_base||, pooled over prompts and positions
    ("floor", pa.float64()),          # the baseline's own largest relative error between its captures
    ("beyond_floor", pa.bool_()),
    ("growth", pa.float64()),         # rel_error minus the previous index's (null for the embeddings)
])


def layers_dir(run_dir: str | Path, cell_id: str) -> Path:
    return Path(run_dir) / EXPLAIN_DIR / cell_id


def write_layers(run_dir: str | Path, cell_id: str, report: dict[str, Any]) -> Path:
    """The report (layer_report's dict plus what was captured) and its per-layer rows, each written atomically."""
    from orchestrator.store.run_store import atomic_write_table, atomic_write_text

    folder = layers_dir(run_dir, cell_id)
    rows = report.get("layers") or []
    prev = [None] + [r["rel_error"] for r in rows[:-1]]
    table = pa.table({
        "cell_id": [cell_id] * len(rows), "layer": [r["layer"] for r in rows],
        "part": [r.get("part") for r in rows], "name": [r["name"] for r in rows],
        "rel_error": [r["rel_error"] for r in rows], "floor": [r["floor"] for r in rows],
        "beyond_floor": [r["beyond_floor"] for r in rows],
        "growth": [None if p is None else r["rel_error"] - p for r, p in zip(rows, prev)]}, schema=LAYERS_SCHEMA)
    # a few rows: plain pages (no compression, no dictionary), each with its checksum
    atomic_write_table(table, folder / LAYERS_TABLE, {"compression": "none", "use_dictionary": False,
                                                      "write_page_checksum": True})
    atomic_write_text(folder / LAYERS_FILE, seal(json.dumps(report, indent=1, sort_keys=True)))
    return folder / LAYERS_FILE


def read_layers(run_dir: str | Path, cell_id: str) -> tuple[dict[str, Any], pa.Table] | None:
    """(report, rows) as stored, None where the cell has no layer report; DamagedFile where a file does not verify."""
    folder = layers_dir(run_dir, cell_id)
    report = read_sealed(folder / LAYERS_FILE)
    if report is None:
        return None
    path = folder / LAYERS_TABLE
    try:
        table = pq.read_table(path, schema=LAYERS_SCHEMA, page_checksum_verification=True)
    except FileNotFoundError:
        raise DamagedFile(path, "missing beside its layers.json") from None
    except (OSError, pa.ArrowException) as e:
        raise DamagedFile(path, f"does not read back: {str(e).splitlines()[0][:160]}") from None
    return report, table


def read_all_layers(run_dir: str | Path) -> tuple[list[tuple[dict[str, Any], pa.Table]], list[str]]:
    """Every stored layer report of a run (by cell id) and a line per one that did not verify (said, never guessed)."""
    out, problems = [], []
    for f in sorted((Path(run_dir) / EXPLAIN_DIR).glob(f"*/{LAYERS_FILE}")):
        try:
            got = read_layers(run_dir, f.parent.name)
        except (DamagedFile, OSError) as e:
            problems.append(str(e).splitlines()[0])
            continue
        if got is not None:
            out.append(got)
    return out, problems
