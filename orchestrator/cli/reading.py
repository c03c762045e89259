"""`bench report`, `ls`, `show`, `plan`, `export`, `compact`, `verify` and `history`: reading stored runs."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from orchestrator.cli.app import FORMAT, WIDE, a_run, app, axes, check_format, exit_code, fail, stop_if_no_cells
from orchestrator.report.console import (
    err,
    history_table,
    out,
    plan_table,
    print_searches,
    print_table,
    runs_table,
    summary_table,
)


@app.command("report")
def report_cmd(run: Path = typer.Argument(..., exists=True, file_okay=False, callback=a_run, help="A run directory"),
               output: Optional[Path] = typer.Option(None, "-o", "--output",
                                                     help="The HTML file (default: RUN/report.html); report.md goes beside it"),
               against: Optional[Path] = typer.Option(None, exists=True, file_okay=False, callback=a_run,
                                                      help="A stored run OLD: also show each config's move from OLD on "
                                                           "the quality plot, and this run against OLD cell by cell"),
               match: Optional[str] = typer.Option(None, help="--against: pair cells on these axes (comma-separated) "
                                                   "instead of their ids, for matrices that differ")) -> None:
    """Write one self-contained HTML report (plots, sortable cells table, provenance) and a Markdown summary;
    with --against OLD_RUN, also this run against OLD_RUN."""
    from orchestrator.report.write import write_report

    if match and not against:
        fail("--match pairs cells of two runs: give --against OLD_RUN")
    try:
        html_path, md_path = write_report(run, output, against=against, match=axes(match))
    except (FileNotFoundError, ValueError) as e:   # ValueError: a --match that does not pair cells one to one
        fail(str(e))
    print(html_path)
    print(md_path)


@app.command("ls")
def ls_cmd(results: Path = typer.Argument(Path("results"), help="A results root (or one run directory)")) -> None:
    """The runs in a results root: cells ok/total, frameworks, when they started and ended."""
    from orchestrator.store.runs import list_runs

    if not results.exists():
        fail(f"no such directory: {results}")
    out.print(runs_table(list_runs(results), f"runs in {results}"))



@app.command("show")
def show_cmd(run: Path = typer.Argument(..., exists=True, file_okay=False, callback=a_run, help="A run directory"),
             wide: bool = WIDE, fmt: str = FORMAT) -> None:
    """The run's cells in a table."""
    from orchestrator.judge import searches
    from orchestrator.report.compact import emit, summary_compact
    from orchestrator.store.run_store import RunStore

    check_format(fmt)
    if fmt != "table":
        stop_if_no_cells(run)
    store = RunStore(run)
    everything = store.read_cells()
    cells = everything[~searches.is_probe(everything)]    # the probes get a table of their own
    name = store.read_manifest().name
    counts = ", ".join(f"{n} {s}" for s, n in cells.status.value_counts().items())
    title = f"{store.root}" + (f" (matrix {name})" if name else "") + f": {len(cells)} cells" + (f", {counts}" if counts else "")
    emit(fmt, {"cells": cells}, [(summary_table if wide else summary_compact)(cells, title=title)])
    if fmt == "table":
        print_searches(everything)
    say_missing(run)


MISSING_SHOWN = 20   # missing cells named one a line; the rest counted


def say_missing(run: Path) -> None:
    """Every planned cell the run dir holds no row of, on stderr (stdout stays the table or its CSV/JSON):
    `<cell>: missing: not stored (why, when known)`."""
    from orchestrator.store.run_store import RunStore
    from orchestrator.store.verify import missing_cells

    missing = missing_cells(RunStore(run))
    for cid, why in missing[:MISSING_SHOWN]:
        err.print(escape(f"{cid}: missing: {why}"), soft_wrap=True)
    if len(missing) > MISSING_SHOWN:
        err.print(f"and {len(missing) - MISSING_SHOWN} more cells missing: not stored")


@app.command("plan")
def plan_cmd(run: Path = typer.Argument(..., exists=True, file_okay=False, callback=a_run, help="A run directory"),
             qps: float = typer.Option(..., help="Requests per second to serve"),
             input_len: int = typer.Option(..., help="Prompt tokens per request"),
             output_len: int = typer.Option(..., help="Output tokens per request"),
             slo_ttft_p99: Optional[float] = typer.Option(None, help="TTFT p99 SLO, ms"),
             slo_tpot_p99: Optional[float] = typer.Option(None, help="TPOT p99 SLO, ms"),
             gpu_hour_cost: Optional[float] = typer.Option(None, help="USD per GPU-hour (per node-hour on a CPU run)"),
             max_replicas: Optional[int] = typer.Option(None, help="At most this many replicas: a larger batch is "
                                                         "extrapolated where needed")) -> None:
    """Per engine config: the cheapest batch size meeting the SLOs, replicas and GPUs for QPS, cost per million tokens."""
    from orchestrator.capacity.plan import plan
    from orchestrator.store.run_store import RunStore

    try:
        df = plan(run, qps, input_len, output_len, slo_ttft_p99, slo_tpot_p99, gpu_hour_cost, max_replicas)
    except ValueError as e:
        fail(str(e))
    if df.empty:
        fail(f"no cells stored in {run}")
    out.print(plan_table(df, qps, input_len, output_len, RunStore(run).read_manifest().host or None, gpu_hour_cost))


@app.command("export")
def export_cmd(run: Path = typer.Argument(..., exists=True, file_okay=False, callback=a_run, help="A run directory"),
               fmt: str = typer.Option("csv", "--format", help="csv or jsonl"),
               output: Optional[Path] = typer.Option(None, "-o", "--output", help="Directory (default: RUN/export)"),
               logprobs: bool = typer.Option(False, help="Also the logprobs table (one row per scored token: large)"),
               verdicts: bool = typer.Option(True, help="Also the verdicts bench compare computes: per cell (logits, "
                                             "text, speed), per cell and task, per cell's samples")) -> None:
    """Write every table of a run as CSV or JSONL: cells, tasks, samples (logprobs on request), and the
    verdicts computed from them (verdicts, task_verdicts, sampling_verdicts)."""
    from orchestrator.store.export import check_format, export_dir, export_run, write_frame

    stop_if_no_cells(run)
    try:
        check_format(fmt)
        written = export_run(run, fmt, output, logprobs)
        if verdicts:
            from orchestrator.judge.verdicts import judge_run

            v = judge_run(run)
            out_dir = export_dir(run, output)
            for name, df in (("verdicts", v.cells), ("task_verdicts", v.tasks), ("sampling_verdicts", v.sampling)):
                if len(df):
                    path = out_dir / f"{name}.{fmt}"
                    written[path] = write_frame(df, path, fmt)
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    for path, n in written.items():
        print(f"{path}\t{n} rows")
    say_missing(run)


@app.command("compact")
def compact_cmd(run: Path = typer.Argument(..., exists=True, file_okay=False, callback=a_run, help="A run directory"),
                salvage: bool = typer.Option(False, help="First replace each journal file that does not verify whole "
                                                          "by the records of it that do; say what was not kept")) -> None:
    """Fold a run's journal (and per-cell files of earlier versions) into one cells file and one file
    per side table per framework (bench run does this when it ends); atomic, and a no-op when there
    is nothing to fold. A journal that does not verify whole is never folded or deleted: --salvage."""
    from orchestrator.store.compaction import compact
    from orchestrator.store.run_store import RunStore

    if not ((run / "cells").is_dir() or (run / "journal").is_dir()):
        fail(f"{run} is not a run directory (no cells/ and no journal/)")
    try:
        if salvage:
            from orchestrator.store.salvage import report_lines
            from orchestrator.store.salvage import salvage as salvage_run

            for line in report_lines(run, salvage_run(RunStore(run))):
                print(line)
        stats = compact(RunStore(run))
    except RuntimeError as e:  # another writer holds the run dir, or its compacted files lack their record
        fail(escape(str(e)), exit_code(e))
    if stats["cells_folded"]:
        print(f"{run}: folded {stats['cells_folded']} per-cell files into compaction {stats['generation']} "
              f"({', '.join(stats['frameworks'])}) in {stats['seconds']:.1f}s")
    else:
        print(f"{run}: nothing to compact (compaction {stats['generation']})")
    for line in stats.get("kept_damaged") or []:   # a torn or damaged last record: its bytes kept, never deleted
        print(f"kept {line}")


@app.command("verify")
def verify_cmd(run: Path = typer.Argument(..., exists=True, file_okay=False, callback=a_run, help="A run directory")) -> None:
    """Check every file and every record of a run dir (digests, page checksums, journal records, no links),
    streamed, for CI and archives: exit 4 when anything does not verify."""
    from orchestrator.store.verify import report_lines, verify_run

    report = verify_run(run)
    for line in report_lines(run, report):
        print(line)
    if not report.ok:
        raise typer.Exit(4)



@app.command()
def history(results: Path = typer.Argument(..., exists=True, file_okay=False, help="A results root holding runs"),
            config: Optional[str] = typer.Option(None, help="Only configurations with these axis values, e.g. "
                                                 "framework=vllm,quantization=fp8"),
            html: Optional[Path] = typer.Option(None, help="Also write the line plots as one offline HTML file "
                                                "(default: RESULTS/history.html)")) -> None:
    """Every run under a results root: per configuration, speed and quality over time, one point per run,
    with the provenance change at each step."""
    from orchestrator.matrix.baselines import parse_selector
    from orchestrator.judge.history import history as read_history
    from orchestrator.report.history_html import write_history_html

    try:
        df = read_history(results, parse_selector(config, "--config") if config else None)
    except ValueError as e:
        fail(str(e))
    if df.empty:
        fail(f"no runs (or no cells matching --config) under {results}")
    print_table(history_table(df, f"history of {results}: {df.run.nunique()} runs"))
    path = write_history_html(df, html or results / "history.html", f"lossless-bench history: {results.name}")
    err.print(f"wrote {path}")
