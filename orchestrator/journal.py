"""The run's journal: every stored cell appended as one record to an append-only file.

    journal/<creation time ns>-<pid>.journal      one file per writing process, never written by another

A file is the magic line, a schemas record (the Arrow schema of each table, as this process writes
them), then one record per stored cell. A record is

    "LBJR" | header length u32 | payload length u64 | crc32 of the header u32
    header: JSON {"cell_id", "framework", "parts": [[table, offset, length, crc32], ...]}
    payload: one Arrow IPC record-batch message per table the cell has rows in, its cells row last

and goes to the file in one write(), so the cell row and its side rows are stored together or not
at all: a killed writer leaves at most a torn last record, which readers skip (it is shorter than
its header says, or its checksum does not match). A file is never opened for writing again once its
process is gone, so a torn tail is never followed by a good record, and hard-linked copies of a run
dir stay independent. A cell stored twice has two records; the later one wins (file order, then
record order). Compaction folds the journal files into the compacted Parquet files and deletes them.

Why not a Parquet file per cell: a one-row Parquet file is ~80 column chunks of footer, ~1 ms of
CPU to open; 100,000 cells were minutes of footers. An IPC message decodes without parsing a
footer, and the files are few.
"""

from __future__ import annotations

import json
import os
import struct
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

JOURNAL_DIR = "journal"
SUFFIX = ".journal"
MAGIC = b"lossless-bench journal 1\n"
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


def _encode(header: dict, messages: list[tuple[str, pa.Buffer]]) -> bytes:
    parts, off = [], 0
    for name, buf in messages:
        parts.append([name, off, buf.size, zlib.crc32(buf)])
        off += buf.size
    head = json.dumps({**header, "parts": parts}, separators=(",", ":")).encode()
    payload = b"".join(bytes(buf) for _, buf in messages)
    return _REC.pack(_REC_MAGIC, len(head), len(payload), zlib.crc32(head)) + head + payload


class JournalWriter:
    """This process's journal file of one run dir, created at the first append. When the file is not
    as this writer left it (a compaction folded and deleted it, or a write failed half-way) the next
    append starts a new file: a record is never written after a torn one."""

    def __init__(self, root: Path, schemas: dict[str, pa.Schema]):
        self.root, self.schemas = Path(root), schemas
        self.path: Path | None = None
        self.ino = self.size = -1

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
        self.path, self.ino, self.size = path, os.fstat(fd).st_ino, 0
        try:
            self._write(fd, MAGIC + _encode({"schemas": True}, [(n, s.serialize()) for n, s in self.schemas.items()]))
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
        record = _encode({"cell_id": cell_id, "framework": framework},
                         [(name, _message(batch, compress=name != "cells")) for name, batch in batches])
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
            self._write(fd, record)
        finally:
            os.close(fd)


_LZ4 = ipc.IpcWriteOptions(compression="lz4")


def _message(batch: pa.RecordBatch, compress: bool) -> pa.Buffer:
    """The batch as one IPC message. Side tables are lz4-compressed (buffer by buffer, inside the
    message: any IPC reader decompresses it): raw logprobs are ~5x their Parquet size, and a journal
    that falls out of the page cache makes compaction wait on the disk. A cells row is left plain
    (tiny, and 100,000 of them are decoded at once)."""
    if not compress:
        return batch.serialize()
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema, options=_LZ4) as w:
        w.write_batch(batch)
    reader = ipc.MessageReader.open_stream(sink.getvalue())
    reader.read_next_message()   # the schema
    return reader.read_next_message().serialize()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def journal_files(root: Path) -> list[Path]:
    """The run dir's journal files, oldest first."""
    d = Path(root) / JOURNAL_DIR
    if not d.is_dir():
        return []
    return sorted((Path(e.path) for e in os.scandir(d) if e.name.endswith(SUFFIX) and not e.name.startswith(".")),
                  key=lambda p: p.name)


def scan(path: Path) -> tuple[dict[str, pa.Schema], list[Record]]:
    """The schemas and complete records of one journal file (headers only: the parts are read, and
    checked against their checksums, when needed). A torn last record (a killed writer) is left out;
    a bad record before the end stops the scan there too (nothing after it can be trusted), which
    only damage to the storage causes."""
    size = os.path.getsize(path)
    records: list[Record] = []
    schemas: dict[str, pa.Schema] = {}
    with open(path, "rb") as f:
        # the headers are spread over the whole file: have it read ahead in sequence (compaction reads
        # it all next; out of the page cache, a seek per record waits on the disk each time)
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
        if f.read(len(MAGIC)) != MAGIC:
            return schemas, records
        pos, seq = len(MAGIC), 0
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
            parts = {name: (start + off, n, crc) for name, off, n, crc in header["parts"]}
            # the last record may be torn inside its payload (a kill, or a power loss): check it all
            if end == size and not all(_intact(f, part) for part in parts.values()):
                break
            if header.get("schemas"):
                schemas = schemas or {name: ipc.read_schema(_read_part(f, part, path, "schemas"))
                                      for name, part in parts.items()}
            elif schemas:
                records.append(Record(Path(path), seq, header["cell_id"], header["framework"], parts))
                seq += 1
            pos = end
    return schemas, records


def _intact(f, part: tuple[int, int, int]) -> bool:
    off, n, crc = part
    data = os.pread(f.fileno(), n, off)
    return len(data) == n and zlib.crc32(data) == crc


def _read_part(f, part: tuple[int, int, int], path, what: str) -> pa.Buffer:
    off, n, crc = part
    data = os.pread(f.fileno(), n, off)
    if len(data) != n or zlib.crc32(data) != crc:
        raise RuntimeError(f"{path}: the record of {what} at byte {off} is damaged (checksum mismatch): the "
                           f"journal was changed after it was written")
    return pa.py_buffer(data)


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
        return ipc.read_record_batch(_read_part(self.f, part, self.path, f"cell {rec.cell_id}"), self.schemas[table])

    def close(self) -> None:
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
