"""`bench report RUN`: report.html (orchestrator/report_html.py) and report.md beside it
(orchestrator/report_md.py), both from one load of the run (orchestrator/report_data.py).

Numbers come from `orchestrator.analysis.analyse` (verdicts, KL, noise floors, speedups) and the
stored cells table (versions). When the analysis cannot run, the report still renders the speed
numbers and says why the quality columns are empty.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.report_data import load
from orchestrator.report_html import render_html
from orchestrator.report_md import render_markdown


def write_report(run_dir: str | Path, output: str | Path | None = None) -> tuple[Path, Path]:
    """Write report.html (default: RUN/report.html) and report.md beside it; returns both paths."""
    root = Path(run_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no run directory at {root}")
    if not (root / "cells").exists() and not (root / "manifest.json").exists():
        raise FileNotFoundError(f"{root} is not a run directory (no cells/ and no manifest.json)")
    html_path = Path(output) if output else root / "report.html"
    md_path = html_path.with_suffix(".md")
    df, manifest, err = load(root)
    name = str(manifest.get("run_id") or root.name)
    from orchestrator.store import atomic_write_text

    atomic_write_text(html_path, render_html(df, manifest, name, err))
    atomic_write_text(md_path, render_markdown(df, manifest, name, err))
    for p in (html_path, md_path):  # a temporary file is private; a report is for sharing
        p.chmod(0o644)
    return html_path, md_path
