"""Many small Parquet files in, large row groups out: what compaction spends its time on.

Reading: a small file costs its footer and one reader per column whatever it holds (~1 ms of CPU
for an ~80-column one-row cells file, ~0.5 ms for a cell's logprobs), so the files are read in
chunks, one single-threaded DuckDB scan per chunk (the cheapest per file measured here: ~25% less
CPU than pyarrow's reader, and less than DuckDB's own threads over many small files), several
scans at once in threads (DuckDB runs without the GIL), a bounded window ahead of the consumer.
Writing: each row group is encoded by a thread (pyarrow releases the GIL) while the next files
are read.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

SCAN_FILES = 512                             # small files per DuckDB scan
READ_THREADS = max(2, os.cpu_count() or 1)   # scans at once
READ_AHEAD = 2 * READ_THREADS                # scans ahead of the consumer: every thread busy, memory bounded


def _scan(paths: list[str], schema: pa.Schema) -> pa.Table:
    """`schema`'s columns of many small Parquet files, in file order, in one single-threaded DuckDB
    scan. A column a file lacks (written before the schema grew) reads as null."""
    import duckdb

    names = ", ".join(f'"{c}"' for c in schema.names)
    con = duckdb.connect(config={"threads": 1, "memory_limit": "1GB", "enable_external_file_cache": False})
    try:
        con.execute("SET enable_progress_bar = false")
        try:   # the columns by name: a file that lacks one is an error here, not a silently short table
            t = con.sql(f"SELECT {names} FROM read_parquet($files, hive_partitioning = false)",
                        params={"files": paths}).to_arrow_table()
        except duckdb.Error:
            t = con.sql("SELECT * FROM read_parquet($files, union_by_name = true, hive_partitioning = false)",
                        params={"files": paths}).to_arrow_table()
    finally:
        con.close()
    # whole buffers: DuckDB's result holds a 2048-row vector per file (~100 KB for a one-row file)
    return conform(t.combine_chunks(), schema)


def scan_in_order(paths: list[str], schema: pa.Schema) -> Iterator[pa.Table]:
    """The files in SCAN_FILES chunks, each one table, in order: READ_THREADS scans at once (DuckDB
    runs without the GIL), at most READ_AHEAD chunks ahead of the consumer (bounded memory)."""
    chunks = (paths[i:i + SCAN_FILES] for i in range(0, len(paths), SCAN_FILES))
    with ThreadPoolExecutor(READ_THREADS, thread_name_prefix="bulk-read") as pool:
        window: deque[Future] = deque(pool.submit(_scan, c, schema) for c in islice(chunks, READ_AHEAD))
        try:
            while window:
                table = window.popleft().result()
                nxt = next(chunks, None)
                if nxt is not None:
                    window.append(pool.submit(_scan, nxt, schema))
                yield table
        finally:   # an error or a kill downstream: scan no further
            for f in window:
                f.cancel()


def conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """`t` with exactly `schema`'s columns and types; a column it lacks is null."""
    if t.schema.equals(schema):
        return t
    cols = [t[f.name].cast(f.type) if f.name in t.column_names else pa.nulls(t.num_rows, f.type) for f in schema]
    return pa.Table.from_arrays(cols, schema=schema)


class RowGroupWriter:
    """Tables appended in order to one Parquet file, in row groups of `row_group_rows`; each row
    group is encoded by a thread while the caller goes on."""

    def __init__(self, path: str, schema: pa.Schema, options: dict, row_group_rows: int):
        self.schema, self.row_group_rows = schema, row_group_rows
        self.writer = pq.ParquetWriter(path, schema, **options)
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="bulk-write")
        self.pending: Future | None = None
        self.buffer: list[pa.Table] = []
        self.buffered = 0

    def append(self, table: pa.Table) -> None:
        if not table.schema.equals(self.schema):
            table = conform(table, self.schema)
        self.buffer.append(table)
        self.buffered += table.num_rows
        if self.buffered >= self.row_group_rows:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        if not self.buffered:
            return
        # not combined into one chunk: the Parquet writer takes the cells' chunks as they are, for the
        # same CPU, and a copy of every row group cost as much again
        t = pa.concat_tables(self.buffer)
        cut = t.num_rows if final else t.num_rows - t.num_rows % self.row_group_rows
        if cut:
            self._wait()   # one row group encoding at a time: the file's row groups stay in order
            self.pending = self.pool.submit(self.writer.write_table, t.slice(0, cut), row_group_size=self.row_group_rows)
        rest = t.slice(cut)
        self.buffer, self.buffered = ([rest] if rest.num_rows else []), rest.num_rows

    def _wait(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            pending.result()

    def close(self, flush: bool = True) -> None:
        """Write what is buffered (unless `flush` is false: after an error) and close the file."""
        try:
            if flush:
                self._flush(final=True)
            self._wait()
        finally:
            self.pool.shutdown()
            self.writer.close()
