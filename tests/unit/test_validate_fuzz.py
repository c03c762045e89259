"""`bench validate` fuzzed: every shipped matrix (matrices/*.yaml) mutated a few hundred ways, each run through
what the command runs (the YAML text parsed and validated, the cells expanded and grouped, the table
rendered, the deferred checks), in process. Every case ends in a matrix or a MatrixError, never another
exception (a traceback), within 2 s, and its messages stay bounded.

Mutations are seeded (the same cases every run): on the parsed matrix, a node deleted, replaced (other
types, extremes, long and hostile strings, another part of the matrix), renamed, wrapped in or taken out of
a list, repeated, or an unknown key added; on the text, characters cut, inserted (YAML syntax, aliases,
tags) or lines swapped.
"""

from __future__ import annotations

import copy
import os
import io
import random
import sys
import time
import traceback

import pytest
import yaml
from rich.console import Console

from orchestrator.matrix.cells import expand, group
from orchestrator.matrix.models import MatrixError
from orchestrator.matrix.validate import deferred_checks, parse_matrix_text
from orchestrator.report.console import matrix_table
from tests.helpers import ROOT

MATRICES = sorted((ROOT / "matrices").glob("*.yaml"))
CASES_PER_MATRIX = 375   # 3,000 cases in all
CASE_LIMIT_S = 2.0
PROBLEM_MAX_CHARS = 2000   # one problem line: its YAML path, what is wrong, what would be valid

VALUES = [None, True, False, 0, -1, 1, 2**31, 10**30, -10**30, 1.5, -0.0, float("nan"), float("inf"), "", "x",
          "a" * 5000, "../../etc/passwd", "/abs/path", "a/b", "..", "\x00\x01", "🙂" * 50, "${HOME}", "*", "&a",
          [], [None], [1, 2, 3], ["hf", "hf"], {}, {"a": 1}, {"": None}, [[[]]], {"x": {"y": {"z": [1]}}},
          "hf", "vllm", "llamacpp", "tiny", "builtin:tiny", "fp32", "q4_0", "default", "serve", "stream", "auto"]
TOKENS = [":", ": ", "- ", "-", "&a ", "*a", "*zz", "[", "]", "{", "}", "\t", "\n  ", "\n- ", "'", '"', "#", "!!int ",
          "!!python/object/apply:os.system ['true'] ", "<<: *a\n", "? ", "|\n", ">-\n", "%YAML 1.1\n", "---\n", "...\n",
          "~", "0x", "1e9999", ",", "\\", "\r"]


def nodes(data, path=()):
    """(path, node) of every node of the parsed matrix, the root included."""
    yield path, data
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else []
    for k, v in items:
        yield from nodes(v, (*path, k))


def at(data, path):
    for k in path:
        data = data[k]
    return data


def mutate_data(rng: random.Random, data):
    data = copy.deepcopy(data)
    for _ in range(rng.randint(1, 3)):
        every = list(nodes(data))
        path, node = rng.choice(every)
        op = rng.choice(["delete", "replace", "replace", "rename", "wrap", "unwrap", "repeat", "unknown", "graft"])
        if not path:   # the root: replaced whole, or a key added
            if op == "replace":
                return rng.choice(VALUES)
            op = "unknown"
        parent, key = (at(data, path[:-1]), path[-1]) if path else (None, None)
        if op == "delete":
            del parent[key]
        elif op == "replace":
            parent[key] = copy.deepcopy(rng.choice(VALUES))
        elif op == "graft":
            parent[key] = copy.deepcopy(rng.choice(every)[1])
        elif op == "rename" and isinstance(parent, dict) and isinstance(key, str) and key:
            i = rng.randrange(len(key))
            parent[key[:i] + rng.choice(["", "x", "_", key[i] * 2]) + key[i + 1:]] = parent.pop(key)
        elif op == "wrap":
            parent[key] = [node]
        elif op == "unwrap" and isinstance(node, list):
            parent[key] = node[0] if node else None
        elif op == "repeat" and isinstance(node, list):
            parent[key] = node * rng.randint(2, 20)
        elif op == "unknown":
            target = node if isinstance(node, dict) else data if isinstance(data, dict) else None
            if target is not None:
                target[rng.choice(["extra", "namez", "axis", "run", "meassure", "0", ""])] = rng.choice(VALUES)
    return data


def mutate_text(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 3)):
        op = rng.choice(["cut", "insert", "insert", "swap", "truncate"])
        i = rng.randrange(len(text) + 1)
        if op == "cut":
            text = text[:i] + text[i + rng.randint(1, 40):]
        elif op == "insert":
            text = text[:i] + rng.choice(TOKENS) + text[i:]
        elif op == "swap":
            lines = text.split("\n")
            a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[a], lines[b] = lines[b], lines[a]
            text = "\n".join(lines)
        else:
            text = text[:i]
    return text


def cases(path):
    text = path.read_text()
    data = yaml.safe_load(text)
    rng = random.Random(f"{path.name}-fuzz")
    for i in range(CASES_PER_MATRIX):
        if rng.random() < 0.25:
            yield i, mutate_text(rng, text)
        else:
            try:
                yield i, yaml.safe_dump(mutate_data(rng, data), allow_unicode=True, sort_keys=False)
            except yaml.YAMLError:   # a value safe_dump cannot write: the case is its text mutation instead
                yield i, mutate_text(rng, text)


def validate(text: str, source: str) -> None:
    """What `bench validate` does with a file's text (orchestrator/cli/running.py validate)."""
    m = parse_matrix_text(text, source)
    cells = expand(m)
    groups = group(cells)
    console = Console(file=io.StringIO(), width=180)
    console.print(matrix_table(f"{m.name}: {len(cells)} cells in {len(groups)} engine groups", cells))
    for line in deferred_checks(m):
        console.print(f"not checked here: {line}", highlight=False)


@pytest.mark.parametrize("path", MATRICES, ids=[p.stem for p in MATRICES])
def test_mutated_shipped_matrices_validate_or_fail_cleanly_and_quickly(path):
    assert MATRICES, "the shipped matrices are found"
    validate(path.read_text(), str(path))   # the shipped matrix itself is valid
    tracebacks, slow, long_messages, refused = [], [], [], 0
    started = time.monotonic()
    for i, text in cases(path):
        t = time.monotonic()
        try:
            validate(text, f"{path.name}#{i}")
        except MatrixError as e:
            refused += 1
            long_messages += [(i, p[:200]) for p in e.problems if len(p) > PROBLEM_MAX_CHARS]
        except Exception:
            tracebacks.append((i, traceback.format_exc()[-1500:], text[:300]))
        if time.monotonic() - t > CASE_LIMIT_S:
            slow.append((i, round(time.monotonic() - t, 2), text[:300]))
    assert not tracebacks, f"{len(tracebacks)} cases raised something other than MatrixError; first: {tracebacks[0]}"
    assert not slow, f"{len(slow)} cases over {CASE_LIMIT_S}s; first: {slow[0]}"
    assert not long_messages, f"problem lines over {PROBLEM_MAX_CHARS} characters: {long_messages[:3]}"
    assert refused > CASES_PER_MATRIX // 3, "most mutations break the matrix: the cases reach validation"
    assert time.monotonic() - started < 120, "bounded total time"


TINY = "name: x\nmodels: {t: builtin:tiny}\n"
# (case, text, what the one problem line says): each class issue 41 found accepted or ending in a traceback
HOSTILE = [
    ("duplicate top-level key", TINY + "axes: {framework: [hf], model: [t]}\naxes: {framework: [hf], model: [t]}\n",
     "line 4, column 1: key 'axes' given twice"),
    ("duplicate nested key", "name: x\nmodels: {t: {source: builtin:tiny, source: ../../etc}}\naxes: {framework: [hf], model: [t]}\n",
     "key 'source' given twice"),
    ("batch 10^9", TINY + "axes: {framework: [hf], model: [t], batch_size: [1000000000]}\n", "axes.batch_size[0]"),
    ("batch 10^32", TINY + "axes: {framework: [hf], model: [t], batch_size: [100000000000000000000000000000000]}\n",
     "out of range"),
    ("true as a batch size", TINY + "axes: {framework: [hf], model: [t], batch_size: [true]}\n",
     "axes.batch_size[0]: Input should be a valid integer"),
    ("input_len 10^9", TINY + "axes: {framework: [hf], model: [t], input_len: [1000000000]}\n", "axes.input_len[0]"),
    ("repeats 10^7", TINY + "axes: {framework: [hf], model: [t]}\nmeasure: {repeats: 10000000}\n", "measure.repeats"),
    ("seed -1", TINY + "axes: {framework: [hf], model: [t]}\nworkload: {seed: -1}\n", "workload.seed"),
    ("10^9 cells", TINY + "axes: {framework: [hf], model: [t], batch_size: [%s], input_len: [%s], output_len: [%s]}\n"
     % tuple(", ".join(str(i) for i in range(1, 1001)) for _ in range(3)), "1,000,000,000 combinations"),
    ("5000-deep nesting", "a: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper than"),
    ("syntax error", TINY + "axes: [1, 2\n  model: [t\n", "(yaml) line 4, column 8: expected ',' or ']'"),
]


@pytest.mark.parametrize("case,text,expected", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_matrices_are_refused_in_one_line_quickly(case, text, expected):
    started = time.monotonic()
    with pytest.raises(MatrixError) as err:
        validate(text, case)
    assert time.monotonic() - started < 5
    assert len(err.value.problems) == 1, err.value.problems
    line = err.value.problems[0]
    assert expected in line and "\n" not in line and "\\n" not in line and len(line) < 400, line


def test_hostile_files_are_refused_in_one_line(tmp_path):
    from orchestrator.matrix.validate import load_matrix
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"name: caf\xe9\n")
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)
    cases = [(bad, "line 1: byte 0xe9 at offset 9 is not UTF-8"), ("/dev/zero", "not a regular file"),
             (fifo, "not a regular file"), (tmp_path, "not a regular file"),
             (tmp_path / ("x" * 5000), "cannot open: File name too long")]
    for path, expected in cases:
        with pytest.raises(MatrixError) as err:
            load_matrix(path)
        assert [expected in p for p in err.value.problems] == [True], err.value.problems
        assert len(str(err.value).splitlines()) == 2   # the source, then the one problem



def test_local_paths_are_resolved_against_the_matrix_file_and_checked(tmp_path, monkeypatch):
    """run.python relative to the matrix's folder (made absolute); a folder that is no model (`../etc`), a relative path found nowhere, a device as a model or as
    scoring_text refused, each in one line naming its YAML path."""
    from orchestrator.matrix.validate import load_matrix
    monkeypatch.chdir(tmp_path)   # the working directory is not the matrix's folder
    sub = tmp_path / "matrices"
    (sub / "venv" / "bin").mkdir(parents=True)
    (sub / "venv" / "bin" / "python").symlink_to(sys.executable)
    head = "name: x\naxes: {framework: [hf], model: [t]}\n"
    good = sub / "good.yaml"
    good.write_text(head + "models: {t: builtin:tiny}\nrun: {python: {hf: venv/bin/python}}\n")
    assert load_matrix(good)[0].run.python["hf"] == str(sub / "venv" / "bin" / "python")
    bad = sub / "bad.yaml"
    (tmp_path / "etc").mkdir()   # a folder, not a model
    (tmp_path / "etc" / "passwd").write_text("root:x:0:0")
    bad.write_text(head + "models: {t: ../etc, u: {source: builtin:tiny, tokenizer: /dev/zero}}\n"
                   "measure: {scoring_text: /dev/zero}\nrun: {python: {hf: nowhere/bin/python}}\n")
    with pytest.raises(MatrixError) as err:
        load_matrix(bad)
    got = err.value.problems
    assert [p.split(":")[0] for p in got] == ["run.python.hf", "models.t.source", "models.u.tokenizer",
                                              "measure.scoring_text"], got
    assert "not a model folder" in got[1] and "not a regular file" in got[3], got
    bad.write_text(head + "models: {t: ../../nowhere}\n")
    with pytest.raises(MatrixError, match="models.t.source: '../../nowhere' not found"):
        load_matrix(bad)
