"""Which files hold a run's rows, and the rule that picks each cell's newest copy (`Layout`): journal
records over per-cell files over compacted files.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from orchestrator.store.bulk_parquet import conform
from orchestrator.store.integrity import (
    DamagedFile,
    LinkRefused,
    check_file,
    open_nofollow,
    parquet_format,
    read_sealed,
    refuse_links,
)
from orchestrator.store.journal import JournalReader, Record, journal_files, scan
from orchestrator.store.schema import CELLS_FILE_SCHEMA, CELLS_SCHEMA, SIDE_TABLES

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
    """compacted.json (sealed: DamagedFile when it does not verify); {} when there is none."""
    return read_sealed(Path(root) / COMMIT_FILE) or {}


def _per_cell(table_dir: Path, compacted: list | None = None) -> dict[tuple[str, str], Path]:
    """(framework, cell_id) -> path of every per-cell file under cells/ or logprobs/ (one listing, no
    opens); the compacted files seen go to `compacted`."""
    out: dict[tuple[str, str], Path] = {}
    if not table_dir.is_dir():
        return out
    for part in os.scandir(table_dir):
        if part.is_symlink():
            raise LinkRefused(Path(part.path))
        if not (part.is_dir() and part.name.startswith("framework=")):
            continue
        fw = part.name.split("=", 1)[1]
        for entry in os.scandir(part.path):
            if entry.is_symlink():
                raise LinkRefused(Path(entry.path))
            if is_cell_file(entry.name):
                out[(fw, entry.name[: -len(".parquet")])] = Path(entry.path)
            elif compacted is not None and entry.name.startswith(COMPACTED_PREFIX):
                compacted.append(Path(entry.path))
    return out


class Layout:
    """The files that hold a run's rows, and the rule that picks each cell's newest copy.

    A cell is stored as a record in a journal file (journal/, orchestrator/store/journal.py), as its own
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
        self.journal_records: dict[Path, list[Record]] = {path: recs for path, _, recs in journals or []}
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
        # what compacted.json recorded of each live compacted file (bytes, rows, sha256s): checked when first read
        self.facts: dict[Path, dict] = {resolve(rel): f for rel, f in (record.get("files") or {}).items()}
        self.held: dict[Path, list[str]] = {p: info["cells"] for parts in self.side_parts.values()
                                            for p, info in parts.items()}
        self._checked: set[Path] = set()
        self.fds: dict[Path, int] = {}   # snapshot(): path -> the file opened
        self.tails: dict[Path, tuple[int, str | None]] = {}

    def snapshot(self) -> "Layout":
        """Every file this Layout reads opened now (FileNotFoundError when one is gone already): read
        through these, a compaction that deletes them after this does not change what is read."""
        for path in [*self.cells_parts.values(), *(p for parts in self.side_parts.values() for p in parts),
                     *self.journal_files]:
            if path not in self.fds:
                self.fds[path] = open_nofollow(path)
        return self

    def opened(self, path: Path) -> str:
        """Where to read `path` from: the file opened by snapshot() (even when deleted since), else the path."""
        fd = self.fds.get(path)
        return f"/proc/self/fd/{fd}" if fd is not None and os.path.exists(f"/proc/self/fd/{fd}") else str(path)

    def close(self) -> None:
        for fd in getattr(self, "fds", {}).values():
            os.close(fd)
        self.fds = {}

    def __del__(self):
        self.close()

    def checked(self, path: Path, framework: str | None = None) -> Path:
        """`path` (a compacted file) once it verifies against compacted.json (DamagedFile otherwise)."""
        if path not in self._checked:
            cells = self.held.get(path) or ([f"every cell of framework {framework}"] if framework else None)
            check_file(path, self.facts.get(path), cells, fd=self.fds.get(path))
            self._checked.add(path)
        return path

    def checked_all(self) -> None:
        for fw, path in self.cells_parts.items():
            self.checked(path, fw)
        for parts in self.side_parts.values():
            for path in parts:
                self.checked(path)

    def read_compacted(self, path: Path, read, framework: str | None = None):
        """read(path) of a compacted file, checked first; its pages' checksum errors are DamagedFile."""
        self.checked(path, framework)
        try:
            return read(self.opened(path))
        except (OSError, pa.ArrowException) as e:
            if isinstance(e, FileNotFoundError):
                raise
            held = self.held.get(path) or ([f"every cell of framework {framework}"] if framework else None)
            raise DamagedFile(path, f"it does not read back ({str(e)[:200]})", held) from e

    @classmethod
    def scan(cls, root: Path) -> "Layout":
        root = Path(root)
        refuse_links(root)
        # the journal before the commit record: a compaction deletes the journal files it folded only
        # after its commit, so a journal file gone here means the record read next is that commit
        tails: dict = {}
        journals = [(path, *scan(path, tails)) for path in journal_files(root)]
        compacted: list[Path] = []
        record = read_commit(root)
        percell = _per_cell(root / "cells", compacted)
        percell_side = {name: _per_cell(root / name, compacted) for name in SIDE_TABLES}
        if compacted and not record:  # never guess, and never write over them
            raise DamagedFile(root / COMMIT_FILE, f"missing, and the run dir has compacted files "
                              f"({compacted[0].relative_to(root)}, ...): it says which rows they hold; restore it "
                              f"(copied or removed without them?)")
        lay = cls(root, record, percell, percell_side, journals)
        lay.tails = tails   # journal file -> (byte, cell) of a torn last record: a cell not stored
        return lay

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
            with JournalReader(self.opened(path), self.journal_schemas[path], path) as r:
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
            t = self.read_compacted(path, lambda p: ds.dataset(p, format=parquet_format(), schema=CELLS_FILE_SCHEMA)
                                    .to_table(columns=read), fw)
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
        for path, info in self.side_parts[name].items():   # read by path (DuckDB): checked here, before
            out.update(dict.fromkeys(info["cells"], self.checked(path)))
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
                    r = readers[rec.path] = JournalReader(self.opened(rec.path), self.journal_schemas[rec.path],
                                                          rec.path)
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
            batches = self.read_compacted(
                path, lambda p, where=where: ds.dataset(p, format=parquet_format(), schema=schema).to_batches(
                    columns=columns, filter=where, batch_size=batch_size))
            while True:   # a page that does not verify is found as the batches are read
                try:
                    b = next(batches, None)
                except (OSError, pa.ArrowException) as e:
                    raise DamagedFile(path, f"it does not read back ({str(e)[:200]})", self.held.get(path)) from e
                if b is None:
                    break
                yield b
        live = [str(p) for (fw, cid), p in sorted(self.percell_side[name].items()) if self.percell.get(cid) == fw]
        if live:
            yield from ds.dataset(live, format=parquet_format(), schema=schema).to_batches(
                columns=columns, batch_size=batch_size)
        for _, t in self.journal_batches(name, self.journal.values(), columns):
            yield from t.to_batches()
