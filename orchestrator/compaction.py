"""Compaction: a run's per-cell files folded into one cells file and one logprobs file per framework.

`bench run` stores every cell as two small files (cells/framework=<fw>/<cell_id>.parquet and its
logprobs), written atomically, so a killed run resumes without duplicates. A reader then pays one
Parquet footer per file (~1 ms): 100,000 cells are minutes of footers before any maths. So a run
is compacted when it ends (and with `bench compact RUN`):

    cells/framework=<fw>/compacted-<g>.parquet      every cell of <fw>, sorted by cell_id
    logprobs/framework=<fw>/compacted-<g>.parquet   their logprobs, grouped by cell: the cells an
                                                    analysis likely reads as references first (the
                                                    baseline config's, each engine's batch-1 cell),
                                                    then the rest, each part in cell_id order, in
                                                    row groups of 64k rows (a cell_id range prunes
                                                    them; the references are a few row groups)
    compacted.json                                  the commit record: generation <g>, the live
                                                    compacted files, and per logprobs file the
                                                    cells it holds and their row counts

Compaction <g> (under the run dir's writer lock; the driver is the only writer):
  1. finish or undo what an interrupted compaction left (recover)
  2. per framework with per-cell files: write the new cells file and logprobs file under hidden
     staging names (.compacting-<g>...): the old compacted rows less the cells stored again since,
     merged with the per-cell files in that order, streamed (memory is about one row group)
  3. commit: write compacted.json (temp file + rename), naming the new files, the staging names
     they still have, and the files that are no longer live (the folded per-cell files, the
     replaced compacted files)
  4. rename the staging files to their names, delete the files no longer live, and rewrite
     compacted.json without those lists
A kill before 3 leaves the run as it was (the staging files are hidden and removed by the next
writer); a kill after 3 leaves a committed compaction whose per-cell files are still there: they
hold the same rows and win, so readers see each cell once; the next writer finishes step 4.
A cell stored again after a compaction is a per-cell file again and wins until the next one.
Frameworks without per-cell files keep their compacted files as they are.
"""

from __future__ import annotations

import heapq
import json
import os
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from orchestrator.store import (CELLS_FILE_SCHEMA, COMMIT_FILE, COMPACTED_PREFIX, LOGPROBS_SCHEMA,
                                LOGPROBS_WRITE_OPTIONS, STAGING_PREFIX, Layout, RunStore, atomic_write_text,
                                read_cell_files, read_commit)

ROW_GROUP_ROWS = 65536      # logprobs rows per row group of a compacted file


def _rel(store: RunStore, path: Path) -> str:
    return str(Path(path).relative_to(store.root))


def _commit(store: RunStore, record: dict) -> None:
    atomic_write_text(store.root / COMMIT_FILE, json.dumps(record, sort_keys=True))


def _finish(store: RunStore, record: dict) -> None:
    """Step 4 of a committed compaction; idempotent, so recover() can run it again after a kill."""
    for final, staging in (record.get("staged") or {}).items():
        src = store.root / staging
        if src.exists():
            os.replace(src, store.root / final)
    for rel in record.get("delete") or []:
        (store.root / rel).unlink(missing_ok=True)
    if record.get("staged") or record.get("delete"):
        _commit(store, {k: v for k, v in record.items() if k not in ("staged", "delete")})


def remove_partial_writes(store: RunStore) -> int:
    """What a driver killed mid-write left: temporary files, and the unfinished steps of a compaction
    (`recover`). Never read; removed on resume (by the writer only). Returns files removed."""
    if not store.root.exists():
        return 0
    removed = recover(store)
    stale = list(store.root.rglob(".tmp-*"))
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale) + removed


def recover(store: RunStore) -> int:
    """Finish a committed compaction that was killed, and remove what an uncommitted one wrote.
    Only a writer (it holds the run dir's lock, or is the driver) calls this. Returns files removed."""
    record = read_commit(store.root)
    if record.get("staged") or record.get("delete"):
        _finish(store, record)
        record = read_commit(store.root)
    live = set((record.get("cells") or {}).values()) | set(record.get("logprobs") or {})
    gen = int(record.get("generation", 0))
    removed = 0
    for table in ("cells", "logprobs"):
        base = store.root / table
        if not base.is_dir():
            continue
        for part in base.glob("framework=*"):
            for path in part.iterdir():
                name = path.name
                # staging files were never committed; a compacted file the record does not name is an
                # older generation it replaced (only with a record: without one nothing is guessed)
                stale = name.startswith(STAGING_PREFIX) or (
                    name.startswith(COMPACTED_PREFIX) and _rel(store, path) not in live and _generation(name) < gen)
                if stale:
                    path.unlink(missing_ok=True)
                    removed += 1
    return removed


def _generation(name: str) -> int:
    try:
        return int(name[len(COMPACTED_PREFIX):].split(".")[0].split("-")[0])
    except ValueError:
        return 1 << 62   # not ours: never removed


class _Writer:
    """Logprob rows appended in cell order to one Parquet file, in row groups of ROW_GROUP_ROWS."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.writer = pq.ParquetWriter(path, LOGPROBS_SCHEMA, **LOGPROBS_WRITE_OPTIONS)
        self.buffer: list[pa.Table] = []
        self.buffered = 0
        self.cells: list[str] = []
        self.rows: list[int] = []

    def add(self, cell_id: str, table: pa.Table) -> None:
        if not table.schema.equals(LOGPROBS_SCHEMA):
            table = table.cast(LOGPROBS_SCHEMA)
        self.cells.append(cell_id)
        self.rows.append(table.num_rows)
        self.buffer.append(table)
        self.buffered += table.num_rows
        if self.buffered >= ROW_GROUP_ROWS:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        if not self.buffered:
            return
        t = pa.concat_tables(self.buffer).combine_chunks()
        cut = t.num_rows if final else t.num_rows - t.num_rows % ROW_GROUP_ROWS
        if cut:
            self.writer.write_table(t.slice(0, cut), row_group_size=ROW_GROUP_ROWS)
        rest = t.slice(cut)
        self.buffer, self.buffered = ([rest] if rest.num_rows else []), rest.num_rows

    def close(self) -> None:
        self._flush(final=True)
        self.writer.close()


def _part_cells(path: Path, info: dict, skip: set[str]) -> Iterator[tuple[str, pa.Table]]:
    """(cell_id, its rows) of a compacted logprobs file, in its (cell_id) order, less `skip`."""
    counts = iter(zip(info["cells"], info["rows"]))
    pending: list[pa.Table] = []
    have = 0
    cid, need = next(counts, (None, 0))
    for batch in pq.ParquetFile(path).iter_batches(batch_size=ROW_GROUP_ROWS):
        pending.append(pa.Table.from_batches([batch]))
        have += batch.num_rows
        while cid is not None and have >= need:
            t = pa.concat_tables(pending)
            rows, rest = t.slice(0, need), t.slice(need)
            if need and rows["cell_id"][0].as_py() != cid:
                raise RuntimeError(f"{path}: rows of {rows['cell_id'][0].as_py()} where {cid} was recorded "
                                   f"({COMMIT_FILE} does not match the file)")
            if cid not in skip:
                yield cid, rows
            pending, have = [rest], rest.num_rows
            cid, need = next(counts, (None, 0))
    if cid is not None:
        raise RuntimeError(f"{path}: fewer rows than {COMMIT_FILE} records")


def _percell_cells(paths: list[tuple[str, Path]]) -> Iterator[tuple[str, pa.Table]]:
    """(cell_id, its rows) of per-cell logprobs files, in the given order: one DuckDB scan over all
    of them (file order is kept), about half the per-file cost of opening each with pyarrow."""
    if not paths:
        return
    import duckdb

    con = duckdb.connect(config={"memory_limit": "1GB"})
    try:
        con.execute("SET enable_progress_bar = false")
        reader = con.sql("SELECT * FROM read_parquet($files, hive_partitioning = false)",
                         params={"files": [str(p) for _, p in paths]}) \
            .to_arrow_reader(ROW_GROUP_ROWS)
        expected = iter(cid for cid, _ in paths)
        cur, rows = None, []
        for batch in reader:
            ids = batch.column(batch.schema.get_field_index("cell_id"))
            cuts = np.flatnonzero(pc.not_equal(ids.slice(1), ids.slice(0, len(ids) - 1)).to_numpy(zero_copy_only=False)) + 1
            for a, b in zip([0, *cuts], [*cuts, len(ids)]):
                cid = ids[a].as_py()
                if cid != cur:
                    if cur is not None:
                        yield cur, pa.Table.from_batches(rows)
                    if cid != next(expected, None):
                        raise RuntimeError(f"per-cell logprobs out of order at {cid}")
                    cur, rows = cid, []
                rows.append(batch.slice(a, b - a))
        if cur is not None:
            yield cur, pa.Table.from_batches(rows)
    finally:
        con.close()


def _likely_references(cells: pa.Table, framework: str, baseline: dict) -> set[str]:
    """The cells an analysis most likely reads as references: the baseline config's (the matrix's
    selector) and, per engine, its batch-1 (else smallest) ok cell, the noise floor's reference.
    Their logprobs go first in the compacted file, so the analysis reads them from a few row groups
    instead of scanning the file. Only an order: any other baseline is just as right, and slower."""
    from adapters.base import normalize_quantization

    d = cells.select([c for c in ("cell_id", "engine_key", "model", "quantization", "flags", "status", "batch_size",
                                  "input_len", "output_len") if c in cells.column_names]).to_pandas()
    if d.empty:
        return set()
    want = {k: (normalize_quantization(str(v)) if k == "quantization" else str(v))
            for k, v in baseline.items() if k in ("framework", "model", "quantization", "flags")}
    hit = pd.Series(want.get("framework", framework) == framework, index=d.index)
    for k, v in want.items():
        if k != "framework":
            hit &= d[k].astype(str) == v
    ok = d[d.status == "ok"].assign(_not1=lambda x: x.batch_size != 1)
    small = ok.sort_values(["engine_key", "_not1", "batch_size", "input_len", "output_len", "cell_id"]) \
        .drop_duplicates("engine_key").cell_id
    return set(d.cell_id[hit]) | set(small)


def _read_cells_file(path: Path) -> pa.Table:
    return ds.dataset(str(path), format="parquet", schema=CELLS_FILE_SCHEMA).to_table()


def compact(store: RunStore) -> dict:
    """Fold the per-cell files into the compacted files (see the module docstring). Returns what it did."""
    with store.writing():
        return _compact(store)


def _compact(store: RunStore) -> dict:
    started = time.monotonic()
    recover(store)
    for tmp in store.root.rglob(".tmp-*"):   # partial writes of a killed driver (we hold the lock)
        tmp.unlink(missing_ok=True)
    lay = Layout.scan(store.root)
    record = lay.record
    # interrupted writes: a per-cell logprobs file without its cells row is never read
    orphans = [p for (fw, cid), p in lay.percell_lp.items() if lay.percell.get(cid) != fw]
    stats = {"generation": lay.generation, "cells_folded": len(lay.percell), "frameworks": [], "seconds": 0.0}
    if not lay.percell:
        for p in orphans:
            p.unlink(missing_ok=True)
        return stats

    gen = lay.generation + 1
    new_cells = dict(record.get("cells") or {})
    new_lp = dict(record.get("logprobs") or {})
    staged: dict[str, str] = {}
    delete: list[str] = [_rel(store, p) for p in orphans]
    baseline = (store.read_manifest().get("matrix") or {}).get("baseline") or {}
    by_fw: dict[str, list[str]] = {}
    for cid, fw in lay.percell.items():
        by_fw.setdefault(fw, []).append(cid)

    for fw, ids in sorted(by_fw.items()):
        ids.sort()
        newer = set(ids)
        stats["frameworks"].append(fw)
        cells_dir, lp_dir = store.root / "cells" / f"framework={fw}", store.root / "logprobs" / f"framework={fw}"
        final_cells = cells_dir / f"{COMPACTED_PREFIX}{gen}.parquet"
        stage_cells = cells_dir / f"{STAGING_PREFIX}{gen}.parquet"

        # cells: the compacted rows not stored again, and the per-cell rows, in cell_id order
        parts = []
        old = lay.cells_parts.get(fw)
        if old is not None:
            t = _read_cells_file(old)
            parts.append(t.filter(pc.invert(pc.is_in(t["cell_id"], value_set=pa.array(ids, pa.string())))))
            delete.append(record["cells"][fw])
        parts.append(read_cell_files([str(lay.percell_paths[c]) for c in ids], CELLS_FILE_SCHEMA.names))
        cells = pa.concat_tables(parts)
        cells = cells.take(pc.sort_indices(cells["cell_id"]))
        first = _likely_references(cells, fw, baseline)
        order = lambda cid: (cid not in first, cid)  # noqa: E731  (the logprobs' order in the file)
        pq.write_table(cells, stage_cells, compression="zstd")
        staged[_rel(store, final_cells)] = _rel(store, stage_cells)
        new_cells[fw] = _rel(store, final_cells)
        delete += [_rel(store, p) for p in (lay.percell_paths[c] for c in ids)]

        # logprobs: the framework's compacted files' rows (less the cells stored again) merged with
        # the per-cell files of the cells that have one, in cell_id order, into one new file
        lp_files = sorted(((c, lay.percell_lp[(fw, c)]) for c in ids if (fw, c) in lay.percell_lp),
                          key=lambda x: order(x[0]))
        old_parts = [(rel, info) for rel, info in sorted((record.get("logprobs") or {}).items())
                     if info.get("framework") == fw]
        if not lp_files and not any(c in newer for _, info in old_parts for c in info["cells"]):
            continue   # nothing new, nothing stale: the framework's logprobs file stays as it is
        sources = []
        for rel, info in old_parts:
            path = next(p for p, i in lay.lp_parts.items() if i is info)
            sources.append(_part_cells(path, info, newer))
            delete.append(rel)
            del new_lp[rel]
        sources.append(_percell_cells(lp_files))
        delete += [_rel(store, p) for _, p in lp_files]
        final_lp = lp_dir / f"{COMPACTED_PREFIX}{gen}.parquet"
        stage_lp = lp_dir / f"{STAGING_PREFIX}{gen}.parquet"
        writer = _Writer(stage_lp)
        try:
            for cid, rows in heapq.merge(*sources, key=lambda x: order(x[0])):
                writer.add(cid, rows)
        finally:
            writer.close()
        if writer.cells:
            new_lp[_rel(store, final_lp)] = {"framework": fw, "cells": writer.cells, "rows": writer.rows}
            staged[_rel(store, final_lp)] = _rel(store, stage_lp)
        else:
            stage_lp.unlink(missing_ok=True)

    commit = {"version": 1, "generation": gen, "cells": new_cells, "logprobs": new_lp,
              "staged": staged, "delete": sorted(set(delete) - set(staged))}
    _commit(store, commit)
    _finish(store, commit)
    stats.update(generation=gen, seconds=round(time.monotonic() - started, 3))
    return stats
