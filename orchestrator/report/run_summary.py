"""What `bench run` ends with: the answer to "did the outputs change, and how much faster", without a second
command. From the run's `Verdicts` (orchestrator/judge/verdicts.py): the count of each verdict word per layer,
the fastest cell whose outputs did not change (with its interval and call), the cells that did not run and why,
the one-line-per-cell comparison when it fits the screen, and the commands that go further."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from orchestrator.report.compact import compare_compact, speed_text
from orchestrator.values import finite

if TYPE_CHECKING:
    import pandas as pd

    from orchestrator.judge.verdicts import Verdicts

# the table is printed whole up to this many cells; above it the counts and the commands say enough
TABLE_CELLS = 24
_UNCHANGED = ("identical", "lossless")
_ORDER = ("identical", "lossless", "near-lossless", "lossy", "no change", "not distinguishable", "improved",
          "regressed", "same distribution", "sampler differs", "different", "n/a")


def _counts(values: pd.Series) -> str:
    seen = Counter(v for v in values if isinstance(v, str))
    words = sorted(seen, key=lambda w: _ORDER.index(w) if w in _ORDER else len(_ORDER))
    return ", ".join(f"{seen[w]} {w}" for w in words)


def _name(r: dict) -> str:
    return f"{r['framework']}/{r['model']}/{r['quantization']}/{r['flags']} batch {r['batch_size']}"


def fastest_unchanged(cells: pd.DataFrame) -> dict | None:
    """The cell (not the baseline itself) whose logits and text did not change (identical or lossless), no task
    regressed and no sampling test found a difference, with the highest speed-up over its baseline; None if none."""
    best = None
    for r in cells.to_dict("records"):
        if r.get("verdict") not in _UNCHANGED or r.get("baseline_cell_id") == r["cell_id"]:
            continue
        if r.get("task_verdict") == "regressed" or r.get("sampling_verdict") == "different":
            continue
        if finite(r.get("speedup")) and (best is None or r["speedup"] > best["speedup"]):
            best = r
    return best


def summary_lines(v: Verdicts, run_dir: str | Path) -> list[str]:
    """The lines under the comparison table (rich markup escaped where it is data)."""
    cells = v.cells
    ran = cells[cells.status == "ok"] if "status" in cells else cells
    lines = [f"verdicts ({len(cells)} cells, {len(ran)} ran):",
             f"  logits and text: {_counts(cells.verdict)}"]
    if v.tasks is not None and len(v.tasks):
        lines.append(f"  tasks ({v.tasks.task.nunique()} task(s), per cell and task): {_counts(v.tasks.task_verdict)}")
    if v.sampling is not None and len(v.sampling):
        lines.append(f"  sampling: {_counts(v.sampling.sampling_verdict)}")
    best = fastest_unchanged(cells)
    if best is not None:
        lines.append(f"fastest with outputs unchanged: {escape(_name(best))} ({best['verdict']}): "
                     f"{escape(speed_text(best))} against its baseline")
    elif not (cells.baseline_cell_id.notna() & (cells.baseline_cell_id != cells.cell_id)).any():
        lines.append("fastest with outputs unchanged: nothing to compare (every cell is its own baseline)")
    else:
        lines.append("fastest with outputs unchanged: none (no cell but the baseline is identical or lossless)")
    not_ok = cells[cells.status != "ok"] if "status" in cells else cells.iloc[:0]
    for r in not_ok.to_dict("records")[:10]:
        why = str(r.get("reason") or "").strip().splitlines()
        lines.append(f"did not run: {escape(_name(r))}: {r['status']}" + (f" ({escape(why[0][:160])})" if why else ""))
    if len(not_ok) > 10:
        lines.append(f"did not run: {len(not_ok) - 10} more (bench show {run_dir})")
    lines.append(f"further: bench compare {run_dir} (every layer; --wide), bench report {run_dir} (report.html)")
    return lines


def print_run_summary(v: Verdicts, run_dir: str | Path) -> None:
    from orchestrator.report.console import out, print_table

    if len(v.cells) <= TABLE_CELLS:
        print_table(compare_compact(v.cells))
    for line in summary_lines(v, run_dir):
        out.print(line, highlight=False, soft_wrap=True)
