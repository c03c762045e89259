"""A matrix file's bytes to Python data, every way that can fail as one `MatrixError` line: the file not a
regular file or too large, a byte that is not UTF-8, a YAML syntax error (its line and column whole), a key
given twice in one mapping (at any depth), nesting deeper than a matrix needs, and any integer past what an
engine can take (2**53).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from orchestrator.matrix.models import MatrixError
from orchestrator.values import shown

MAX_FILE_BYTES = 2**19   # a matrix is a few KB (the largest shipped one under 20 KB); PyYAML parses ~0.25 MB/s here
MAX_DEPTH = 64                # mappings and lists inside each other (a shipped matrix: under 10)
MAX_INT = 2**53               # larger integers are no size, seed or count an engine takes


class _MatrixLoader(yaml.SafeLoader):
    """safe_load's loader that refuses a key given twice in one mapping and nesting past MAX_DEPTH."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise MatrixError([f"(yaml) line {mark.line + 1}, column {mark.column + 1}: nested deeper than "
                                   f"{MAX_DEPTH} levels (a matrix needs under 10)"])
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self.flatten_mapping(node)   # `<<: *a` merges may be overridden; keys written twice may not
            seen: dict = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:
                    continue   # an unhashable key: construct_mapping says so below
                if first is not key_node.start_mark:
                    mark = key_node.start_mark
                    raise MatrixError([f"(yaml) line {mark.line + 1}, column {mark.column + 1}: key {shown(key)} "
                                       f"given twice in one mapping (first at line {first.line + 1}); the second "
                                       "would replace the first"])
        return super().construct_mapping(node, deep=deep)


def _one_line(err: yaml.YAMLError, text: str) -> str:
    """A YAML error as one line: where (line and column, 1-based), what, and in what."""
    if isinstance(err, yaml.reader.ReaderError):   # a character YAML does not allow: where it is, which it is
        before = text[:err.position]
        line, column = before.count("\n") + 1, err.position - (before.rfind("\n") + 1) + 1
        code = err.character if isinstance(err.character, int) else ord(str(err.character)[:1] or "?")
        return (f"(yaml) line {line}, column {column}: character U+{code:04X} is not allowed in YAML "
                "(a control character or a NUL: remove it)")
    if not isinstance(err, yaml.MarkedYAMLError):
        return f"(yaml): {shown(' '.join(str(err).split()))}"
    mark = err.problem_mark or err.context_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(position unknown)"
    what = err.problem or "invalid YAML"
    if err.context:
        ctx = err.context_mark
        what += f" ({err.context}" + (f" at line {ctx.line + 1}, column {ctx.column + 1})" if ctx else ")")
    what = " ".join(what.split())
    return f"(yaml) {where}: {what if len(what) <= 300 else what[:297] + '...'}"


def _too_big_ints(data: Any, path: str = "", seen: set | None = None) -> list[str]:
    """Integers past MAX_INT, with their YAML paths; each mapping or list walked once (an alias is not
    walked again at each use: an alias bomb stays cheap)."""
    seen = set() if seen is None else seen
    if isinstance(data, int) and not isinstance(data, bool) and abs(data) > MAX_INT:
        return [f"{path or '(top level)'}: {shown(str(data))} is out of range (at most 2**53 in size)"]
    if not isinstance(data, (dict, list)) or id(data) in seen:
        return []
    seen.add(id(data))
    out = []
    for k, v in data.items() if isinstance(data, dict) else enumerate(data):
        out += _too_big_ints(v, f"{path}[{k}]" if isinstance(k, int) else f"{path}.{k}" if path else str(k), seen)
        if len(out) >= 20:
            break
    return out


def load_yaml(text: str, source: str = "matrix") -> Any:
    """A matrix's YAML text as data; a MatrixError naming `source` for every way it cannot be read."""
    try:
        data = yaml.load(text, Loader=_MatrixLoader)   # noqa: S506 - a SafeLoader subclass
    except MatrixError as err:
        raise MatrixError(err.problems, source) from None
    except yaml.YAMLError as err:
        raise MatrixError([_one_line(err, text)], source) from None
    except RecursionError:
        raise MatrixError([f"(yaml): nested deeper than {MAX_DEPTH} levels"], source) from None
    big = _too_big_ints(data)
    if big:
        raise MatrixError(big, source)
    return data


def read_text(path: str | Path) -> str:
    """A matrix file's text: a regular file of at most MAX_FILE_BYTES, UTF-8; one line for each other case."""
    source = str(path) if len(str(path)) <= 300 else str(path)[:297] + "..."
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as err:
        raise MatrixError([f"(file): cannot open: {err.strerror}"], source) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise MatrixError(["(file): not a regular file (a device, pipe, socket or folder)"], source)
        if st.st_size > MAX_FILE_BYTES:
            raise MatrixError([f"(file): {st.st_size:,} bytes; a matrix is at most {MAX_FILE_BYTES:,}"], source)
        with os.fdopen(fd, "rb", closefd=False) as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[:err.start].count(b"\n") + 1
        raise MatrixError([f"(file) line {line}: byte 0x{raw[err.start]:02x} at offset {err.start} is not UTF-8 "
                           "(save the matrix as UTF-8)"], source) from None
