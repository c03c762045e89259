"""What makes every byte of a run dir at rest verifiable, and the run dir the tool's own.

- manifest.json and compacted.json are sealed: their text starts `{"digest":"<sha256>"` and the
  digest covers every byte after it (`seal`, `unseal`). A file that does not verify is DamagedFile
  (exit 4, naming it). Files written by earlier versions (no digest) are read as they are.
- Every compacted Parquet file is written with page checksums (every data page's crc32) and read
  with their verification; compacted.json records its size, row count, sha256 and the sha256 of its
  footer (`file_facts`). A reader checks a file when it first opens it (`check_file`): its size and
  footer always, its whole sha256 when it is at most WHOLE_CHECK bytes (larger: its pages' checksums
  as they are read). `bench verify` (orchestrator/store/verify.py) checks every byte of every file.
- Nothing under a run dir is followed through a symbolic link (`refuse_links`, `open_nofollow`):
  a link is LinkRefused, one line naming it, and nothing is read or written through it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from pathlib import Path

DIGEST_HEAD = '{"digest":"'
WHOLE_CHECK = 256 << 20          # compacted files up to this size are hashed whole when a reader opens them
_CHUNK = 1 << 20


class DamagedFile(RuntimeError):
    """A file of a run dir that does not verify (a flipped byte, a cut, an edit): nothing read from it."""

    bench_exit_code = 4   # `bench`: damaged data

    def __init__(self, path: Path, what: str, cells: list[str] | None = None):
        self.path, self.cells = Path(path), cells
        held = ""
        if cells:
            held = f"; it holds {len(cells)} cell(s): " + ", ".join(cells[:8]) + (
                f" and {len(cells) - 8} more" if len(cells) > 8 else "")
        super().__init__(f"{path}: damaged: {what}{held}. Nothing was read from it or changed; restore the run dir "
                         f"from a copy (`bench verify RUN` lists every file that does not verify)")


class LinkRefused(RuntimeError):
    """A symbolic link inside a run dir: never followed (the run dir, often in a shared results root,
    is the tool's own)."""

    bench_exit_code = 2

    def __init__(self, path: Path):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        super().__init__(f"{path} is a symbolic link (to {target}): bench follows no link inside a run dir; "
                         f"nothing was read or written through it. Replace it with the file or folder itself")


RUN_ENTRIES = ("manifest.json", "compacted.json", ".lock", "run.log", "journal", "cells", "logprobs", "tasks",
               "samples")   # what the tool owns at a run dir's top


def refuse_links(root: Path, names=RUN_ENTRIES) -> None:
    """LinkRefused when the run dir or one of its entries `names` (relative paths) is a symbolic link."""
    root = Path(root)
    for rel in names:
        p = root / rel
        if os.path.islink(p):
            raise LinkRefused(p)


_UMASK = os.umask(0o022)   # read once, at import (setting it back at once): os.umask has no read-only form
os.umask(_UMASK)


def plain_mode(folder: bool = False) -> int:
    """The mode a plain open() or mkdir gives under this process's umask (0644 / 0755 under the usual 022): every
    run file is written with it, so whoever the umask lets read a results root (its group, where it is shared)
    reads every run in it; mkstemp's temporary files, renamed into place, would otherwise stay 0600."""
    return (0o777 if folder else 0o666) & ~_UMASK


def open_nofollow(path: Path, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """os.open that never follows a link at `path` (LinkRefused instead)."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP or os.path.islink(path):   # the last component is a link
            raise LinkRefused(Path(path)) from None
        raise


def read_bytes(path: Path) -> bytes:
    fd = open_nofollow(path)
    with os.fdopen(fd, "rb") as f:
        return f.read()


# ------------------------------------------------------------------ sealed JSON

def seal(text: str) -> str:
    """JSON object text (`{...}`) with a digest of itself in front (see the module docstring)."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        raise ValueError("only a JSON object is sealed")
    rest = "}" if body[1:].strip() == "}" else "," + body[1:]
    return DIGEST_HEAD + hashlib.sha256(rest.encode()).hexdigest() + '"' + rest


def _sealed(text: str) -> bool:
    """Written sealed: the head matches but for at most two bytes (a flip in it is damage, not an old file)."""
    head = text[:len(DIGEST_HEAD)]
    return len(head) == len(DIGEST_HEAD) and sum(a != b for a, b in zip(head, DIGEST_HEAD)) <= 2


def unseal(path: Path, data: bytes) -> dict:
    """The JSON object of a sealed (or earlier, unsealed) file, DamagedFile when it does not verify."""
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise DamagedFile(path, f"not UTF-8 text (byte {e.start})") from None
    if _sealed(text):
        n = len(DIGEST_HEAD)
        digest, rest = text[n:n + 64], text[n + 65:]
        if text[n + 64:n + 65] != '"' or text[:n] != DIGEST_HEAD \
                or hashlib.sha256(rest.encode()).hexdigest() != digest:
            raise DamagedFile(path, "its content does not match the digest it was written with")
    try:
        obj = json.loads(text)
    except ValueError as e:
        raise DamagedFile(path, f"not JSON ({str(e)[:120]})") from None
    if not isinstance(obj, dict):
        raise DamagedFile(path, "not a JSON object")
    obj.pop("digest", None)
    return obj


def read_sealed(path: Path) -> dict | None:
    """A sealed JSON file of the run dir (None when there is none), never through a link."""
    try:
        data = read_bytes(path)
    except FileNotFoundError:
        return None
    return unseal(path, data)


# ------------------------------------------------------------------ file digests

def file_digest(path: Path, fd: int | None = None) -> str:
    """sha256 of a file (or of the open file `fd`), streamed (never held whole), opened without following a link."""
    h = hashlib.sha256()
    own = fd is None
    fd = open_nofollow(path) if own else fd
    try:
        at = 0
        while chunk := os.pread(fd, _CHUNK, at):
            h.update(chunk)
            at += len(chunk)
    finally:
        if own:
            os.close(fd)
    return h.hexdigest()


def _footer(fd: int, size: int) -> bytes:
    """A Parquet file's footer and its length and magic (the last 8 bytes); b"" when it has none."""
    if size < 12:
        return b""
    tail = os.pread(fd, 8, size - 8)
    n = int.from_bytes(tail[:4], "little")
    if tail[4:] != b"PAR1" or n + 12 > size:
        return b""
    return os.pread(fd, n + 8, size - 8 - n)


def file_facts(path: Path) -> dict:
    """What compacted.json records of a compacted file: bytes, rows, sha256 of it and of its footer."""
    import pyarrow.parquet as pq

    fd = open_nofollow(path)
    try:
        size = os.fstat(fd).st_size
        footer = hashlib.sha256(_footer(fd, size)).hexdigest()
    finally:
        os.close(fd)
    return {"bytes": size, "rows": pq.ParquetFile(str(path)).metadata.num_rows, "sha256": file_digest(path),
            "footer_sha256": footer}


def check_file(path: Path, facts: dict | None, cells: list[str] | None = None, whole: bool | None = None,
               fd: int | None = None) -> None:
    """`path` as compacted.json recorded it (`facts`; None: written by an earlier version, not checked):
    size and footer, and its whole sha256 when `whole` (default: at most WHOLE_CHECK bytes). DamagedFile
    naming the file and the cells it holds otherwise. `fd`: the file as opened already (a reader's snapshot)."""
    if not facts:
        return
    own = fd is None
    fd = open_nofollow(path) if own else fd
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise DamagedFile(path, "not a regular file", cells)
        if st.st_size != facts.get("bytes"):
            raise DamagedFile(path, f"{st.st_size} bytes where {facts.get('bytes')} were written", cells)
        if hashlib.sha256(_footer(fd, st.st_size)).hexdigest() != facts.get("footer_sha256"):
            raise DamagedFile(path, "its Parquet footer does not match the digest recorded in compacted.json", cells)
        if ((st.st_size <= WHOLE_CHECK) if whole is None else whole) and file_digest(path, fd) != facts.get("sha256"):
            raise DamagedFile(path, "its bytes do not match the sha256 recorded in compacted.json", cells)
    finally:
        if own:
            os.close(fd)


def parquet_format():
    """pyarrow.dataset's Parquet format with page checksum verification on."""
    import pyarrow.dataset as ds

    return ds.ParquetFileFormat(default_fragment_scan_options=ds.ParquetFragmentScanOptions(
        page_checksum_verification=True))
