"""Compaction: a run's journal folded into one cells file and one file per side table per framework.

`bench run` stores every cell as one record of the run's journal (orchestrator/store/journal.py), so a
killed run resumes without duplicates; run dirs of earlier versions hold a Parquet file per cell and
table instead (still read and folded here). Readers want a few large, sorted, compressed files, so
a run is compacted when it ends (and with `bench compact RUN`):

    cells/framework=<fw>/compacted-<g>.parquet      every cell of <fw>, sorted by cell_id
    logprobs/framework=<fw>/compacted-<g>.parquet   their logprobs, grouped by cell: the cells an
                                                    analysis likely reads as references first (the
                                                    baseline config's, each engine's batch-1 cell),
                                                    then the rest, each part in cell_id order, in
                                                    row groups of 64k rows (a cell_id range prunes
                                                    them; the references are a few row groups)
    <side>/framework=<fw>/compacted-<g>.parquet     every other side table the same way as logprobs
    compacted.json                                  the commit record: generation <g>, the live
                                                    compacted files, and per side table file the
                                                    cells it holds and their row counts

Compaction <g> (under the run dir's writer lock; the driver is the only writer):
  1. finish or undo what an interrupted compaction left (recover); check every part of every journal
     record against its checksum (a journal that does not verify whole is not folded: DamagedJournal,
     and `bench compact --salvage` is the way on)
  2. per framework with cells in the journal (or per-cell files): write the new cells file and side
     table files under hidden staging names (.compacting-<g>...): the old compacted rows less the
     cells stored again since, merged with the journal's records (read one cell at a time) and the
     per-cell files in that order, streamed (memory is a bounded window and a row group; the
     framework's cells table is held whole, to sort it)
  3. fsync the new files and read them back: each holds every cell folded into it with the rows
     written for it, and every journal record's rows are in one (else Incomplete: nothing committed,
     nothing deleted, the journal stays)
  4. commit: write compacted.json (temp file + rename), naming the new files, the staging names
     they still have, and the files that are no longer live (the folded journal and per-cell
     files, the replaced compacted files)
  5. rename the staging files to their names, delete the files no longer live, rename a journal
     file with a torn tail (bytes not folded) to *.damaged, and rewrite compacted.json without those
     lists
compacted.json (sealed: orchestrator/store/integrity.py) records each live file's bytes, rows and
sha256s, which readers check; the files are written with Parquet page checksums.
The commit record is fsynced (file and folder) before anything is deleted, so a power loss after it
finds the new files (fsynced in 3) and the record naming them. A kill before 4 leaves the run as it was (the staging files are hidden and removed by the next
writer); a kill after 4 leaves a committed compaction whose journal files are still there: they
hold the same rows and win, so readers see each cell once; the next writer finishes step 5.
Compaction never writes into a journal file (it reads and deletes them), so a hard-linked copy of
a run dir compacts without touching the original. A cell stored again after a compaction is a
journal record again and wins until the next one.
Frameworks without per-cell files keep their compacted files as they are.

Speed: the journal's records decode without parsing a Parquet footer each (a one-row cells file
is ~80 column chunks, ~1 ms of CPU to open: 100,000 cells in per-cell files were ~2 minutes of
footers), and the cells rows mostly come 256 to a message (the journal's rows records). What is
left is decoding the side messages (one zstd call each), ordering them, and encoding the Parquet
output (~1.2 us a logprobs row, most of the CPU; a row group encoded by a thread while the next
records are read). Per-cell files of earlier versions are read with bulk_parquet (several DuckDB
scans at once).
"""

from __future__ import annotations

import heapq
import json
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from orchestrator.store.bulk_parquet import RowGroupWriter, scan_in_order
from orchestrator.store.integrity import file_facts, parquet_format, refuse_links, seal
from orchestrator.store.journal import JournalReader, fsync_dir
from orchestrator.store.layout import COMMIT_FILE, COMPACTED_PREFIX, STAGING_PREFIX, Layout, read_commit
from orchestrator.store.run_store import RunStore, atomic_write_text
from orchestrator.store.schema import CELLS_FILE_SCHEMA, SIDE_TABLES, SideTable

ROW_GROUP_ROWS = 65536      # side table rows per row group of a compacted file


class _Writer(RowGroupWriter):
    """A side table's compacted file: its rows appended cell by cell; the cells and their row
    counts go to the commit record."""

    def __init__(self, path: str, side: SideTable):
        super().__init__(path, side.schema, side.write_options, ROW_GROUP_ROWS)
        self.cells: list[str] = []
        self.rows: list[int] = []

    def add(self, cell_id: str, table: pa.Table) -> None:
        self.cells.append(cell_id)
        self.rows.append(table.num_rows)
        self.append(table)


def _commit(store: RunStore, record: dict) -> None:
    # durable when it names files to delete: a power loss must not leave the journal deleted and the
    # commit that names the compacted files unwritten
    atomic_write_text(store.root / COMMIT_FILE, seal(json.dumps(record, sort_keys=True)),
                      durable=bool(record.get("delete") or record.get("damaged")))


class Incomplete(RuntimeError):
    """The compacted files, read back, do not hold what was folded into them: nothing is committed,
    the journal and every file stay."""

    bench_exit_code = 4   # `bench`: damaged data


def _read_back(store: RunStore, lay: Layout, by_fw: dict[str, list[str]], new: dict, staged: dict) -> None:
    """Before the commit (after which the folded files are deleted): every staged file fsynced, then
    read back, holding every cell folded into it with the rows written for it, and every journal
    record's cells row and side rows. Incomplete otherwise."""
    root = store.root
    for stage in staged.values():
        with open(root / stage, "rb") as f:
            os.fsync(f.fileno())
    for folder in {(root / stage).parent for stage in staged.values()}:
        fsync_dir(folder)

    def fail(what: str):
        raise Incomplete(f"{root}: compaction not committed: {what}; the journal and every stored file stay "
                         f"as they were")

    def cell_ids(rel: str) -> pa.ChunkedArray:
        try:
            return pq.read_table(root / staged[rel], columns=["cell_id"])["cell_id"]
        except (OSError, pa.ArrowException) as e:
            fail(f"{staged[rel]} written but not readable ({e})")

    for fw, ids in by_fw.items():
        got = cell_ids(new["cells"][fw])
        missing = set(ids) - set(got.to_pylist())
        if missing or pc.count_distinct(got).as_py() != len(got):
            fail(f"{staged[new['cells'][fw]]} read back without {sorted(missing)[:5]} or with a cell twice")
    for name in SIDE_TABLES:
        held: dict[tuple[str, str], int] = {}
        for rel, info in new[name].items():
            if rel not in staged:
                continue
            runs = pc.run_end_encode(cell_ids(rel).combine_chunks())
            ends = runs.run_ends.to_numpy()
            got = list(zip(runs.values.to_pylist(), np.diff(ends, prepend=0).tolist()))
            want = [(c, n) for c, n in zip(info["cells"], info["rows"]) if n]
            if got != want:
                fail(f"{staged[rel]} read back does not hold the rows written to it")
            held.update(((info["framework"], c), n) for c, n in want)
        lost = [c for c, rec in lay.journal.items() if name in rec.parts and (rec.framework, c) not in held]
        if lost:
            fail(f"the {name} rows of {sorted(lost)[:5]} (journal records) are in no compacted file")


def _finish(store: RunStore, record: dict) -> None:
    """Step 5 of a committed compaction; idempotent, so recover() can run it again after a kill."""
    root = str(store.root)
    for final, staging in (record.get("staged") or {}).items():
        src = os.path.join(root, staging)
        if os.path.exists(src):
            os.replace(src, os.path.join(root, final))
    for rel in record.get("delete") or []:
        try:
            os.unlink(os.path.join(root, rel))
        except FileNotFoundError:
            pass
    _keep_damaged(root, record.get("damaged") or [])
    if record.get("staged") or record.get("delete") or record.get("damaged"):
        _commit(store, {k: v for k, v in record.items() if k not in ("staged", "delete", "damaged")})


def _keep_damaged(root: str, rels: list[str]) -> None:
    """Journal files holding bytes no record was folded from (a torn or damaged tail): kept as
    <name>.damaged, never read again, never deleted by bench."""
    for rel in rels:
        src = os.path.join(root, rel)
        if os.path.exists(src):
            os.replace(src, src + ".damaged")


def remove_partial_writes(store: RunStore) -> int:
    """What a driver killed mid-write left: temporary files, and the unfinished steps of a compaction
    (`recover`). Never read; removed on resume (by the writer only). Returns files removed."""
    if not store.root.exists():
        return 0
    refuse_links(store.root)
    removed = recover(store)
    stale = list(store.root.rglob(".tmp-*"))
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale) + removed


def recover(store: RunStore) -> int:
    """Finish a committed compaction that was killed, and remove what an uncommitted one wrote.
    Only a writer (it holds the run dir's lock, or is the driver) calls this. Returns files removed."""
    record = read_commit(store.root)
    if record.get("staged") or record.get("delete") or record.get("damaged"):
        _finish(store, record)
        record = read_commit(store.root)
    live = set((record.get("cells") or {}).values())
    for name in SIDE_TABLES:
        live |= set(record.get(name) or {})
    gen = int(record.get("generation", 0))
    removed = 0
    for table in ("cells", *SIDE_TABLES):
        base = store.root / table
        if not base.is_dir():
            continue
        for part in base.glob("framework=*"):
            for path in part.iterdir():
                name = path.name
                # staging files were never committed; a compacted file the record does not name is an
                # older generation it replaced (only with a record: without one nothing is guessed)
                stale = name.startswith(STAGING_PREFIX) or (
                    name.startswith(COMPACTED_PREFIX) and f"{table}/{part.name}/{name}" not in live
                    and _generation(name) < gen)
                if stale:
                    path.unlink(missing_ok=True)
                    removed += 1
    return removed


def _generation(name: str) -> int:
    try:
        return int(name[len(COMPACTED_PREFIX):].split(".")[0].split("-")[0])
    except ValueError:
        return 1 << 62   # not ours: never removed


# ------------------------------------------------------------------ reading

def _read_cell_rows(paths: list[str]) -> pa.Table:
    """The per-cell cells files as one table, in the given order."""
    parts = list(scan_in_order(paths, CELLS_FILE_SCHEMA))
    return pa.concat_tables(parts) if parts else CELLS_FILE_SCHEMA.empty_table()


def _read_cells_file(path) -> pa.Table:
    return ds.dataset(str(path), format=parquet_format(), schema=CELLS_FILE_SCHEMA).to_table()


def _part_cells(path, info: dict, skip: set[str]) -> Iterator[tuple[str, pa.Table]]:
    """(cell_id, its rows) of a compacted side table file, in its (cell_id) order, less `skip`."""
    counts = iter(zip(info["cells"], info["rows"]))
    pending: list[pa.Table] = []
    have = 0
    cid, need = next(counts, (None, 0))
    for batch in pq.ParquetFile(path, page_checksum_verification=True).iter_batches(batch_size=ROW_GROUP_ROWS):
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


def _percell_cells(files: list[tuple[str, str]], schema: pa.Schema) -> Iterator[tuple[str, pa.Table]]:
    """(cell_id, its rows) of per-cell side table files [(cell_id, path)], in the given order."""
    expected = iter(cid for cid, _ in files)
    for t in scan_in_order([p for _, p in files], schema):
        runs = pc.run_end_encode(t["cell_id"].combine_chunks())   # a file's rows are one run of its cell_id
        start = 0
        for cid, end in zip(runs.values.to_pylist(), runs.run_ends.to_pylist()):
            want = next(expected, None)
            while want is not None and want != cid:   # a file without rows has no run
                want = next(expected, None)
            if want is None:
                raise RuntimeError(f"per-cell rows of {cid} out of order (a file holding another cell's rows?)")
            yield cid, t.slice(start, end - start)
            start = end


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


# ------------------------------------------------------------------ compaction

def compact(store: RunStore) -> dict:
    """Fold the per-cell files into the compacted files (see the module docstring). Returns what it did."""
    with store.writing():
        return _compact(store)


def _compact(store: RunStore) -> dict:
    started = time.monotonic()
    refuse_links(store.root)
    store.close_journal()   # this process's journal file ends with its end record
    recover(store)
    for tmp in store.root.rglob(".tmp-*"):   # partial writes of a killed driver (we hold the lock)
        tmp.unlink(missing_ok=True)
    lay = Layout.scan(store.root)   # a journal record that does not verify, with records after it: DamagedJournal
    lay.checked_all()               # every live compacted file as compacted.json recorded it
    for path, records in lay.journal_records.items():   # every part of every record, before any is folded
        with JournalReader(path, lay.journal_schemas[path]) as reader:
            reader.verify(records)
    record = lay.record
    # every per-cell file (earlier versions) and every journal file is folded here or stale: none is
    # read after the commit (a per-cell side file without its cells row is an interrupted write)
    old_files = [f"cells/framework={fw}/{cid}.parquet" for fw, cid in lay.percell_files]
    old_files += [f"{name}/framework={fw}/{cid}.parquet" for name, files in lay.percell_side.items() for fw, cid in files]
    old_files += [str(p.relative_to(store.root)) for p in lay.journal_files if p not in lay.tails]
    damaged = [str(p.relative_to(store.root)) for p in lay.tails]   # bytes not folded: kept as *.damaged
    live = {**lay.percell, **{cid: rec.framework for cid, rec in lay.journal.items()}}   # cell_id -> framework
    stats = {"generation": lay.generation, "cells_folded": len(live), "frameworks": [], "seconds": 0.0,
             "kept_damaged": [f"{p.relative_to(store.root)}.damaged: from byte {at} no record verifies"
                              + (f" (cell {cid} not stored)" if cid else "") for p, (at, cid) in lay.tails.items()]}
    if not live:
        for rel in old_files:   # orphans and empty journals only
            (store.root / rel).unlink(missing_ok=True)
        _keep_damaged(str(store.root), damaged)
        return stats

    gen = lay.generation + 1
    new = {"cells": dict(record.get("cells") or {}), **{name: dict(record.get(name) or {}) for name in SIDE_TABLES}}
    staged: dict[str, str] = {}
    delete: list[str] = old_files
    baseline = store.read_manifest().baseline
    by_fw: dict[str, list[str]] = {}
    for cid, fw in live.items():
        by_fw.setdefault(fw, []).append(cid)

    with ThreadPoolExecutor(1, thread_name_prefix="compact-cells") as cells_writes:
        written: Future | None = None
        for fw, ids in sorted(by_fw.items()):
            ids.sort()
            stats["frameworks"].append(fw)
            part = f"framework={fw}"
            final_cells, stage_cells = (f"cells/{part}/{COMPACTED_PREFIX}{gen}.parquet",
                                        f"cells/{part}/{STAGING_PREFIX}{gen}.parquet")

            # cells: the compacted rows not stored again, then the per-cell and journal rows, in cell_id order
            parts = []
            old = lay.cells_parts.get(fw)
            if old is not None:
                t = _read_cells_file(old)
                parts.append(t.filter(pc.invert(pc.is_in(t["cell_id"], value_set=pa.array(ids, pa.string())))))
                delete.append(record["cells"][fw])
            percell = [c for c in ids if c in lay.percell]
            if percell:
                parts.append(_read_cell_rows([str(lay.percell_paths[c]) for c in percell]))   # read in cell_id order
            journal = [c for c in ids if c in lay.journal]
            if journal:
                parts.append(lay.journal_cells(CELLS_FILE_SCHEMA.names, journal).drop_columns(["framework"]))
            cells = pa.concat_tables(parts)
            if len(parts) > 1:   # (a sorted copy of the table: only when two parts were merged)
                cells = cells.take(pc.sort_indices(cells["cell_id"]))
            first = _likely_references(cells, fw, baseline)
            # written while the side tables are read (the cells table is not touched again); one
            # framework's at a time, so at most two cells tables are held
            if written is not None:
                written.result()
            (store.root / "cells" / part).mkdir(parents=True, exist_ok=True)
            written = cells_writes.submit(pq.write_table, cells, str(store.root / stage_cells), compression="zstd",
                                          write_page_checksum=True)
            staged[final_cells] = stage_cells
            new["cells"][fw] = final_cells
            for name, side in SIDE_TABLES.items():
                _compact_side(store, lay, name, side, fw, ids, (lambda cid: (cid not in first, cid)), gen, new[name],
                              staged, delete)
        if written is not None:
            written.result()

    _read_back(store, lay, by_fw, new, staged)
    # what a reader checks each live file against (integrity.py): the new files' facts, the others' as recorded
    live_files = set(new["cells"].values()) | {rel for name in SIDE_TABLES for rel in new[name]}
    files = {rel: f for rel, f in (record.get("files") or {}).items() if rel in live_files and rel not in staged}
    files.update((final, file_facts(store.root / stage)) for final, stage in staged.items())
    commit = {"version": 2, "generation": gen, **new, "files": files, "staged": staged,
              "delete": sorted(set(delete) - set(staged)), "damaged": damaged}
    _commit(store, commit)
    _finish(store, commit)
    stats.update(generation=gen, seconds=round(time.monotonic() - started, 3))
    return stats


def _compact_side(store: RunStore, lay: Layout, name: str, side: SideTable, fw: str, ids: list[str], order, gen: int,
                  live: dict, staged: dict, delete: list) -> None:
    """Side table `name` of framework `fw`: its compacted files' rows (less the cells stored again,
    `ids`) merged with the per-cell files and journal records of the cells that have rows, in
    `order`, into one new file."""
    newer = set(ids)
    percell = lay.percell_side[name]
    part = f"framework={fw}"
    files = sorted(((c, str(percell[(fw, c)])) for c in ids if c in lay.percell and (fw, c) in percell),
                   key=lambda x: order(x[0]))
    records = sorted((lay.journal[c] for c in ids if c in lay.journal and name in lay.journal[c].parts),
                     key=lambda r: order(r.cell_id))
    old_parts = [(rel, info) for rel, info in sorted((lay.record.get(name) or {}).items()) if info.get("framework") == fw]
    if not files and not records and not any(c in newer for _, info in old_parts for c in info["cells"]):
        return   # nothing new, nothing stale: the framework's file stays as it is
    sources = []
    for rel, info in old_parts:
        path = next(p for p, i in lay.side_parts[name].items() if i is info)
        sources.append(_part_cells(path, info, newer))
        delete.append(rel)
        del live[rel]
    sources.append(_percell_cells(files, side.schema))
    sources.append(lay.journal_batches(name, records))
    final, stage = f"{name}/{part}/{COMPACTED_PREFIX}{gen}.parquet", f"{name}/{part}/{STAGING_PREFIX}{gen}.parquet"
    (store.root / name / part).mkdir(parents=True, exist_ok=True)
    writer = _Writer(str(store.root / stage), side)
    done = False
    try:
        for cid, rows in heapq.merge(*sources, key=lambda x: order(x[0])):
            writer.add(cid, rows)
        done = True
    finally:
        writer.close(flush=done)   # after an error the staging file is left for recover() to remove
    if writer.cells:
        live[final] = {"framework": fw, "cells": writer.cells, "rows": writer.rows}
        staged[final] = stage
    else:
        (store.root / stage).unlink(missing_ok=True)
