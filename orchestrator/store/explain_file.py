"""What `bench explain` stores: per explained cell, RUN/explain/<cell_id>/explain.json (beside the probes' own run
dir in the same folder), typed here so the report reads it without the search (orchestrator/explain/ writes it)."""

from __future__ import annotations

import json

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

EXPLAIN_DIR = "explain"          # RUN/explain/<cell_id>/: the probes' run dir and explain.json
EXPLAIN_FILE = "explain.json"

# outcome -> what it means; the sentence each result's `summary` starts from
Outcome = Literal[
    "culprit",       # the smallest set of suspects whose move restores the goal verdict
    "engine",        # every suspect moved together still misses it: the engine itself differs
    "not-reproduced",  # the cell as it is already reaches the goal in the probe run
    "no-suspects",   # nothing of the cell differs from the baseline's side
    "failed",        # the probes could not decide (the cell as it is, or every move, did not run)
    "budget",        # the probe budget ran out before the search ended: `culprits` is the best found so far
]


class Suspect(BaseModel):
    """One change the search may make: an adapter's NumericsFlag, batch size 1, the quantization, or (for a cell
    of an env pair) the engine environment."""

    name: str
    kind: Literal["flag", "batch_size", "quantization", "environment"]
    cell_value: dict[str, Any] = Field(default_factory=dict)      # field -> the cell's value (None: the default)
    moved_value: dict[str, Any] = Field(default_factory=dict)     # field -> the value a probe moves it to
    why: str = ""


class Probe(BaseModel):
    """One probe: the cell's configuration with `moved` on the baseline's side, a stored cell of the probe run."""

    index: int                       # 0: the cell as it is; then in the order run
    round: int                       # probes of one round ran together (one `bench run` of the probe matrix)
    phase: Literal["as-is", "all", "one-at-a-time", "ddmin"]
    moved: list[str]                 # suspect names
    cell_id: str | None = None
    flags: str = ""                  # the probe's flag-set name in probes.yaml
    quantization: str = ""
    batch_size: int = 0
    status: str = ""                 # the row's status (ok, crashed, timeout, unsupported, ...)
    reason: str | None = None        # why, where the probe did not run
    verdict: str | None = None       # its verdict against the baseline (None where it did not run)
    verdict_reason: str | None = None
    max_abs: float | None = None
    kl_mean: float | None = None
    top1: float | None = None
    restores: bool = False           # reached the goal verdict
    reused: bool = False             # stored by an earlier `bench explain` of this cell: not run again
    round_wall_s: float | None = None  # the wall time of its round (every probe of the round, and the baseline's cells)


class ExplainResult(BaseModel):
    run: str                         # the explained run dir
    cell_id: str
    config: str                      # framework/model/quantization/flags/batch, as said in the output
    framework: str
    verdict: str | None              # the cell's verdict in the run
    verdict_reason: str | None = None
    baseline_cell_id: str | None = None
    baseline_config: str = ""
    goal: list[str] = Field(default_factory=lambda: ["identical", "lossless"])
    tolerances: dict[str, Any] = Field(default_factory=dict)   # what the cell and its probes were judged with
    suspects: list[Suspect] = Field(default_factory=list)
    skipped: dict[str, str] = Field(default_factory=dict)   # suspect name -> why it is not probed
    probes: list[Probe] = Field(default_factory=list)
    outcome: Outcome
    culprits: list[list[str]] = Field(default_factory=list)   # each a smallest set found that restores the goal
    summary: str                     # one sentence: what the search found
    probe_run: str                   # the probes' run dir (`bench compare` it for every column); stored relative to RUN
    wall_s: float = 0.0              # the whole search, probes and baseline re-runs included
    environment_note: str = ("the environment is not a suspect yet: for an env pair the search would first move "
                             "the cell to the baseline's environment (the env axis), then search the flags")

    @property
    def n_probes(self) -> int:
        return len(self.probes)


def explain_path(run_dir: str | Path, cell_id: str) -> Path:
    return Path(run_dir) / EXPLAIN_DIR / cell_id / EXPLAIN_FILE


# the fields of explain's results that hold a path: stored relative to the run folder (the run itself by its name);
# NESTED_PATHS: (field, key) of a path inside a field's object (recipe.json's imatrix facts)
PATH_FIELDS = ("run", "probe_run", "recipe_file")
NESTED_PATHS = (("imatrix", "path"),)


def portable_json(result: BaseModel, run_dir: str | Path) -> str:
    """A result of `bench explain` as stored: its paths inside the run folder relative to it, the run folder itself by
    its name, so no machine path is kept in the results (a path outside the run folder, none today, stays)."""
    data = result.model_dump(mode="json")
    root = Path(run_dir).resolve()

    def stored(value):
        if not (isinstance(value, str) and value):
            return value
        p = Path(value).resolve()
        return root.name if p == root else str(p.relative_to(root)) if p.is_relative_to(root) else value

    for key in PATH_FIELDS:
        if key in data:
            data[key] = stored(data[key])
    for key, inner in NESTED_PATHS:
        if isinstance(data.get(key), dict) and inner in data[key]:
            data[key][inner] = stored(data[key][inner])
    return json.dumps(data, indent=2) + "\n"


def write_result(result: ExplainResult, path: Path, run_dir: str | Path) -> None:
    from orchestrator.store.run_store import atomic_write_text

    atomic_write_text(path, portable_json(result, run_dir))


def read_results(run_dir: str | Path) -> tuple[list[ExplainResult], list[str]]:
    """Every stored culprit search of a run, by cell id, and a line per file that could not be read (said in
    the report, never guessed at)."""
    out, problems = [], []
    for f in sorted((Path(run_dir) / EXPLAIN_DIR).glob(f"*/{EXPLAIN_FILE}")):
        try:
            out.append(ExplainResult.model_validate_json(f.read_text()))
        except (OSError, ValueError) as e:
            problems.append(f"{f}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    return out, problems
