"""The local paths a matrix names, checked before anything starts (run.python also made absolute; model paths
and scoring_text are part of a cell's id, so they stay as written): a relative path is looked up against the
matrix file's folder, then the working directory (where docs/matrix.md's `.venvs/...` examples
live); run.python must be found; a model or tokenizer path that exists must be a model folder (config.json or
tokenizer_config.json) or a regular .gguf file; scoring_text and a quantization recipe must be regular files of
bounded size (no devices, pipes or /proc), a recipe then read into the matrix (recipes.py). An absolute path that exists nowhere here is left to the node (a cluster's own paths); a
relative one is refused, as no node could find it either.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from orchestrator.matrix.models import Matrix, RecipeRef
from orchestrator.matrix.recipes import MAX_RECIPE_BYTES, load_into
from orchestrator.values import shown

MAX_TEXT_BYTES = 256 * 2**20   # measure.scoring_text: a corpus to cut prompts from, read whole by each engine
_MODEL_FILES = ("config.json", "tokenizer_config.json", "tokenizer.json", "params.json")


# a Hugging Face repo id, as huggingface_hub validates it: an optional namespace, a name, each 1-96 of [\w.-]
_HUB_ID = re.compile(r"^(?:[\w.-]{1,96}/)?[\w.-]{1,96}$")


def _is_local(p: str) -> bool:
    """A path rather than a hub id (`org/name`) or builtin: absolute, ~, or starting with ./ or ../"""
    return p.startswith(("/", "~", "./", "../")) or p in (".", "..")


def _find(p: str, base: Path) -> Path | None:
    """The first existing of `p` (user-expanded) itself if absolute, else against `base`, then the working dir."""
    path = Path(p).expanduser()
    tries = [path] if path.is_absolute() else [base / path, Path.cwd() / path]
    return next((Path(os.path.abspath(t)) for t in tries if os.path.lexists(t)), None)   # the link itself (a venv's)


def _model_problem(where: str, found: Path) -> str | None:
    try:
        st = found.stat()
    except OSError as err:
        return f"{where}: {shown(str(found))} cannot be read ({err.strerror})"
    if stat.S_ISDIR(st.st_mode):
        if any((found / f).is_file() for f in _MODEL_FILES):
            return None
        return (f"{where}: {shown(str(found))} is not a model folder (it has none of {', '.join(_MODEL_FILES)})")
    if stat.S_ISREG(st.st_mode) and found.suffix == ".gguf":
        return None
    return f"{where}: {shown(str(found))} is neither a model folder nor a regular .gguf file"


def _regular_file_problem(where: str, found: Path, limit: int) -> str | None:
    try:
        st = found.stat()
    except OSError as err:
        return f"{where}: {shown(str(found))} cannot be read ({err.strerror})"
    if not stat.S_ISREG(st.st_mode) or str(found).startswith(("/proc/", "/sys/", "/dev/")):
        return f"{where}: {shown(str(found))} is not a regular file (a device, pipe, folder or /proc file)"
    if st.st_size > limit:
        return f"{where}: {shown(str(found))} is {st.st_size:,} bytes; at most {limit:,}"
    return None


def local_path_problems(m: Matrix, base: Path) -> list[str]:
    """Checks the matrix's local paths against `base` (the matrix file's folder) and makes those found absolute
    in `m`; returns a `path: message` line for each that cannot be used."""
    problems: list[str] = []

    def missing(where: str, value: str) -> None:
        if not Path(value).expanduser().is_absolute():   # no node could find it either (another working dir)
            problems.append(f"{where}: {shown(value)} not found (a relative path is looked up in the matrix's "
                            f"folder {shown(str(base))}, then the working directory)")

    for fw, python in list(m.run.python.items()):
        found = _find(python, base)
        if found is not None:
            m.run.python[fw] = str(found)
            if not (found.is_file() and os.access(found, os.X_OK)) or str(found).startswith(("/dev/", "/proc/")):
                problems.append(f"run.python.{fw}: {shown(str(found))} is not an executable file (a Python "
                                "interpreter, such as an environment's bin/python)")
        else:
            missing(f"run.python.{fw}", python)
    # model paths and scoring_text are part of a cell's id: checked where found, not rewritten
    for name in m.models:
        entry = m.model_entry(name)
        for key in ("source", "tokenizer"):
            value = getattr(entry, key, None)
            if not value or value.startswith("builtin:"):
                continue
            if not _is_local(value):   # a hub model, fetched on the node: its id must be one the hub can have
                if not _HUB_ID.match(value) and _find(value, base) is None:
                    problems.append(f"models.{name}.{key}: {shown(value)} is no local path (none found) and no "
                                    "Hugging Face repo id (org/name, each part 1-96 of letters, digits, - _ .)")
                continue
            found = _find(value, base)
            if found is None:
                missing(f"models.{name}.{key}", value)
            else:
                problems += filter(None, [_model_problem(f"models.{name}.{key}", found)])
    text = m.measure.scoring_text
    if text != "builtin":
        found = _find(text, base)
        if found is None:
            missing("measure.scoring_text", text)
        else:
            problems += filter(None, [_regular_file_problem("measure.scoring_text", found, MAX_TEXT_BYTES)])
    for i, q in enumerate(m.axes.quantization):   # a recipe: found, checked and read into the matrix
        if not isinstance(q, RecipeRef):
            continue
        where = f"axes.quantization[{i}].recipe"
        found = _find(q.recipe, base)
        if found is None:
            problems.append(f"{where}: {shown(q.recipe)} not found (a relative path is looked up in the matrix's "
                            f"folder {shown(str(base))}, then the working directory)")
            continue
        problem = _regular_file_problem(where, found, MAX_RECIPE_BYTES) or load_into(q, found)
        if problem:
            problems.append(problem if problem.startswith(where) else f"{where}: {problem}")
    if any(isinstance(q, RecipeRef) for q in m.axes.quantization) and not problems:
        problems += _recipe_rule_problems(m)
    return problems


def _recipe_rule_problems(m: Matrix) -> list[str]:
    """include/exclude rules name a recipe by its short form, known once the files are read: each must be one."""
    labels = [q.label for q in m.axes.quantization if isinstance(q, RecipeRef)]
    out = []
    for section in ("include", "exclude"):
        for i, rule in enumerate(getattr(m, section)):
            wants = rule.get("quantization")
            for w in wants if isinstance(wants, list) else [wants]:
                if isinstance(w, str) and w.startswith("recipe-") and w not in labels:
                    out.append(f"{section}[{i}].quantization: {shown(w)} names no recipe of axes.quantization "
                               f"(they are: {', '.join(labels)})")
    return out
