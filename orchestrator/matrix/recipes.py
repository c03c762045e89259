"""A per-tensor quantization recipe as a matrix names it (`quantization: [q8_0, {recipe: path/to/recipe.yaml}]`):
the YAML file `bench explain --recipe` writes (RecipeFile), read when the matrix is loaded (paths.py finds it
like the matrix's other paths and checks it is a regular file of bounded size), its content copied into the
matrix's RecipeRef (so the run's manifest holds what ran), and the short form cells and rows name it by.

A recipe cell is the base level's cell with the recipe's `tensor_types` as the llama.cpp option of that name
(adapters/engines/llamacpp/tensor_mix.py): the same level and overrides give the same cached GGUF, byte for
byte. The file's sha256 is part of the cell's config, so an edited file is a different cell. Engines without a
`tensor_types` option run no recipe: preflight says so (orchestrator/execution/engine_child/spec.py).

A recipe made with an importance matrix (`bench explain --recipe --imatrix`) names its file (`imatrix`, relative
to the recipe's folder: imatrix.npz beside it) and the file's sha256 (`imatrix_sha256`); loading checks both and
fills the ref's `imatrix` with the file's path, which the cell passes as the llama.cpp option `imatrix`, so the
recipe runs the same bytes as the search's winner. Copy the two files together.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from adapters.base import normalize_quantization
from orchestrator.matrix.models import RecipeRef
from orchestrator.values import shown

MAX_RECIPE_BYTES = 2**20            # a recipe is a few KB: one override per tensor group
MAX_IMATRIX_BYTES = 2**30           # an imatrix is a float per input column per weight: megabytes for a 70B model
RECIPE_BASES = ("q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0")   # llama.cpp reads overrides over a quantized ftype only
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class Provenance(BaseModel):
    """Where a recipe came from (no machine paths): the search's run, cell and budget, and what it measured."""

    model_config = ConfigDict(extra="allow")
    source_run: str | None = None       # the run id (not its folder)
    cell: str | None = None             # the explained cell's id
    kl_budget: float | None = None
    kl_mean: float | None = None
    kl_lo: float | None = None          # the KL mean's 95% interval (orchestrator/judge/intervals.py)
    kl_hi: float | None = None
    kl_interval: str | None = None      # how the interval was made
    n_positions: int | None = None
    file_bytes: int | None = None
    gguf_sha256: str | None = None
    llama_cpp_python: str | None = None


class RecipeFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, description="The short name cells show (recipe-<name>); default: the digest's first 8")
    base: str = Field(description="The llama.cpp level whose file type the overrides apply over")
    tensor_types: dict[str, str] = Field(min_length=1, description="regex on tensor names -> ggml type, first match wins")
    imatrix: str | None = Field(None, description="The importance matrix the file was quantized with (relative: to the "
                                "recipe's folder), given to llama.cpp's quantizer with the overrides")
    imatrix_sha256: str | None = Field(None, description="The imatrix file's sha256 (checked when loaded)")
    provenance: Provenance = Field(default_factory=Provenance)


def quant_label(value: str | RecipeRef) -> str:
    """A quantization axis value as a cell names it: a level normalized, a recipe as recipe-<name>."""
    return value.label if isinstance(value, RecipeRef) else normalize_quantization(str(value))


def parse_recipe(data: Any) -> RecipeFile:
    """A recipe's YAML data, checked: ValueError with one line where it is not one."""
    try:
        r = RecipeFile.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        raise ValueError(f"{'.'.join(map(str, first['loc'])) or '(top level)'}: {first['msg']}") from None
    if r.base not in RECIPE_BASES:
        raise ValueError(f"base: {shown(r.base)} is not a level llama.cpp applies overrides over ({', '.join(RECIPE_BASES)})")
    if (r.imatrix is None) != (r.imatrix_sha256 is None):
        raise ValueError("imatrix and imatrix_sha256 come together (the file and its sha256)")
    if r.name is not None and not _NAME.match(r.name):
        raise ValueError(f"name: {shown(r.name)} must be 1-64 of letters, digits, - _ . (it names cells)")
    from adapters import ADAPTERS

    try:   # the engine's own check of the overrides (regexes compile, types it can write)
        ADAPTERS["llamacpp"].Options(tensor_types=r.tensor_types)
    except ValidationError as err:
        raise ValueError(err.errors()[0]["msg"].removeprefix("Value error, ")) from None
    return r


def load_into(ref: RecipeRef, found: Path) -> str | None:
    """Read the recipe file at `found` into `ref` (name, base, tensor_types, digest); the problem, one line, if any."""
    raw = found.read_bytes()
    try:
        data = yaml.safe_load(raw.decode("utf-8"))
        r = parse_recipe(data)
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        return f"{shown(str(found))} is not YAML ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
    except ValueError as err:
        return f"{shown(str(found))}: {err}"
    digest = hashlib.sha256(raw).hexdigest()
    if ref.digest is not None and ref.digest != digest:
        return f"{shown(str(found))} changed since this matrix named it (sha256 {digest[:8]}, not {ref.digest[:8]})"
    imatrix = None
    if r.imatrix is not None:
        imatrix = found.parent / Path(r.imatrix).expanduser()
        problem = _imatrix_problem(imatrix, r.imatrix_sha256)
        if problem:
            return f"{shown(str(found))}: imatrix: {problem}"
    ref.name, ref.base, ref.tensor_types, ref.digest = r.name or digest[:8], r.base, dict(r.tensor_types), digest
    ref.imatrix = str(imatrix) if imatrix is not None else None
    return None


def _imatrix_problem(path: Path, sha256: str | None) -> str | None:
    """Why the recipe's imatrix file cannot be used (missing, not a regular file, too large, another sha256)."""
    import stat

    try:
        st = path.stat()
    except OSError as err:
        return f"{shown(str(path))} cannot be read ({err.strerror}): copy it beside the recipe"
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_IMATRIX_BYTES:
        return f"{shown(str(path))} is not a regular file of at most {MAX_IMATRIX_BYTES} bytes"
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    if digest != sha256:
        return f"{shown(str(path))} has sha256 {digest[:8]}, not the recipe's {str(sha256)[:8]}"
    return None


def write_recipe(recipe: RecipeFile) -> str:
    """A recipe as the YAML text a matrix names (what load_into reads back)."""
    head = ("# a per-tensor quantization recipe (bench explain --recipe): name it in a matrix as\n"
            "#   quantization: [{recipe: <this file>}]   (llamacpp cells)\n")
    return head + yaml.safe_dump(recipe.model_dump(exclude_none=True), sort_keys=False)
