"""The run's journal: every stored cell appended as one record to an append-only file.

    journal/<creation time ns>-<pid>.journal3     one file per writing process, never written by another

A file is the magic line, a schemas record (the Arrow schema of each table, as this process writes them), then
one record per stored cell (written 0644 under the usual umask: integrity.plain_mode). A record (version 3) is

    sync marker (8 bytes) | header length u32 | payload length u64 | crc32 u32 of everything before it
                                                                     and of the header
    header: JSON {"cell_id", "framework", "parts": [[table, offset, length, crc32, raw length], ...]}
    payload: one Arrow IPC record-batch message per table the cell has rows in, its cells row last;
             a side table's message zstd-compressed whole (raw length: its size before), the cells
             row's plain (raw length 0)

and goes to the file in one write(), so the cell row and its side rows are stored together or not at all: a
killed writer leaves at most a torn last record, which readers skip (and list its cell as not stored). A writer
that finishes a file appends an end record (a rows record of no rows, marked "end"): a record that does not
verify before it is damage, never a torn write. A file is never opened for writing again once its process is
gone, so a torn tail is never followed by a good record, and hard-linked copies of a run dir stay independent.
A cell stored twice has two records; the later one wins (file order, then record order). Compaction folds the
journal files into the compacted Parquet files and deletes them (one with a torn tail it keeps as `*.damaged`).

Every record verifies on its own: the header checksum covers the marker, both lengths and the header, the parts
lie end to end and fill the payload, and each part has its checksum. A record that does not verify is a torn
tail when no verified record follows it (the reader looks for the sync marker after it), and damage otherwise:
`DamagedJournal`, naming the file, the byte, where the next verified record starts and the cells stored after
it. Nothing after damage is read as if it were not there; `bench compact --salvage`
(orchestrator/store/salvage.py) keeps every record that verifies and says what it could not keep.

After every CELLS_BATCH cell records the writer appends a rows record: header {"rows_of": [offset,
...], "parts": [["cells", ...]]}, the cells rows of those records again (each named by its cells
part's offset in the file) as one zstd-compressed multi-row message. Readers take a cell's row from
there when they have it (one message per CELLS_BATCH rows instead of one each: a cells row is ~100
one-value columns, ~1 us of CPU each to decode and concatenate), else from its own record; either
is the same row. A torn rows record is a tail like any other, skipped.

Why not a Parquet file per cell: a one-row Parquet file is ~80 column chunks of footer, ~1 ms of CPU to open;
100,000 cells were minutes of footers. An IPC message decodes without a footer; the files are few.

Earlier versions, still read (each version has its own suffix, so an earlier reader neither reads nor deletes
a later version's files: it lists only its own suffixes):
- version 2 (`*.journal2`): records start with "LBJR" and a 4-byte-marker fixed header whose crc32 covers the
  JSON header alone (the lengths and marker only by the checks above).
- version 1 (`*.journal`): as version 2, with side messages lz4-compressed by Arrow buffer by buffer (~20 LZ4
  frames a logprobs message: ~300 us of CPU to decode one cell's, 6x version 2's one zstd call), parts without
  a raw length.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
import tempfile
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from orchestrator.store.integrity import plain_mode

JOURNAL_DIR = "journal"
SUFFIX = ".journal3"                                  # what this writer writes: version 3
MAGICS = {".journal": b"lossless-bench journal 1\n", ".journal2": b"lossless-bench journal 2\n",
          SUFFIX: b"lossless-bench journal 3\n"}      # suffix -> the file's first line (all the same length)
SUFFIXES = tuple(MAGICS)                              # what readers read: versions 1, 2 and 3
MAGIC = MAGICS[SUFFIX]
_ZSTD = pa.Codec("zstd", 1)
_REC = struct.Struct("<8sIQI")                        # version 3's fixed header
_SYNC = b"\x1eLBJREC\x1f"                            # its sync marker
_REC_OLD = struct.Struct("<4sIQI")                    # versions 1 and 2
_MARK_OLD = b"LBJR"


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
    at: int = -1                              # where the record starts in the file


def _few(names: list[str], n: int = 8) -> str:
    shown = ", ".join(str(x)[:80] for x in names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


class DamagedJournal(RuntimeError):
    """A journal record that does not verify where verified records follow (damage to the storage or an
    edit, never a killed writer), or a part whose checksum does not match. Nothing is read past it as
    if it were not there."""

    bench_exit_code = 4   # `bench`: damaged data

    def __init__(self, path: Path, offset: int, what: str, cells_after: list[str] | None = None):
        self.path, self.offset, self.cells_after = Path(path), offset, cells_after
        after = "" if cells_after is None else (
            f"; {len(cells_after)} cell record(s) stored after it: {_few(cells_after)}" if cells_after
            else "; no cell record after it")
        run = self.path.parent.parent
        super().__init__(f"{self.path}: damaged at byte {offset}: {what}{after}. Nothing was changed; "
                         f"`bench compact --salvage {run}` keeps every record that verifies and says what it "
                         f"cannot")


def _encode(header: dict, messages: list[tuple[str, bytes | pa.Buffer, int]]) -> tuple[bytes, int]:
    """The record (version 3), and where its last part starts in it."""
    parts, off = [], 0
    for name, buf, raw in messages:
        n = len(buf) if isinstance(buf, bytes) else buf.size
        parts.append([name, off, n, zlib.crc32(buf), raw])
        off += n
    head = json.dumps({**header, "parts": parts}, separators=(",", ":")).encode()
    payload = b"".join(bytes(buf) for _, buf, _ in messages)
    fixed = _REC.pack(_SYNC, len(head), len(payload), 0)[:-4]
    crc = zlib.crc32(head, zlib.crc32(fixed))
    return fixed + struct.pack("<I", crc) + head + payload, _REC.size + len(head) + parts[-1][1]


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
            self._write(fd, MAGIC + _schemas_record(self.schemas))
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

    def close(self) -> None:
        """The end record: this file is complete (a record that does not verify before it is damage,
        never a torn write). The next append, if any, starts a new file."""
        if self.path is None:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        except FileNotFoundError:   # folded and deleted by a compaction
            self.path = None
            return
        try:
            st = os.fstat(fd)
            if (st.st_ino, st.st_size) == (self.ino, self.size):
                if self.rows:
                    self._write_rows(fd)
                self._write(fd, _end_record(self.schemas["cells"]))
                os.fsync(fd)
        finally:
            os.close(fd)
            self.path = None

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


def _end_record(cells: pa.Schema) -> bytes:
    """The last record of a file its writer finished: a rows record of no rows, marked end (read by
    earlier version-3 readers as an empty rows record)."""
    empty = pa.RecordBatch.from_pylist([], schema=cells)
    return _encode({"rows_of": [], "end": True}, [("cells", *_message(empty, True))])[0]


def _schemas_record(schemas: dict[str, pa.Schema]) -> bytes:
    return _encode({"schemas": True}, [(n, s.serialize(), 0) for n, s in schemas.items()])[0]


def write_copy(path: Path, schemas: dict[str, pa.Schema], records: list[tuple[dict, list[tuple[str, bytes, int]]]]) -> None:
    """A journal file of this version holding `records` ((header without parts, [(table, message as
    stored, raw length)]) in order), written whole to a hidden name, fsynced and renamed to `path`."""
    with atomic_file(path, "wb") as f:
        f.write(MAGIC + _schemas_record(schemas))
        for header, messages in records:
            f.write(_encode(header, messages)[0])


@contextmanager
def atomic_file(path: Path, mode: str = "wb", durable: bool = True):
    """A file written whole or not at all: a hidden name in the same folder, renamed to `path` once the
    block ends without an error (removed otherwise); `durable`: file and folder fsynced before it returns."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        os.fchmod(fd, plain_mode())
        with os.fdopen(fd, mode) as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """A rename or unlink in `path` made durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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


# ------------------------------------------------------------------ reading a file's records

def _suffix(path: Path) -> str:
    return next(s for s in SUFFIXES if path.name.endswith(s) and (s != ".journal" or not path.name.endswith(".journal2")))


@contextmanager
def _mapped(path: Path):
    """(the file's bytes, mapped, or b"" when empty; its size)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not size:
            yield b"", 0
            return
        # the headers are spread over the whole file: have it read ahead in sequence (compaction reads
        # it all next; out of the page cache, a seek per record waits on the disk each time)
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_WILLNEED)
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            yield mm, size
        finally:
            mm.close()


def _record_at(mm, pos: int, size: int, v3: bool) -> tuple[dict, int, int] | None:
    """(header, payload start, end) of the record at `pos` when its header verifies, else None."""
    fixed, marker = (_REC, _SYNC) if v3 else (_REC_OLD, _MARK_OLD)
    if pos + fixed.size > size:
        return None
    mark, hlen, plen, hcrc = fixed.unpack_from(mm, pos)
    start = pos + fixed.size + hlen
    end = start + plen
    if mark != marker or end > size:
        return None
    head = mm[pos + fixed.size:start]
    if hcrc != (zlib.crc32(head, zlib.crc32(mm[pos:pos + fixed.size - 4])) if v3 else zlib.crc32(head)):
        return None
    try:   # the parts lie end to end and fill the payload (in versions 1 and 2 the lengths' only check)
        header = json.loads(head)
        off = 0
        for p in header["parts"]:
            if p[1] != off or p[2] < 0:
                return None
            off += p[2]
        if off != plen:
            return None
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    return header, start, end


def _intact(mm, start: int, header: dict) -> bool:
    return all(zlib.crc32(mm[start + p[1]:start + p[1] + p[2]]) == p[3] for p in header["parts"])


def _next_record(mm, pos: int, size: int, v3: bool) -> int:
    """Where the first record that verifies after `pos` starts (found by its marker), else `size`."""
    marker = _SYNC if v3 else _MARK_OLD
    at = pos
    while True:
        at = mm.find(marker, at + 1)
        if at < 0:
            return size
        if _record_at(mm, at, size, v3) is not None:
            return at


def _walk(mm, size: int, v3: bool) -> Iterator[tuple]:
    """("record", at, header, payload start, end) for each record that verifies, in order, and ("bad",
    at, next) for each stretch that does not: damage when `next` < size (a verified record follows),
    else a torn tail. The last record's parts are checked too (a tail torn inside its payload, or
    garbage a power loss left there); the others' when they are read."""
    pos = len(MAGIC)
    while pos < size:
        rec = _record_at(mm, pos, size, v3)
        if rec is not None and rec[2] == size and not _intact(mm, rec[1], rec[0]):
            rec = None
        if rec is None:
            nxt = _next_record(mm, pos, size, v3)
            yield "bad", pos, nxt
            pos = nxt
            continue
        yield "record", pos, *rec
        pos = rec[2]


def _start(path: Path, mm, size: int) -> int | None:
    """Where the records start (after the magic line); None for a file torn while its first line was written."""
    magic = MAGICS[_suffix(path)]
    head = bytes(mm[:len(magic)])
    if head == magic:
        return len(magic)
    if size < len(magic) and magic.startswith(head):
        return None
    return 0


def scan(path: Path, tails: dict | None = None) -> tuple[dict[str, pa.Schema], list[Record]]:
    """The schemas and complete records of one journal file (headers only: the parts are read, and
    checked against their checksums, when needed). A torn last record (a killed writer) is left out
    (and, with `tails`, recorded there: path -> (byte, the cell its header names, if it can be told));
    a record that does not verify before others that do is DamagedJournal: after a verified one
    (the end record of a finished file included)."""
    path = Path(path)
    schemas: dict[str, pa.Schema] = {}
    found: list[tuple] = []          # the cell records' fields
    row_at: dict[int, tuple] = {}    # cells part offset -> (rows record's part, row) (Record.row_at)
    v3 = _suffix(path) == SUFFIX
    with _mapped(path) as (mm, size):
        first = _start(path, mm, size)
        if first is None:
            return {}, []
        events = _walk(mm, size, v3)
        if first == 0:   # the first line is not this version's magic
            events = iter([("bad", 0, _next_record(mm, 0, size, v3)), *events])
        for event in events:
            if event[0] == "bad":
                _, at, nxt = event
                if nxt == size:   # a torn tail
                    if tails is not None:
                        tails[path] = (at, torn_cell(mm, at, size))
                    break
                after = [e[2]["cell_id"] for e in events if e[0] == "record" and "cell_id" in e[2]]
                raise DamagedJournal(path, at, f"{nxt - at} bytes that are no record that verifies (the next one "
                                     f"starts at byte {nxt})", after)
            _, at, header, start, end = event
            parts = {p[0]: (start + p[1], p[2], p[3]) for p in header["parts"]}
            raw = {p[0]: p[4] for p in header["parts"] if len(p) > 4 and p[4]}
            if "rows_of" in header:
                part = (*parts["cells"], raw["cells"])
                row_at.update((off, (part, row)) for row, off in enumerate(header["rows_of"]))
            elif header.get("schemas"):
                schemas = schemas or {name: ipc.read_schema(pa.py_buffer(_read_part(mm, part, path, "schemas")))
                                      for name, part in parts.items()}
            elif schemas:
                found.append((header["cell_id"], header["framework"], parts, raw, at))
    records = [Record(path, seq, cid, fw, parts, raw, row_at.get(parts["cells"][0]) if "cells" in parts else None, at)
               for seq, (cid, fw, parts, raw, at) in enumerate(found)]
    return schemas, records


@dataclass
class Salvaged:
    """What salvage_scan found in one file: the schemas, every cell record that verifies whole (header
    and parts), and what it could not keep: (byte, what) of each stretch or record that does not verify."""

    schemas: dict[str, pa.Schema]
    records: list[tuple[dict, list[tuple[str, bytes, int]]]]   # (header less parts, [(table, message, raw)])
    lost: list[tuple[int, str]]
    torn_tail: int = 0                                          # bytes of a torn last record (not damage)
    torn_cell: str | None = None                                # the cell its header names, if it can be read
    lost_cells: list[str] = field(default_factory=list)         # cells whose records do not verify
    rebuilt: bool = False                                       # the schemas record lost: read with this version's


def salvage_scan(path: Path, schemas: dict[str, pa.Schema] | None = None, keep: bool = True) -> Salvaged:
    """Every record of one journal file that verifies, parts included, and where the rest lies.
    `schemas`: the tables' schemas to read the records with when the file's own schemas record does
    not verify (this version's types; else those records are lost too). `keep` false: the records'
    parts are checked, not copied (`bench verify`: the file is mapped, never held in memory)."""
    path = Path(path)
    out = Salvaged({}, [], [])
    v3 = _suffix(path) == SUFFIX
    with _mapped(path) as (mm, size):
        first = _start(path, mm, size)
        if first is None:
            return out
        events = _walk(mm, size, v3)
        if first == 0:
            out.lost.append((0, "the file's first line is not a journal's (its records are read all the same)"))
        for event in events:
            if event[0] == "bad":
                _, at, nxt = event
                if nxt == size:   # nothing verifies after it: a torn last record (or damage to the last one)
                    out.torn_tail = nxt - at
                    out.torn_cell = torn_cell(mm, at, size)
                else:
                    out.lost.append((at, f"{nxt - at} bytes that are no record that verifies (a cell's record whose "
                                         f"header is damaged: which cell is not known)"))
                continue
            _, at, header, start, end = event
            if "rows_of" in header:
                continue   # a shortcut for readers: the cells rows are in their own records too
            if not _intact(mm, start, header):
                bad = [p[0] for p in header["parts"]
                       if zlib.crc32(mm[start + p[1]:start + p[1] + p[2]]) != p[3]]
                what = "the schemas" if header.get("schemas") else f"cell {header.get('cell_id')}"
                out.lost.append((at, f"the record of {what}: its {', '.join(bad)} part does not verify"))
                if header.get("cell_id"):
                    out.lost_cells.append(header["cell_id"])
                continue
            copy = keep or header.get("schemas")   # `bench verify`: checked above, not copied
            messages = [(p[0], bytes(mm[start + p[1]:start + p[1] + p[2]]) if copy else b"", p[4] if len(p) > 4 else 0)
                        for p in header["parts"]]
            if header.get("schemas"):
                out.schemas = out.schemas or {n: ipc.read_schema(pa.py_buffer(m)) for n, m, _ in messages}
            elif out.schemas or schemas:
                if not out.schemas:
                    out.schemas, out.rebuilt = schemas, True
                out.records.append(({k: v for k, v in header.items() if k != "parts"}, messages))
            else:
                out.lost.append((at, f"the record of cell {header.get('cell_id')}: no schemas record before it "
                                     f"to decode it with"))
    return out


def torn_cell(mm, at: int, size: int) -> str | None:
    """The cell a record that does not verify names in its header, when that much can be read."""
    m = re.search(rb'"cell_id":"([^"\\]{1,200})"', bytes(mm[at:min(size, at + 4096)]))
    return m.group(1).decode(errors="replace") if m else None


def _read_part(f, part: tuple[int, int, int], path, what: str) -> bytes:
    """A part's bytes (from an open file, or a mapped one), checked against its checksum."""
    off, n, crc = part
    data = bytes(f[off:off + n]) if isinstance(f, mmap.mmap) else os.pread(f.fileno(), n, off)
    if len(data) != n or zlib.crc32(data) != crc:
        raise DamagedJournal(path, off, f"the record of {what} does not match its checksum (the journal was "
                                        f"changed after it was written)")
    return data


READ_CELLS = 4096   # cells rows per IPC stream (~40 MB of messages)


class JournalReader:
    """Reads the parts of records of one journal file (each checked against its checksum)."""

    def __init__(self, path: Path, schemas: dict[str, pa.Schema], name: Path | None = None):
        self.path, self.schemas = Path(name or path), schemas   # `name`: the file's own, when read from `path`
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

    def verify(self, records: list[Record]) -> None:
        """Every part of `records` matches its checksum (DamagedJournal at the first that does not)."""
        for rec in records:
            for part in rec.parts.values():
                _read_part(self.f, part, self.path, f"cell {rec.cell_id}")

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
