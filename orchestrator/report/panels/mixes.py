"""`bench explain --sensitivity` and `--recipe` in the report (both formats): per explained cell its tensor-group
table (each group quantized alone, KL and top-1 against fp32) and its recipe beside llama.cpp's presets (bytes, the
KL mean with its 95% interval over the scoring prompts, whether the interval's upper bound is within the budget,
speed). Read back from RUN/explain/<cell_id>/sensitivity.json and recipe.json as plain JSON (orchestrator/explain/
writes them); a cell explained otherwise says it has neither, and the command that makes them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.report.data import num
from orchestrator.store.explain_file import EXPLAIN_DIR

SENS_FILE, RECIPE_FILE = "sensitivity.json", "recipe.json"   # orchestrator/explain/sensitivity.py, recipe.py
TITLE = "Where the loss comes from: tensor groups and the recipe"
EXPLANATION = ("`bench explain --sensitivity` quantized each tensor group of a llama.cpp cell alone (everything else "
               "F32) and judged it against the same engine at fp32; `--recipe --kl-budget B` kept the groups with the "
               "most KL per weight at a higher type until the mix's KL was within B, then timed it beside llama.cpp's "
               "presets. 'within' means the KL mean's 95% interval over the scoring prompts (bootstrap) ends within "
               "the budget; 'may exceed': the mean is within it, the interval's upper end is not.")


@dataclass
class MixEntry:
    cell_id: str
    sensitivity: dict[str, Any] | None = None
    recipe: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)


def load_mixes(root: str | Path) -> list[MixEntry]:
    """One entry per explained cell (a folder under RUN/explain/), with what of the two it has."""
    folder = Path(root) / EXPLAIN_DIR
    out = []
    for cell in sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []:
        e = MixEntry(cell.name)
        for name, attr in ((SENS_FILE, "sensitivity"), (RECIPE_FILE, "recipe")):
            if (cell / name).is_file():
                try:
                    setattr(e, attr, json.loads((cell / name).read_text()))
                except (OSError, ValueError) as err:
                    e.problems.append(f"{cell.name}/{name}: {type(err).__name__}: {err}")
        out.append(e)
    return out


def none_line(e: MixEntry) -> str | None:
    """What an explained cell lacks, and how to make it; None where it has both."""
    lacks = [what for what, v in (("no sensitivity table", e.sensitivity), ("no recipe", e.recipe)) if v is None]
    if not lacks:
        return None
    return (f"{e.cell_id}: {' and '.join(lacks)} (llama.cpp quantized cells: bench explain RUN {e.cell_id[:8]} "
            "--sensitivity, or --recipe --kl-budget B)")


def sensitivity_heading(s: dict[str, Any]) -> str:
    return f"sensitivity of {s['cell_id']} ({s.get('config')}): one group at {s.get('quantization')}'s types, against {s.get('reference')}"


def sensitivity_columns() -> list:
    return [
        ("group", "group", lambda r: r["group"], lambda r: r["group"], ""),
        ("type", "type", lambda r: r.get("type"), lambda r: r.get("type") or "", ""),
        ("bytes", "bytes", lambda r: r.get("bytes"), lambda r: str(r.get("bytes") or "-"), "n"),
        ("kl", "kl_mean", lambda r: r.get("kl_mean"), lambda r: num(r.get("kl_mean"), ".3g"), "n"),
        ("top1", "top1", lambda r: r.get("top1"), lambda r: num(r.get("top1"), ".3g"), "n"),
        ("status", "status", lambda r: r.get("status"), lambda r: r.get("status") if r.get("status") == "ok"
         else f"{r.get('status')}: {r.get('reason') or ''}", ""),
    ]


def recipe_heading(r: dict[str, Any]) -> str:
    im = r.get("imatrix")
    used = (f", recipe and presets quantized with an imatrix of the run's {im.get('prompts')} scoring prompts "
            f"({im.get('positions')} positions)") if isinstance(im, dict) else ""
    return (f"recipe of {r['cell_id']}: {r.get('quantization')}, groups kept at {r.get('keep')}, "
            f"KL budget {r.get('kl_budget'):g}{used}")


def recipe_summary(r: dict[str, Any]) -> str:
    where = f"; the recipe file: {r['recipe_file']}" if r.get("recipe_file") else ""
    return f"{r.get('summary', '')} ({len(r.get('candidates') or [])} candidates, {r.get('wall_s', 0):.0f} s{where})"


def recipe_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The recipe, then the presets: the timed cells."""
    return [*([r["recipe"]] if r.get("recipe") else []), *(r.get("presets") or [])]


def _kl(c: dict[str, Any]) -> str:
    if c.get("kl_mean") is None:
        return "-"
    iv = (f" [{num(c['kl_lo'], '.2g')}, {num(c['kl_hi'], '.2g')}]" if c.get("kl_hi") is not None
          else " [no interval]")
    return num(c["kl_mean"], ".3g") + iv


def _budget(c: dict[str, Any]) -> str:
    if c.get("status") != "ok":
        return f"{c.get('status')}: {c.get('reason') or ''}"
    return "within" if c.get("within_budget") else ("may exceed" if c.get("mean_within") else "over")


def _speedup(c: dict[str, Any]) -> str:
    if c.get("speedup") is None:
        return "-"
    iv = f" [{num(c['speedup_lo'], '.3g')}, {num(c['speedup_hi'], '.3g')}]" if c.get("speedup_hi") is not None else ""
    return num(c["speedup"], ".3g") + iv


def recipe_columns() -> list:
    return [
        ("cell", "cell", lambda c: c["name"], lambda c: c["name"], ""),
        ("kept", "groups kept", lambda c: len(c.get("kept") or []), lambda c: str(len(c.get("kept") or [])), "n"),
        ("bytes", "bytes", lambda c: c.get("file_bytes"), lambda c: str(c.get("file_bytes") or "-"), "n"),
        ("kl", "KL mean [95% CI]", lambda c: c.get("kl_mean"), _kl, "n"),
        ("budget", "budget", _budget, _budget, ""),
        ("tok_s", "tok/s", lambda c: c.get("output_tok_s"), lambda c: num(c.get("output_tok_s"), ".3g"), "n"),
        ("speedup", "speed-up vs fp32 [95% CI]", lambda c: c.get("speedup"),
         _speedup, "n"),
    ]
