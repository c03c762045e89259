"""`bench explain RUN CELL --recipe --kl-budget B`: the smallest per-tensor mix of a llama.cpp cell's level whose
mean KL against fp32 stays within B, from the cell's sensitivity table (sensitivity.py, run first or reused).

The search is greedy over the sensitivities: groups ranked by KL per weight (a group's KL quantized alone, divided
by its F32 bytes), and candidate k keeps the k highest-ranked groups at a higher type (`keep`: q8_0 for a level
below q8_0, f16 for q8_0) and the rest at their type in the cell's file. Every candidate k = 0 (the cell's own
types) ... all is a probe cell (`tensor_types`), run in one round and measured, not predicted: the KL of a mix is
not the sum of its groups' (errors compound), and a candidate's bytes are its GGUF file's size as the row stores
it. The recipe is the smallest file among the candidates whose measured KL mean is within the budget.

Then the recipe runs as a normal cell beside llama.cpp's presets (q8_0, q6_k, q5_k_m, q4_k_m, q4_0), the run's
measure and tasks, each judged against the same configuration at fp32: bytes, KL, speed. The result says whether
the recipe is smaller than every preset that meets the budget, or that none of them is beaten. It is stored in
RUN/explain/CELL/recipe.json and recipe.parquet, and the recipe itself as a flag set a matrix can name again
(RUN/explain/CELL/recipe-flags.yaml: `flags: {llamacpp: {recipe: {tensor_types: ...}}}` at the cell's level).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import yaml
from pydantic import BaseModel, Field
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from adapters.base import normalize_quantization
from orchestrator.explain.sensitivity import ALL, fill, matrix_data, run_probes, run_sensitivity, sensitivity_path
from orchestrator.matrix.cells import expand
from orchestrator.store.explain_file import EXPLAIN_DIR
from orchestrator.values import finite

PRESETS = ("q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0")
CANDIDATES_DIR = "recipe-candidates"     # RUN/explain/<cell_id>/recipe-candidates/: the search's probe run
FINAL_DIR = "recipe-run"                 # RUN/explain/<cell_id>/recipe-run/: the recipe beside the presets, timed
RECIPE_FILE, RECIPE_TABLE, RECIPE_FLAGS = "recipe.json", "recipe.parquet", "recipe-flags.yaml"
RECIPE_SET = "recipe"                    # the recipe's flag-set name in recipe-run.yaml and recipe-flags.yaml


class Candidate(BaseModel):
    name: str                            # the flag set (k<N>: the N most sensitive groups kept) or a preset level
    quantization: str
    kept: list[str] = Field(default_factory=list)
    cell_id: str | None = None
    status: str = ""
    reason: str | None = None
    verdict: str | None = None
    file_bytes: int | None = None        # the GGUF the row ran (engine_args.gguf_file_size_bytes)
    kl_mean: float | None = None
    top1: float | None = None
    max_abs: float | None = None
    n_positions: int | None = None
    output_tok_s: float | None = None
    speedup: float | None = None         # against fp32, with its 95% interval (the judge's)
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    within_budget: bool = False


class RecipeResult(BaseModel):
    run: str
    cell_id: str
    quantization: str
    kl_budget: float
    keep: str
    ranking: list[str]                   # groups, most sensitive per weight first
    candidates: list[Candidate]          # the search's probes
    recipe: Candidate | None = None      # the chosen one, timed beside the presets (None: no candidate in budget)
    tensor_types: dict[str, str] = Field(default_factory=dict)
    presets: list[Candidate] = Field(default_factory=list)
    summary: str
    test: str = ("KL mean over the scoring positions against the same configuration at fp32 (orchestrator/judge); "
                 "speed-up against fp32 with the judge's 95% interval")
    wall_s: float = 0.0


def keep_type(level: str) -> str:
    return "f16" if level == "q8_0" else "q8_0"


def rank(groups) -> list:
    """The groups, most sensitive per weight first (KL alone / F32 bytes); groups without a KL last."""
    return sorted((g for g in groups if g.group != ALL),
                  key=lambda g: -(g.kl_mean / g.f32_bytes) if g.kl_mean is not None and g.f32_bytes else float("inf"))


def candidate_types(ranked: list, k: int, keep: str) -> dict[str, str]:
    """The k first groups at `keep`, the rest at their type in the cell's file, everything else F32."""
    return {**{g.pattern: (keep if i < k else g.type) for i, g in enumerate(ranked)}, ".": "f32"}


def file_sizes(run: Path) -> dict[str, int]:
    """Cell id -> the size of the GGUF it ran, from the stored rows' engine_args (the judge does not carry them)."""
    from orchestrator.store.run_store import RunStore

    out = {}
    for cid, args in RunStore(run).read_cells()[["cell_id", "engine_args"]].itertuples(index=False):
        args = json.loads(args) if isinstance(args, str) else (args or {})
        if finite(args.get("gguf_file_size_bytes")):
            out[cid] = int(args["gguf_file_size_bytes"])
    return out


def _row_facts(c: Candidate, judged: pd.DataFrame, sizes: dict[str, int]) -> None:
    fill(c, judged, ("kl_mean", "top1", "max_abs", "output_tok_s", "speedup", "speedup_lo", "speedup_hi"))
    c.file_bytes = sizes.get(c.cell_id or "")


def search_recipe(run_dir: Path, cell: dict[str, Any], config: str, budget: float, address: str | None,
                  console: Console, quiet: bool) -> RecipeResult:
    """The sensitivities (stored or run), the candidates (one round), the recipe timed beside the presets."""
    from orchestrator.store.run_store import RunStore, atomic_write_table, atomic_write_text

    started = time.monotonic()
    sens = run_sensitivity(run_dir, cell, config, address, console, quiet)
    m = RunStore(run_dir).read_manifest().matrix
    level, options = normalize_quantization(cell["quantization"]), m.engine_options(cell["framework"], cell["flags"])
    keep = keep_type(level)
    ranked = rank(sens.groups)
    folder = Path(run_dir) / EXPLAIN_DIR / cell["cell_id"]
    sets = {f"k{k}": {**options, "tensor_types": candidate_types(ranked, k, keep)} for k in range(len(ranked) + 1)}
    if not quiet:
        console.print(f"explain {cell['cell_id']} --recipe: {len(sets)} candidates ({len(ranked)} groups, kept at {keep})")
    parsed, judged = run_probes(folder, CANDIDATES_DIR, matrix_data(m, cell, options, sets), address, console)
    ids = {(c.flags, c.quantization): c.cell_id for c in expand(parsed)}
    sizes = file_sizes(folder / CANDIDATES_DIR)
    candidates = []
    for k, name in enumerate(sets):
        c = Candidate(name=name, quantization=level, kept=[g.group for g in ranked[:k]], cell_id=ids.get((name, level)))
        _row_facts(c, judged, sizes)
        c.within_budget = c.status == "ok" and c.kl_mean is not None and c.kl_mean <= budget
        candidates.append(c)
    fits = [c for c in candidates if c.within_budget and c.file_bytes]
    best = min(fits, key=lambda c: c.file_bytes) if fits else None
    chosen = sets[best.name]["tensor_types"] if best else {}
    # the recipe as a normal cell beside the presets (the run's measure and tasks), all against fp32
    final = matrix_data(m, cell, options, {RECIPE_SET: {**options, "tensor_types": chosen}} if best else {},
                        presets=PRESETS, timed=True)
    parsed, judged = run_probes(folder, FINAL_DIR, final, address, console)
    ids = {(c.flags, c.quantization): c.cell_id for c in expand(parsed)}
    sizes = file_sizes(folder / FINAL_DIR)
    timed = [Candidate(name=q, quantization=q, cell_id=ids.get((cell["flags"], q))) for q in PRESETS]
    recipe = Candidate(name=RECIPE_SET, quantization=level, kept=best.kept, cell_id=ids.get((RECIPE_SET, level))) if best else None
    for c in [*timed, *([recipe] if recipe else [])]:
        _row_facts(c, judged, sizes)
        c.within_budget = c.status == "ok" and c.kl_mean is not None and c.kl_mean <= budget
    result = RecipeResult(run=str(run_dir), cell_id=cell["cell_id"], quantization=level, kl_budget=budget, keep=keep,
                          ranking=[g.group for g in ranked], candidates=candidates, recipe=recipe, tensor_types=chosen,
                          presets=timed, summary=summary(recipe, timed, budget), wall_s=round(time.monotonic() - started, 1))
    atomic_write_text(sensitivity_path(run_dir, cell["cell_id"], RECIPE_FILE), result.model_dump_json(indent=2) + "\n")
    rows = [{"role": "candidate", **c.model_dump()} for c in candidates] + \
           [{"role": "timed", **c.model_dump()} for c in [*timed, *([recipe] if recipe else [])]]
    atomic_write_table(pa.Table.from_pandas(pd.DataFrame(rows), preserve_index=False),
                       sensitivity_path(run_dir, cell["cell_id"], RECIPE_TABLE))
    if best:
        atomic_write_text(folder / RECIPE_FLAGS, "# `bench explain --recipe`'s recipe: name this flag set on a "
                          f"llamacpp cell at quantization {level}\n"
                          + yaml.safe_dump({"flags": {"llamacpp": {RECIPE_SET: {**options, "tensor_types": chosen}}}},
                                           sort_keys=False))
    return result


def summary(recipe: Candidate | None, presets: list[Candidate], budget: float) -> str:
    if recipe is None:
        return f"no candidate's KL mean is within {budget:g}: even the most kept mix is over the budget"
    if not (recipe.within_budget and recipe.file_bytes):
        return (f"the recipe met {budget:g} in the search but not as a timed cell (KL mean {recipe.kl_mean}): "
                "the KL moved between runs by more than the margin")
    meeting = [p for p in presets if p.within_budget and p.file_bytes]
    smaller = [p for p in meeting if p.file_bytes <= recipe.file_bytes]
    head = f"recipe: {recipe.file_bytes} bytes, KL mean {recipe.kl_mean:.3g} within {budget:g}"
    if not meeting:
        return head + "; no preset meets the budget"
    if smaller:
        return head + "; none beats the presets: " + ", ".join(f"{p.name} ({p.file_bytes} bytes, KL {p.kl_mean:.3g})"
                                                               for p in smaller) + " meets it at that size or less"
    return head + "; smaller than every preset that meets it: " + ", ".join(
        f"{p.name} ({p.file_bytes} bytes, KL {p.kl_mean:.3g})" for p in meeting)


def recipe_table(result: RecipeResult) -> Table:
    t = Table(title=f"recipe {result.cell_id}: {result.quantization}, groups kept at {result.keep}, KL budget "
              f"{result.kl_budget:g}, against fp32", title_justify="left")
    for col in ("cell", "kept", "bytes", "kl_mean", "top1", "tok/s", "speed-up (95% CI)", "in budget"):
        t.add_column(col, justify="left" if col in ("cell", "kept", "in budget") else "right")
    f = lambda v: f"{v:.3g}" if v is not None else "-"
    for c in [*([result.recipe] if result.recipe else []), *result.presets]:
        ci = f"{f(c.speedup)} ({f(c.speedup_lo)}-{f(c.speedup_hi)})" if c.speedup is not None else "-"
        t.add_row(escape(c.name if c.name in PRESETS else f"{c.name} ({result.quantization})"), str(len(c.kept)),
                  str(c.file_bytes or "-"), f(c.kl_mean), f(c.top1), f(c.output_tok_s), ci,
                  "yes" if c.within_budget else ("no" if c.status == "ok" else escape(f"{c.status}: {c.reason or ''}")))
    return t


def print_recipe(result: RecipeResult, console: Console) -> None:
    console.print(recipe_table(result))
    console.print(f"  search: {len(result.candidates)} candidates, "
                  + ", ".join(f"{c.name} {c.file_bytes or '-'} B KL {c.kl_mean:.3g}" if c.kl_mean is not None else
                              f"{c.name} {c.status}" for c in result.candidates))
    console.print(f"{escape(result.summary)}; {result.wall_s:.0f} s; the result: "
                  f"{escape(str(sensitivity_path(result.run, result.cell_id, RECIPE_FILE)))}")
