"""`bench report RUN [--against OLD_RUN]`: report.html (orchestrator/report/html.py) and report.md beside it
(orchestrator/report/md.py), both from one load of the run (orchestrator/report/data.py).

Verdicts come from `orchestrator.judge.verdicts.judge_run`, as `bench compare` gets them: the logit, text and
speed layers (verdicts, KL, noise floors, speedups, perplexity), the task layer (each task's score and its paired
change against the baseline) and the sampling layer (orchestrator/report/panels/sampling.py); the rest from the
stored cells table (versions, engine telemetry and energy: orchestrator/report/panels/telemetry.py; SLO
searches: orchestrator/report/panels/searches.py). When the analysis cannot run, the report still renders the speed
numbers and says why the quality columns are empty. With --against, OLD is analysed too and paired
with this run (orchestrator/report/data.py: load_against); without it the report is what it was.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.report.data import load
from orchestrator.report.html import render_html
from orchestrator.report.md import render_markdown
from orchestrator.report.panels.sampling import sampling_layer
from orchestrator.report.panels.searches import load_culprits, load_searches
from orchestrator.store.run_store import is_run_dir


def _check_run(root: Path) -> None:
    if not root.is_dir():
        raise FileNotFoundError(f"no run directory at {root}")
    if not is_run_dir(root):
        raise FileNotFoundError(f"{root} is not a run directory (no manifest.json, cells/ or journal/)")


def write_report(run_dir: str | Path, output: str | Path | None = None, against: str | Path | None = None,
                 match: list[str] | None = None) -> tuple[Path, Path]:
    """Write report.html (default: RUN/report.html) and report.md beside it; returns both paths.

    against: a stored run OLD; the report then also shows each configuration's move from OLD to this
    run on the quality-vs-speed plot and, per pair of cells, this run against OLD
    (orchestrator/judge/cross_run.py), pairing cells by id or, with `match`, by those axes."""
    root = Path(run_dir)
    _check_run(root)
    if against is not None:
        _check_run(Path(against))
    html_path = Path(output) if output else root / "report.html"
    md_path = html_path.with_suffix(".md")
    df, manifest, err, tasks, judged_samples = load(root)
    sampling = sampling_layer(judged_samples, manifest)
    searches = load_searches(root, df)
    culprits = load_culprits(root)        # `bench explain`'s stored searches: "Why is this cell lossy"
    name = str(manifest.run_id or root.name)
    vs = None
    if against is not None:
        from orchestrator.report.data import load_against

        vs = load_against(df, root, Path(against), match)
    from orchestrator.store.run_store import RunStore, atomic_write_text
    from orchestrator.store.verify import missing_cells

    missing = missing_cells(RunStore(root))
    atomic_write_text(html_path, render_html(df, manifest, name, err, against=vs, tasks=tasks, sampling=sampling,
                                             searches=searches, culprits=culprits, missing=missing))
    atomic_write_text(md_path, render_markdown(df, manifest, name, err, against=vs, tasks=tasks, sampling=sampling,
                                               searches=searches, culprits=culprits, missing=missing))
    for p in (html_path, md_path):  # a temporary file is private; a report is for sharing
        p.chmod(0o644)
    return html_path, md_path
