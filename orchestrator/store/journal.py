"""The run's journal: every stored cell appended as one record to an append-only file.

    journal/<creation time ns>-<pid>.journal2     one file per writing process, never written by another

A file is the magic line, a schemas record (the Arrow schema of each table, as this process writes
them), then one record per stored cell. A record is

    "LBJR" | header length u32 | payload length u64 | crc32 of the header u32
    header: JSON {"cell_id", "framework", "parts": [[table, offset, length, crc32, raw length], ...]}
    payload: one Arrow IPC record-batch message per table the cell has rows in, its cells row last;
             a side table's message zstd-compressed whole (raw length: its size before), the cells
             row's plain (raw length 0)

and goes to the file in one write(), so the cell row and its side rows are stored together or not
at all: a killed writer leaves at most a torn last record, which readers skip (it is shorter than
its header says, or its checksum does not match). A file is never opened for writing again once its
process is gone, so a torn tail is never followed by a good record, and hard-linked copies of a run
dir stay independent. A cell stored twice has two records; the later one wins (file order, then
record order). Compaction folds the journal files into the compacted Parquet files and deletes them.

After every CELLS_BATCH cell records the writer appends a rows record: header {"rows_of": [offset,
...], "parts": [["cells", ...]]}, the cells rows of those records again (each named by its cells
part's offset in the file) as one zstd-compressed multi-row message. Readers take a cell's row from
there when they have it (one message per CELLS_BATCH rows instead of one each: a cells row is ~100
one-value columns, ~1 us of CPU each to decode and concatenate), else from its own record; either
is the same row. A torn rows record is a tail like any other, skipped.

Why not a Parquet file per cell: a one-row Parquet file is ~80 column chunks of footer, ~1 ms of
CPU to open; 100,000 cells were minutes of footers. An IPC message decodes without parsing a
footer, and the files are few.

Version 1 (`*.journal`, written before version 2, still read): side messages lz4-compressed by
Arrow buffer by buffer (~20 LZ4 frames a logprobs message: ~300 us of CPU to decode one cell's,
6x the one zstd call of version 2), parts without a raw length. Version 2 files have their own
suffix so that a version 1 reader neither reads nor deletes them (it lists only `*.journal`).
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

JOURNAL_DIR = "journal"
SUFFIX = ".journal2"                                  # what this writer writes: version 2
SUFFIXES = (".journal", SUFFIX)                        # what readers read: versions 1 and 2
MAGIC = b"lossless-bench journal 2\n"
MAGICS = (b"lossless-bench journal 1\n", MAGIC)       # the same length
_ZSTD = pa.Codec("zstd", 1)
_REC = struct.Struct("<4sIQI")
_REC_MAGIC = b"LBJR"


@dataclass(frozen=True)
class Record:
    """A stored cell's record: where its parts lie in the journal file (absolute offsets)."""

    path: Path
    seq: int                                  # position in the file's record order
    cell_id: str
    framework: str
    parts: dict[str, tuple[int, int, int]]    # table -> offset, length and crc32 of its IPC message in the file
    raw: dict[str, int]                       # table -> size before compression, of the parts compressed whole
    row_at: tuple | None = None               # (rows record's part: offset, length, crc32, raw length; row)


def _encode(header: dict, messages: list[tuple[str, pa.Buffer, int]]) -> tuple[bytes, int]:
    """The record, and where its last part starts in it."""
    parts, off = [], 0
    for name, buf, raw in messages:
        parts.append([name, off, buf.size, zlib.crc32(buf), raw])
        off += buf.size
    head = json.dumps({**header, "parts": parts}, separators=(",", ":")).encode()
    payload = b"".join(bytes(buf) for _, buf, _ in messages)
    return (_REC.pack(_REC_MAGIC, len(head), len(payload), zlib.crc32(head)) + head + payload,
            _REC.size + len(head) + parts[-1][1])


CELLS_BATCH = 256   # cell records per rows record


class JournalWriter:
    """This process's journal file of one run dir, created at the first append. When the file is not
    as this writer left it (a compaction folded and deleted it, or a write failed half-way) the next
    append starts a new file: a record is never written after a torn one."""

    def __init__(self, root: Path, schemas: dict[str, pa.Schema]):
        self.root, self.schemas = Path(root), schemas
        self.path: Path | None = None
        self.ino = self.size = -1
        self.rows: list[tuple[int, pa.RecordBatch]] = []   # cells rows not yet in a rows record: (offset, row)

    def _start(self) -> int:
        d = self.root / JOURNAL_DIR
        d.mkdir(parents=True, exist_ok=True)
        while True:   # a later file name for a later file: readers order the files by name
            path = d / f"{time.time_ns():020d}-{os.getpid()}{SUFFIX}"
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
                break
            except FileExistsError:
                continue
        self.path, self.ino, self.size, self.rows = path, os.fstat(fd).st_ino, 0, []
        try:
            self._write(fd, MAGIC + _encode({"schemas": True}, [(n, s.serialize(), 0) for n, s in self.schemas.items()])[0])
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _write(self, fd: int, data: bytes) -> None:
        try:
            _write_all(fd, data)
        except BaseException:
            self.path = None   # maybe torn: the next record goes to a new file
            raise
        self.size += len(data)

    def append(self, cell_id: str, framework: str, batches: list[tuple[str, pa.RecordBatch]]) -> None:
        """One cell's rows, its side tables first and its cells row last, in one write()."""
        record, cells_at = _encode({"cell_id": cell_id, "framework": framework},
                                   [(name, *_message(batch, compress=name != "cells")) for name, batch in batches])
        fd = None
        if self.path is not None:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
                st = os.fstat(fd)
                if (st.st_ino, st.st_size) != (self.ino, self.size):   # replaced or changed: not ours any more
                    os.close(fd)
                    fd = None
            except FileNotFoundError:
                fd = None
        if fd is None:
            fd = self._start()
        try:
            start = self.size
            self._write(fd, record)
            if batches[-1][0] == "cells":
                self.rows.append((start + cells_at, batches[-1][1]))
            if len(self.rows) >= CELLS_BATCH:
                self._write_rows(fd)
        finally:
            os.close(fd)

    def _write_rows(self, fd: int) -> None:
        """A rows record of the cells rows written since the last one. Only a shortcut for readers:
        when it cannot be written the cells are stored all the same (and the next record goes to a
        new file, after a possibly torn one)."""
        offsets, rows = [off for off, _ in self.rows], [row for _, row in self.rows]
        self.rows = []
        try:
            self._write(fd, _encode({"rows_of": offsets}, [("cells", *_message(pa.concat_batches(rows), True))])[0])
        except Exception:
            pass


def _message(batch: pa.RecordBatch, compress: bool) -> tuple[pa.Buffer, int]:
    """The batch as one IPC message, and its size when it is compressed (else 0). Side tables are
    compressed (raw logprobs are ~3x their zstd size, and a journal that falls out of the page cache
    makes compaction wait on the disk), whole, in one zstd call: decoding Arrow's own per-buffer
    compression cost ~6x the CPU. A cells row is left plain (small, and many are decoded at once
    as one IPC stream: JournalReader.cells)."""
    msg = batch.serialize()
    if not compress:
        return msg, 0
    return _ZSTD.compress(msg), msg.size


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def journal_files(root: Path) -> list[Path]:
    """The run dir's journal files, oldest first."""
    d = Path(root) / JOURNAL_DIR
    if not d.is_dir():
        return []
    return sorted((Path(e.path) for e in os.scandir(d) if e.name.endswith(SUFFIXES) and not e.name.startswith(".")),
                  key=lambda p: p.name)


def scan(path: Path) -> tuple[dict[str, pa.Schema], list[Record]]:
    """The schemas and complete records of one journal file (headers only: the parts are read, and
    checked against their checksums, when needed). A torn last record (a killed writer) is left out;
    a bad record before the end stops the scan there too (nothing after it can be trusted), which
    only damage to the storage causes."""
    path = Path(path)
    size = os.path.getsize(path)
    records: list[Record] = []
    schemas: dict[str, pa.Schema] = {}
    with open(path, "rb") as f:
        # the headers are spread over the whole file: have it read ahead in sequence (compaction reads
        # it all next; out of the page cache, a seek per record waits on the disk each time)
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
        if f.read(len(MAGIC)) not in MAGICS:
            return schemas, records
        pos = len(MAGIC)
        found: list[tuple] = []          # the cell records' fields
        row_at: dict[int, tuple] = {}    # cells part offset -> (rows record's part, row) (Record.row_at)
        while pos + _REC.size <= size:
            f.seek(pos)
            magic, hlen, plen, hcrc = _REC.unpack(f.read(_REC.size))
            end = pos + _REC.size + hlen + plen
            if magic != _REC_MAGIC or end > size:
                break
            head = f.read(hlen)
            if zlib.crc32(head) != hcrc:
                break
            header = json.loads(head)
            start = pos + _REC.size + hlen
            parts = {p[0]: (start + p[1], p[2], p[3]) for p in header["parts"]}
            raw = {p[0]: p[4] for p in header["parts"] if len(p) > 4 and p[4]}
            # the last record may be torn inside its payload (a kill, or a power loss): check it all
            if end == size and not all(_intact(f, part) for part in parts.values()):
                break
            if "rows_of" in header:
                part = (*parts["cells"], raw["cells"])
                row_at.update((off, (part, row)) for row, off in enumerate(header["rows_of"]))
            elif header.get("schemas"):
                schemas = schemas or {name: ipc.read_schema(pa.py_buffer(_read_part(f, part, path, "schemas")))
                                      for name, part in parts.items()}
            elif schemas:
                found.append((header["cell_id"], header["framework"], parts, raw))
            pos = end
    records = [Record(path, seq, cid, fw, parts, raw, row_at.get(parts["cells"][0]) if "cells" in parts else None)
               for seq, (cid, fw, parts, raw) in enumerate(found)]
    return schemas, records


def _intact(f, part: tuple[int, int, int]) -> bool:
    off, n, crc = part
    data = os.pread(f.fileno(), n, off)
    return len(data) == n and zlib.crc32(data) == crc


def _read_part(f, part: tuple[int, int, int], path, what: str) -> bytes:
    off, n, crc = part
    data = os.pread(f.fileno(), n, off)
    if len(data) != n or zlib.crc32(data) != crc:
        raise RuntimeError(f"{path}: the record of {what} at byte {off} is damaged (checksum mismatch): the "
                           f"journal was changed after it was written")
    return data


READ_CELLS = 4096   # cells rows per IPC stream (~40 MB of messages)


class JournalReader:
    """Reads the parts of records of one journal file (each checked against its checksum)."""

    def __init__(self, path: Path, schemas: dict[str, pa.Schema]):
        self.path, self.schemas = Path(path), schemas
        self.f = open(path, "rb")

    def batch(self, rec: Record, table: str) -> pa.RecordBatch | None:
        """The cell's rows of `table` as written (the writer's schema), or None when it has none."""
        part = rec.parts.get(table)
        if part is None:
            return None
        data = _read_part(self.f, part, self.path, f"cell {rec.cell_id}")
        raw = rec.raw.get(table)
        data = _ZSTD.decompress(data, decompressed_size=raw) if raw else pa.py_buffer(data)
        return ipc.read_record_batch(data, self.schemas[table])

    def cells(self, records: list[Record]) -> tuple[pa.Table, np.ndarray]:
        """The cells rows of `records` as read (the writer's schema), and the row of each record: from the rows records
        where they have them, else from the cell records, decoded as IPC streams of READ_CELLS
        messages each, one reader call per stream (one call per message cost ~3x the CPU). The
        caller orders them (one take of many files' rows, not one per file)."""
        schema = self.schemas["cells"]
        tables: list[pa.Table] = []
        first: dict[tuple, int] = {}   # rows record part -> its first row in the concatenation
        at, alone = [], []
        have = 0
        for rec in records:
            if rec.row_at is None:
                at.append(-1 - len(alone))
                alone.append(rec)
                continue
            part, row = rec.row_at
            if part not in first:
                data = _ZSTD.decompress(_read_part(self.f, part[:3], self.path, "cells rows"), decompressed_size=part[3])
                t = pa.Table.from_batches([ipc.read_record_batch(data, schema)])
                first[part], have = have, have + t.num_rows
                tables.append(t)
            at.append(first[part] + row)
        head = schema.serialize().to_pybytes()
        for i in range(0, len(alone), READ_CELLS):
            msgs = [_read_part(self.f, rec.parts["cells"], self.path, f"cell {rec.cell_id}")
                    for rec in alone[i:i + READ_CELLS]]
            tables.append(ipc.open_stream(b"".join([head, *msgs])).read_all().combine_chunks())
        pos = np.array(at, np.int64)
        pos[pos < 0] = have - 1 - pos[pos < 0]   # the records read alone follow the rows records' rows
        return (pa.concat_tables(tables) if tables else schema.empty_table()), pos

    def close(self) -> None:
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
