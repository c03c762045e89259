"""`bench explain RUN CELL --recipe --kl-budget B`: the smallest per-tensor mix of a llama.cpp cell's level whose
mean KL against fp32 stays within B, from the cell's sensitivity table (sensitivity.py, run first or reused).

The search is greedy over the sensitivities: groups ranked by KL per weight (a group's KL quantized alone, divided
by its F32 bytes), and candidate k keeps the k highest-ranked groups at a higher type (`keep`: q8_0 for a level
below q8_0, f16 for q8_0) and the rest at their type in the cell's file. Every candidate k = 0 (the cell's own
types) ... all is a probe cell (`tensor_types`), run in one round and measured, not predicted: the KL of a mix is
not the sum of its groups' (errors compound), and a candidate's bytes are its GGUF file's size as the row stores
it. Each KL mean comes with its 95% interval over the scoring prompts (orchestrator/judge/analysis.py
kl_intervals); a candidate is within the budget where the interval's upper end is, and "may exceed" it where only
the mean is. The recipe is the smallest candidate within the budget (else the smallest whose mean is, said so).

Then the recipe runs as a normal cell beside llama.cpp's presets (q8_0, q6_k, q5_k_m, q4_k_m, q4_0), the run's
measure and tasks, each judged against the same configuration at fp32: bytes, KL with its interval, speed. The
result says whether the recipe is smaller than every preset within the budget, or that none of them is beaten.
It is stored in RUN/explain/CELL/recipe.json and recipe.parquet; the recipe itself as RUN/explain/CELL/recipe.yaml
(orchestrator/matrix/recipes.py: `quantization: [{recipe: path}]` in a matrix runs the same GGUF bytes), and as a
flag set (recipe-flags.yaml: `flags: {llamacpp: {recipe: {tensor_types: ...}}}` at the cell's level).

With `imatrix` (`--imatrix`): first an importance matrix from the run's own scoring prompts (the same token ids the
cells were scored on) run through the model's F32 GGUF (the llamacpp adapter's importance_matrix,
adapters/engines/llamacpp/imatrix.py), stored as RUN/explain/CELL/imatrix.npz (+ .json: its facts) and reused
when present; every candidate and every preset is then quantized with it (the llama.cpp option `imatrix`), so
the comparison is between files made the same way. The sensitivities that rank the groups stay those without
it. Those runs go to recipe-candidates-imatrix/ and recipe-run-imatrix/; recipe.json (the latest search) and
recipe.yaml's provenance say the imatrix was used, and recipe.yaml names the file (imatrix.npz beside it, with its
sha256: orchestrator/matrix/recipes.py), as recipe-flags.yaml's flag set does: either runs the same bytes.
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
from orchestrator.execution.engine_child.rows import local_path
from orchestrator.matrix.cells import expand
from orchestrator.matrix.recipes import Provenance, RecipeFile, write_recipe
from orchestrator.store.explain_file import EXPLAIN_DIR, portable_json
from orchestrator.values import finite

PRESETS = ("q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0")
CANDIDATES_DIR = "recipe-candidates"     # RUN/explain/<cell_id>/recipe-candidates/: the search's probe run
FINAL_DIR = "recipe-run"                 # RUN/explain/<cell_id>/recipe-run/: the recipe beside the presets, timed
RECIPE_FILE, RECIPE_TABLE, RECIPE_FLAGS = "recipe.json", "recipe.parquet", "recipe-flags.yaml"
RECIPE_SET = "recipe"                    # the recipe's flag-set name in recipe-run.yaml and recipe-flags.yaml
RECIPE_YAML = "recipe.yaml"              # the recipe a matrix names: quantization: [{recipe: .../recipe.yaml}]
IMATRIX_FILE = "imatrix.npz"             # RUN/explain/<cell_id>/imatrix.npz: --imatrix's importance matrix
IMATRIX_SET = "imatrix"                  # the presets' flag set with --imatrix: the cell's options and the imatrix
IMATRIX_SUFFIX = "-imatrix"              # the probe run dirs of a search with the imatrix


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
    kl_lo: float | None = None           # the KL mean's 95% interval over the scoring prompts (judge.analysis.kl_intervals)
    kl_hi: float | None = None
    n_prompts: int | None = None
    top1: float | None = None
    max_abs: float | None = None
    n_positions: int | None = None
    output_tok_s: float | None = None
    speedup: float | None = None         # against fp32, with its 95% interval (the judge's)
    speedup_lo: float | None = None
    speedup_hi: float | None = None
    within_budget: bool = False          # the KL interval's upper bound is within the budget
    mean_within: bool = False            # the KL mean is (the interval may still reach past it)
    gguf_sha256: str | None = None       # the timed cells' GGUF, hashed (a recipe named by a matrix runs these bytes)


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
    recipe_file: str | None = None       # RUN/explain/CELL/recipe.yaml: the recipe a matrix names ({recipe: path})
    kl_interval: str | None = None       # how the KL intervals were made
    imatrix: dict[str, Any] | None = None  # --imatrix: its file, digest, prompts, positions, weights (None: not used)
    test: str = ("KL mean over the scoring positions against the same configuration at fp32 (orchestrator/judge), "
                 "with its 95% interval over the scoring prompts; 'within budget' where the interval's upper bound "
                 "is; speed-up against fp32 with the judge's 95% interval")
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


def gguf_files(run: Path) -> dict[str, tuple[int, str]]:
    """Cell id -> (size, path) of the GGUF it ran, from the stored rows' engine_args (the judge does not carry them)."""
    from orchestrator.store.run_store import RunStore

    out = {}
    for cid, args in RunStore(run).read_cells()[["cell_id", "engine_args"]].itertuples(index=False):
        args = json.loads(args) if isinstance(args, str) else (args or {})
        if finite(args.get("gguf_file_size_bytes")):
            out[cid] = (int(args["gguf_file_size_bytes"]), str(args.get("gguf_path") or ""))
    return out


def sha256_file(path: str) -> str | None:
    """The file's sha256 (store.integrity.file_digest); `path` as a row stores it (rows.local_path). None where it is
    not here."""
    from orchestrator.store.integrity import file_digest

    found = local_path(path).resolve() if path else None   # resolved: a cache's link is read as its file
    return file_digest(found) if found is not None and found.is_file() else None


def _row_facts(cands: list[Candidate], judged: pd.DataFrame, files: dict[str, tuple[int, str]], run: Path,
               budget: float, digest: bool = False) -> None:
    """Each candidate's row (status, KL, speed), its file's size, its KL interval (every candidate's in one read of
    the run) and whether it is within budget."""
    from orchestrator.judge.analysis import kl_intervals

    bases = {}
    for c in cands:
        fill(c, judged, ("kl_mean", "top1", "max_abs", "output_tok_s", "speedup", "speedup_lo", "speedup_hi"))
        base = judged.loc[c.cell_id].get("baseline_cell_id") if c.cell_id in judged.index else None
        if c.status == "ok" and isinstance(base, str):
            bases[c.cell_id] = base
    intervals = kl_intervals(run, bases) if bases else {}
    for c in cands:
        size, path = files.get(c.cell_id or "", (None, ""))
        c.file_bytes = size
        iv = intervals.get(c.cell_id or "")
        if iv:
            c.kl_lo, c.kl_hi, c.n_prompts = iv["kl_lo"], iv["kl_hi"], iv["n_prompts"]
        c.mean_within = c.status == "ok" and c.kl_mean is not None and c.kl_mean <= budget
        c.within_budget = c.mean_within and c.kl_hi is not None and c.kl_hi <= budget
        if digest:
            c.gguf_sha256 = sha256_file(path)


def kl_text(c: Candidate) -> str:
    """'KL 0.0029 [0.0026, 0.0032]' (the interval '[no interval: 1 prompt(s)]' where there is none)."""
    if c.kl_mean is None:
        return "KL -"
    iv = f"[{c.kl_lo:.2g}, {c.kl_hi:.2g}]" if c.kl_lo is not None and c.kl_hi is not None else \
        f"[no interval: {c.n_prompts or 0} prompt(s)]"
    return f"KL {c.kl_mean:.2g} {iv}"


def budget_text(c: Candidate, budget: float) -> str:
    """Whether `c` is within `budget`, read from its interval's upper bound, with the margin where it is not."""
    if c.status != "ok" or c.kl_mean is None:
        return f"{c.status}: {c.reason or 'no KL'}"
    if c.within_budget:
        return f"{kl_text(c)}: within {budget:g}"
    if c.mean_within:
        return f"{kl_text(c)}: may exceed {budget:g}"
    return f"{kl_text(c)}: over {budget:g}"


def run_imatrix(m, cell: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The importance matrix from the run's scoring prompts (stored: reused), its facts with `path`; ValueError
    (one line) where the engine cannot make one."""
    from adapters import ADAPTERS
    from adapters.base import Unsupported
    from orchestrator.execution.engine_child.prompts import Tokenizer, scoring_prompts
    from orchestrator.execution.engine_child.spec import resolve_source
    from orchestrator.execution.runner import cache_root

    path = folder / IMATRIX_FILE
    if path.is_file() and path.with_suffix(".json").is_file():
        return {**json.loads(path.with_suffix(".json").read_text()), "path": str(path), "reused": True}
    entry = m.model_entry(cell["model"])
    source = resolve_source(entry.source, str(cache_root()))
    tok = Tokenizer(resolve_source(entry.tokenizer or entry.source, str(cache_root())), entry.trust_remote_code)
    try:
        facts = ADAPTERS["llamacpp"].importance_matrix(source, scoring_prompts(m.measure, tok), str(path), str(cache_root()))
    except (Unsupported, ImportError) as err:   # ImportError: no llama-cpp-python beside the driver
        raise ValueError(f"--imatrix: {err}") from None
    return {**facts, "path": str(path), "reused": False}


def search_recipe(run_dir: Path, cell: dict[str, Any], config: str, budget: float, address: str | None,
                  console: Console, quiet: bool, imatrix: bool = False) -> RecipeResult:
    """The sensitivities (stored or run), the candidates (one round), the recipe timed beside the presets; with
    `imatrix`, every candidate and preset quantized with the importance matrix of the run's scoring prompts."""
    from orchestrator.store.run_store import RunStore, atomic_write_table, atomic_write_text

    started = time.monotonic()
    sens = run_sensitivity(run_dir, cell, config, address, console, quiet)
    m = RunStore(run_dir).read_manifest().matrix
    level, options = normalize_quantization(cell["quantization"]), m.engine_options(cell["framework"], cell["flags"])
    keep = keep_type(level)
    ranked = rank(sens.groups)
    folder = Path(run_dir) / EXPLAIN_DIR / cell["cell_id"]
    imx = run_imatrix(m, cell, folder) if imatrix else None
    cell_options = options                    # the fp32 reference's (an imatrix on fp32 is refused)
    if imx is not None:
        options = {**options, "imatrix": imx["path"]}
        if not quiet:
            console.print(f"explain {cell['cell_id']} --recipe --imatrix: {imx['weights']} weights from "
                          f"{imx['prompts']} scoring prompts ({imx['positions']} positions)"
                          + (", stored" if imx["reused"] else ""))
    cand_dir, final_dir = (CANDIDATES_DIR + IMATRIX_SUFFIX, FINAL_DIR + IMATRIX_SUFFIX) if imx else (CANDIDATES_DIR, FINAL_DIR)
    preset_set = (IMATRIX_SET, options) if imx else None
    preset_flags = IMATRIX_SET if imx else cell["flags"]
    sets = {f"k{k}": {**options, "tensor_types": candidate_types(ranked, k, keep)} for k in range(len(ranked) + 1)}
    if not quiet:
        console.print(f"explain {cell['cell_id']} --recipe: {len(sets)} candidates ({len(ranked)} groups, kept at {keep})")
    parsed, judged = run_probes(folder, cand_dir, matrix_data(m, cell, cell_options, sets), address, console)
    ids = {(c.flags, c.quantization): c.cell_id for c in expand(parsed)}
    files = gguf_files(folder / cand_dir)
    candidates = [Candidate(name=name, quantization=level, kept=[g.group for g in ranked[:k]],
                            cell_id=ids.get((name, level))) for k, name in enumerate(sets)]
    _row_facts(candidates, judged, files, folder / cand_dir, budget)
    # the smallest whose interval is within the budget; else the smallest whose mean is (said: may exceed)
    fits = [c for c in candidates if c.within_budget and c.file_bytes] or \
        [c for c in candidates if c.mean_within and c.file_bytes]
    best = min(fits, key=lambda c: c.file_bytes) if fits else None
    chosen = sets[best.name]["tensor_types"] if best else {}
    # the recipe as a normal cell beside the presets (the run's measure and tasks), all against fp32
    final = matrix_data(m, cell, cell_options, {RECIPE_SET: {**options, "tensor_types": chosen}} if best else {},
                        presets=PRESETS, timed=True, preset_set=preset_set)
    parsed, judged = run_probes(folder, final_dir, final, address, console)
    ids = {(c.flags, c.quantization): c.cell_id for c in expand(parsed)}
    files = gguf_files(folder / final_dir)
    timed = [Candidate(name=q, quantization=q, cell_id=ids.get((preset_flags, q))) for q in PRESETS]
    recipe = Candidate(name=RECIPE_SET, quantization=level, kept=best.kept, cell_id=ids.get((RECIPE_SET, level))) if best else None
    _row_facts([*timed, *([recipe] if recipe else [])], judged, files, folder / final_dir, budget, digest=True)
    from orchestrator.judge.analysis import KL_INTERVAL

    result = RecipeResult(run=str(run_dir), cell_id=cell["cell_id"], quantization=level, kl_budget=budget, keep=keep,
                          ranking=[g.group for g in ranked], candidates=candidates, recipe=recipe, tensor_types=chosen,
                          presets=timed, summary=summary(recipe, timed, budget), wall_s=round(time.monotonic() - started, 1),
                          kl_interval=KL_INTERVAL, imatrix=imx)
    if recipe is not None and recipe.status == "ok":
        result.recipe_file = str(folder / RECIPE_YAML)
        atomic_write_text(folder / RECIPE_YAML, recipe_yaml(result, run_dir))
    atomic_write_text(sensitivity_path(run_dir, cell["cell_id"], RECIPE_FILE), portable_json(result, run_dir))
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


def recipe_yaml(result: RecipeResult, run_dir: Path) -> str:
    """The recipe as the YAML a matrix names (orchestrator/matrix/recipes.py): base level, per-tensor types, and
    where it came from (the run's id, never its folder)."""
    import importlib.metadata

    r = result.recipe
    try:
        version = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        version = None
    prov = Provenance(source_run=_run_id(run_dir), cell=result.cell_id, kl_budget=result.kl_budget,
                      kl_mean=r.kl_mean, kl_lo=r.kl_lo, kl_hi=r.kl_hi, kl_interval=result.kl_interval,
                      n_positions=r.n_positions, file_bytes=r.file_bytes, gguf_sha256=r.gguf_sha256,
                      llama_cpp_python=version, within_budget=r.within_budget, kept_at=result.keep, kept=r.kept,
                      imatrix=imatrix_provenance(result.imatrix))
    budget = f"{result.kl_budget:g}"
    imx = result.imatrix and result.imatrix.get("path")
    return write_recipe(RecipeFile(name=f"{result.cell_id[:8]}-{result.quantization}-kl{budget}{'-im' if imx else ''}",
                                   base=result.quantization, tensor_types=result.tensor_types, provenance=prov,
                                   imatrix=IMATRIX_FILE if imx else None, imatrix_sha256=sha256_file(imx) if imx else None))


def imatrix_provenance(imx: dict[str, Any] | None) -> dict[str, Any] | None:
    """What recipe.yaml says of the imatrix (no machine path): None where the search used none."""
    if imx is None:
        return None
    return {"used": True, "file": IMATRIX_FILE, "sha256": imx.get("digest"), "from": "the run's scoring prompts",
            **{k: imx.get(k) for k in ("prompts", "positions", "weights", "statistic")},
            "note": "the GGUF (gguf_sha256) was quantized with it; a matrix naming this recipe gives it to the "
                    "quantizer too (the imatrix field: copy imatrix.npz beside the recipe)"}


def _run_id(run_dir: Path) -> str | None:
    from orchestrator.store.run_store import RunStore

    return RunStore(run_dir).read_manifest().run_id or None


def summary(recipe: Candidate | None, presets: list[Candidate], budget: float) -> str:
    """'within budget' where the KL interval's upper bound is; 'may exceed' where only the mean is."""
    if recipe is None:
        return f"no candidate's KL mean is within {budget:g}: even the most kept mix is over the budget"
    if not (recipe.mean_within and recipe.file_bytes):
        return (f"the recipe met {budget:g} in the search but not as a timed cell ({budget_text(recipe, budget)}): "
                "the KL moved between runs by more than the margin")
    meeting = [p for p in presets if p.within_budget and p.file_bytes]
    near = [p for p in presets if p.mean_within and not p.within_budget and p.file_bytes]
    smaller = [p for p in meeting if p.file_bytes <= recipe.file_bytes]
    head = f"recipe: {recipe.file_bytes} bytes, {budget_text(recipe, budget)}"
    tail = ("; " + ", ".join(f"{p.name} ({p.file_bytes} bytes, {budget_text(p, budget)})" for p in near)) if near else ""
    if not meeting:
        return head + "; no preset is within the budget (upper bound)" + tail
    if smaller:
        return head + "; none beats the presets: " + ", ".join(f"{p.name} ({p.file_bytes} bytes, {kl_text(p)})"
                                                               for p in smaller) + " is within it at that size or less" + tail
    if not recipe.within_budget:
        return head + "; smaller than every preset within it (upper bound): " + ", ".join(
            f"{p.name} ({p.file_bytes} bytes, {kl_text(p)})" for p in meeting) + tail
    return head + "; smaller than every preset that meets it: " + ", ".join(
        f"{p.name} ({p.file_bytes} bytes, {kl_text(p)})" for p in meeting) + tail


def recipe_table(result: RecipeResult) -> Table:
    t = Table(title=f"recipe {result.cell_id}: {result.quantization}, groups kept at {result.keep}, KL budget "
              f"{result.kl_budget:g}, against fp32", title_justify="left")
    for col in ("cell", "kept", "bytes", "KL mean [95% CI]", "top1", "tok/s", "speed-up (95% CI)", "budget"):
        t.add_column(col, justify="left" if col in ("cell", "kept", "in budget") else "right")
    f = lambda v: f"{v:.3g}" if v is not None else "-"
    for c in [*([result.recipe] if result.recipe else []), *result.presets]:
        ci = f"{f(c.speedup)} ({f(c.speedup_lo)}-{f(c.speedup_hi)})" if c.speedup is not None else "-"
        within = budget_text(c, result.kl_budget).rsplit(": ", 1)[-1] if c.status == "ok" else f"{c.status}: {c.reason or ''}"
        t.add_row(escape(c.name if c.name in PRESETS else f"{c.name} ({result.quantization})"), str(len(c.kept)),
                  str(c.file_bytes or "-"), escape(kl_text(c).removeprefix("KL ")), f(c.top1), f(c.output_tok_s), ci,
                  escape(within))
    return t


def print_recipe(result: RecipeResult, console: Console) -> None:
    console.print(recipe_table(result))
    if result.imatrix:
        im = result.imatrix
        console.print(f"  imatrix: used, from the run's {im.get('prompts')} scoring prompts ({im.get('positions')} "
                      f"positions, {im.get('weights')} weights, sha256 {str(im.get('digest'))[:12]}); the recipe, "
                      f"its candidates and the presets were all quantized with it: {escape(str(im.get('path')))}")
    console.print(f"  search: {len(result.candidates)} candidates, "
                  + ", ".join(f"{c.name} {c.file_bytes or '-'} B KL {c.kl_mean:.3g}" if c.kl_mean is not None else
                              f"{c.name} {c.status}" for c in result.candidates))
    console.print(f"{escape(result.summary)}; {result.wall_s:.0f} s; the result: "
                  f"{escape(str(sensitivity_path(result.run, result.cell_id, RECIPE_FILE)))}")
    if result.recipe_file:
        console.print("  ship it: in a matrix, " + escape(matrix_line(result.recipe_file))
                      + " (llamacpp cells; the path relative to the matrix file)")


def matrix_line(recipe_file: str) -> str:
    """The matrix line that names a written recipe."""
    return f"quantization: [{{recipe: {recipe_file}}}]"
