"""The run directory: fixed-schema tables (cells, and the side tables: logprobs, tasks, samples)
plus a manifest; every write crash-safe.

results/<run>/
  manifest.json                                   the matrix as given, the cells, host, versions
  journal/<created ns>-<pid>.journal3             while a run goes: each stored cell appended as one
                                                  record, its side rows and its cells row together
                                                  (orchestrator/store/journal.py), one file per writing process
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
(orchestrator/store/compaction.py), and the journal files are deleted.
Readers go through RunStore (read_cells_table, stored_status, logprob_files, logprob_batches) and
Layout (orchestrator/store/layout.py), which apply that rule; only compacted files named in
compacted.json are live.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.store.integrity import LinkRefused, open_nofollow, plain_mode, read_sealed, refuse_links, seal
from orchestrator.store.journal import JOURNAL_DIR, JournalWriter, atomic_file
from orchestrator.store.layout import Layout
from orchestrator.store.manifest import Manifest
from orchestrator.store.schema import (
    CELL_FILE_OPTIONS,
    CELLS_FILE_SCHEMA,
    CELLS_SCHEMA,
    JSON_COLUMNS,
    LOGPROBS_SCHEMA,
    SIDE_TABLES,
    encode_json,
)


def atomic_write_table(table: pa.Table, path: Path, options: dict | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".parquet", dir=path.parent)
    os.fchmod(fd, plain_mode())
    os.close(fd)
    try:
        pq.write_table(table, tmp, **(options or {"compression": "zstd"}))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    return table.combine_chunks().to_batches()[0]


def atomic_write_text(path: Path, text: str, durable: bool = False) -> None:
    """`text` in `path` whole or not at all (a temporary file renamed); `durable`: fsynced, file and
    folder, before this returns (what a power loss must not undo)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(path, "w", durable) as f:
        f.write(text)


def cells_file_row(values: dict[str, Any]) -> pa.Table:
    """One cells-file row (no framework column) from a row's Python values: the JSON columns encoded,
    missing columns null, unknown keys an error."""
    unknown = set(values) - set(CELLS_SCHEMA.names)
    if unknown:
        raise KeyError(f"not in the cells schema: {sorted(unknown)}")
    row = {name: values.get(name) for name in CELLS_FILE_SCHEMA.names}
    for name in JSON_COLUMNS:
        row[name] = encode_json(row[name])
    return pa.Table.from_pylist([row], schema=CELLS_FILE_SCHEMA)


def is_run_dir(path: Path) -> bool:
    """A run directory: a manifest, stored cells, or a journal."""
    path = Path(path)
    return (path / "manifest.json").is_file() or (path / "cells").is_dir() or (path / JOURNAL_DIR).is_dir()


_JOURNALS: dict[tuple[str, int], JournalWriter] = {}   # (resolved run dir, pid) -> this process's journal


class RunLocked(RuntimeError):
    """Another process holds the run dir's writer lock (bench run or bench compact)."""

    def __init__(self, root: Path, pid: int | None):
        who = f"process {pid}" if pid else "another bench process"
        super().__init__(f"{who} is writing {root} (bench run or bench compact): wait for it to end, "
                         "or give another run dir")


def _lock_holder(root: Path) -> int | None:
    """The pid the lock's holder wrote into .lock, where it did."""
    try:
        with os.fdopen(open_nofollow(root / ".lock", os.O_RDONLY), "r") as f:
            text = f.read(32).strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


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
        batches.append(("cells", _one_batch(cells_file_row(row))))
        key = (str(self.root.resolve()), os.getpid())   # a forked child writes its own file
        writer = _JOURNALS.get(key)
        if writer is None:
            refuse_links(self.root)
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
                atomic_write_table(table.cast(side.schema), path, side.write_options)
            else:
                path.unlink(missing_ok=True)
        atomic_write_table(cells_file_row(row), self.cell_path(fw, cid), CELL_FILE_OPTIONS)

    def close_journal(self) -> None:
        """This process's journal file of the run dir ends with its end record (journal.py): a record
        that does not verify in it is damage from then on, not a torn write."""
        writer = _JOURNALS.pop((str(self.root.resolve()), os.getpid()), None)
        if writer is not None:
            writer.close()

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
            refuse_links(self.root)
            # never truncated, never through a link: the lock is the flock, not the file's content
            f = os.fdopen(open_nofollow(self.root / ".lock", os.O_WRONLY | os.O_CREAT), "w")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.close()
                raise RunLocked(self.root, _lock_holder(self.root)) from None
            except OSError:  # a file system without locks: one writer by convention, as before
                pass
            else:   # the holder's pid, for the one refused (our own file, held: nothing else is truncated)
                os.ftruncate(f.fileno(), 0)
                os.pwrite(f.fileno(), f"{os.getpid()}\n".encode(), 0)
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

    def snapshot(self, read):
        """read(a Layout of the run dir whose files are all open), again on a new Layout when a file it
        names was gone: a compaction swapped its files in between (its commit is one rename; the files
        it replaced are deleted one by one after it), so a reader sees the old files or the new ones,
        never a mix."""
        return once_more(lambda: read(self.layout().snapshot()))

    def _batches(self, batches_of):
        """snapshot() for a stream of batches: retried when a file was gone before the first one."""
        it = self.snapshot(lambda lay: _started(batches_of(lay)))
        yield from it

    def read_cells_table(self, columns: list[str] | None = None) -> pa.Table:
        """The cells table as Arrow (CELLS_SCHEMA order, or `columns`): one row per cell, its newest copy."""
        return self.snapshot(lambda lay: lay.read_cells(columns))

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
        return self.snapshot(lambda lay: lay.logprob_files())

    def logprob_batches(self, columns: list[str] | None = None, batch_size: int = 65536):
        """The logprobs table as Arrow record batches: every stored cell's rows once (its newest copy)."""
        return self._batches(lambda lay: lay.logprob_batches(columns, batch_size))

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
        return self.snapshot(lambda lay: pa.Table.from_batches(list(lay.side_batches(name, columns)), schema=schema))

    def write_manifest(self, manifest: Manifest | dict) -> None:
        """Write the manifest (a dict is read as a Manifest first, as a stored one would be)."""
        if not isinstance(manifest, Manifest):
            manifest = Manifest.model_validate(manifest)
        if os.path.islink(self.root / "manifest.json"):
            raise LinkRefused(self.root / "manifest.json")
        atomic_write_text(self.root / "manifest.json",
                          seal(json.dumps(manifest.to_json(), indent=2, sort_keys=True, default=str)))

    def read_manifest(self) -> Manifest:
        """The manifest (orchestrator/store/manifest.py); an empty one where the run dir has none."""
        return Manifest.model_validate(read_sealed(self.root / "manifest.json") or {})


def once_more(read, tries: int = 5):
    """read(), again when a file of a run dir it read was gone (a compaction committed between its reads
    and deleted what it folded; at most `tries` times: compactions back to back): for readers that open
    files by path more than once (the judge's DuckDB scans), as RunStore.snapshot is for one Layout."""
    for left in range(tries - 1, -1, -1):
        try:
            return read()
        except Exception as e:   # only a file gone is retried, the rest raised as it was
            gone = isinstance(e, FileNotFoundError) or (type(e).__name__ == "IOException" and any(
                s in str(e) for s in ("No files found", "No such file")))
            if not gone or not left:
                raise


def _started(batches):
    """The batches, the first one read already (a file gone is found before anything was handed on)."""
    import itertools

    first = next(batches, None)
    return iter(()) if first is None else itertools.chain([first], batches)


_WRITER_LOCKS: dict[str, list] = {}   # resolved run dir -> [open lock file, depth]
