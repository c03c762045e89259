"""What a cell ran on, beyond its config: the model's content fingerprint (the host's hardware and
drivers: adapters/contract/host.py). Taken in the worker (the files are on its node), stored with
every cell, so that two runs can say what changed between them (`bench compare NEW --against OLD`).

The fingerprint is a BLAKE2b over the weights, config and tokenizer files of a local model (their
relative names, sizes and contents), cached per file by (path, size, mtime): a model is hashed once,
then costs a stat per file. A hub id has no local files to hash here: null, with the reason.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

# what decides a model's outputs: weights, configs, tokenizer (not READMEs, not images)
_MODEL_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".json", ".model", ".txt", ".tiktoken", ".py")
_CHUNK = 8 << 20


def model_files(path: Path) -> list[Path]:
    """The files that decide a model's outputs (weights, configs, tokenizer), sorted; a file is itself."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _MODEL_SUFFIXES
                  and not any(part.startswith(".") for part in p.relative_to(path).parts))


_MEMO: dict[str, str] = {}


def file_digest(path: Path, cache: dict | None = None) -> str:
    """BLAKE2b of one file's contents, memoised by (path, size, mtime) in `cache` (default: this process)."""
    cache = _MEMO if cache is None else cache
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    if key not in cache:
        h = hashlib.blake2b(digest_size=16)
        with open(path, "rb") as f:
            while block := f.read(_CHUNK):
                h.update(block)
        cache[key] = h.hexdigest()
    return cache[key]


def model_fingerprint(source: str, cache_dir: str | None = None) -> tuple[str | None, str | None]:
    """(fingerprint, None) of a local model dir or file, or (None, why not)."""
    path = Path(source)
    if not path.exists():
        return None, "not a local path (a hub id): no files here to hash; its revision is in the cell's config"
    files = model_files(path)
    if not files:
        return None, f"no model files under {path.name}"
    cache_path = Path(cache_dir) / "fingerprints.json" if cache_dir else None
    cache: dict = dict(_MEMO)
    if cache_path and cache_path.exists():
        try:
            cache = json.loads(cache_path.read_text())
        except (OSError, ValueError):
            cache = {}
    before = len(cache)
    h = hashlib.blake2b(digest_size=16)
    for f in files:
        name = f.name if path.is_file() else str(f.relative_to(path))
        h.update(f"{name}\0{f.stat().st_size}\0{file_digest(f, cache)}\n".encode())
    _MEMO.update(cache)
    if cache_path and len(cache) != before:
        _save(cache_path, cache)
    return h.hexdigest(), None


def _save(path: Path, cache: dict) -> None:
    """Merge into the shared cache file under a lock, atomically (engine groups run side by side)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            merged = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, ValueError):
            merged = {}
        merged.update(cache)
        tmp = path.with_suffix(f".tmp-{os.getpid()}")
        tmp.write_text(json.dumps(merged))
        os.replace(tmp, path)
