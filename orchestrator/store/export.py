"""`bench export`: a run's stored tables (cells, tasks, samples; logprobs on request) as CSV or JSONL, and
frames the judge computed from them (the verdicts: `write_frame`; `bench export` writes them beside)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from orchestrator.store.integrity import plain_mode
from orchestrator.store.run_store import RunStore
from orchestrator.store.runs import is_run
from orchestrator.store.schema import LOGPROBS_SCHEMA, SAMPLES_SCHEMA, TASKS_SCHEMA
from orchestrator.values import csv_safe


def _plain(v: Any) -> Any:
    """JSON-safe: NaN/inf -> None, lists recursively."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _write_rows(batches, names: list[str], path: Path, fmt: str) -> int:
    import csv
    import os
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    n = 0
    try:
        with os.fdopen(fd, "w", newline="") as f:
            writer = csv.writer(f) if fmt == "csv" else None
            if writer:
                writer.writerow(names)
            for batch in batches:
                for row in batch.to_pylist():
                    values = [_plain(row.get(k)) for k in names]
                    if writer:
                        writer.writerow(["" if v is None else json.dumps(v) if isinstance(v, (list, dict)) else csv_safe(v)
                                         for v in values])
                    else:
                        f.write(json.dumps(dict(zip(names, values)), allow_nan=False) + "\n")
                    n += 1
        os.chmod(tmp, plain_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n


def export_run(run_dir: str | Path, fmt: str = "csv", out_dir: str | Path | None = None,
               logprobs: bool = False) -> dict[Path, int]:
    """cells.<fmt>, tasks.<fmt> and samples.<fmt> (each where the run stored rows; logprobs.<fmt> with
    `logprobs`: a row per scored token, the largest table by far) in out_dir (default RUN/export);
    {path: rows written}.

    CSV: one header row, list columns as JSON arrays, missing values empty, text beginning = + - @ tab or
    CR prefixed with ' (a spreadsheet does not run it as a formula). JSONL: one JSON object
    per line, missing values and NaN as null.
    """
    check_format(fmt)
    store = RunStore(run_dir)
    if not is_run(store.root):
        raise FileNotFoundError(f"{store.root} is not a run directory (no cells/ and no manifest.json)")
    out = export_dir(store.root, out_dir)
    # arrow, not pandas: integer columns with a null stay integers; each cell once (its newest copy)
    cells = store.read_cells_table()
    written = {out / f"cells.{fmt}": _write_rows(cells.to_batches(), cells.schema.names, out / f"cells.{fmt}", fmt)}
    if logprobs:
        path = out / f"logprobs.{fmt}"
        batches = store.logprob_batches(batch_size=65536)
        written[path] = _write_rows(batches, LOGPROBS_SCHEMA.names, path, fmt)
    for name, schema, read in (("tasks", TASKS_SCHEMA, store.read_tasks), ("samples", SAMPLES_SCHEMA, store.read_samples)):
        table = read()
        if table.num_rows:
            path = out / f"{name}.{fmt}"
            written[path] = _write_rows(table.to_batches(), [n for n in schema.names if n in table.schema.names],
                                        path, fmt)
    return written


def check_format(fmt: str) -> None:
    if fmt not in ("csv", "jsonl"):
        raise ValueError(f"format must be csv or jsonl, got {fmt!r}")


def export_dir(run_dir: Path, out_dir: str | Path | None) -> Path:
    return Path(out_dir) if out_dir else Path(run_dir) / "export"


def write_frame(df, path: Path, fmt: str) -> int:
    """A pandas frame (a verdict table the judge computed) as CSV or JSONL, written like the stored
    tables: atomic, list and dict values as JSON, NaN as missing."""
    from types import SimpleNamespace

    records = json.loads(df.to_json(orient="records", date_format="iso", default_handler=str))
    return _write_rows([SimpleNamespace(to_pylist=lambda: records)], [str(c) for c in df.columns], path, fmt)
