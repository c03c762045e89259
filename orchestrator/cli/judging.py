"""`bench compare` and `bench gate`: the verdicts of a run, against its baseline or a stored run."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from orchestrator.cli.app import FORMAT, WIDE, a_run, app, axes, check_format, fail, stop_if_no_cells
from orchestrator.cli.reading import say_missing
from orchestrator.report.console import (
    against_table,
    changes_lines,
    compare_table,
    env_pair_lines,
    noise_line,
    out,
    print_searches,
    sampling_table,
    task_table,
)


@app.command()
def compare(run_dir: Path = typer.Argument(..., exists=True, file_okay=False, callback=a_run),
            against: Optional[Path] = typer.Option(None, exists=True, file_okay=False, callback=a_run,
                                                   help="A stored run: compare every cell with the same config there"),
            match: Optional[str] = typer.Option(None, help="--against: pair cells on these axes (comma-separated) "
                                                "instead of their ids, for matrices that differ"),
            noise_run: Optional[Path] = typer.Option(None, exists=True, file_okay=False, callback=a_run,
                                                     help="--against: a repeat of OLD; its drift from OLD widens the "
                                                     "speed intervals by the run-to-run noise"),
            history: Optional[Path] = typer.Option(None, exists=True, file_okay=False,
                                                   help="--against: a results root whose earlier runs repeat OLD's "
                                                   "configurations: their drift is the run-to-run noise (default: "
                                                   "the folder holding OLD)"),
            baseline: Optional[str] = typer.Option(None, help="Axis values of the baseline, e.g. framework=hf,quantization=fp32 (default: the matrix's)"),
            tolerances: Optional[str] = typer.Option(None, help="Override tolerances, e.g. atol=1e-4,kl_near=0.02"),
            output: Optional[Path] = typer.Option(None, "-o", "--output", help="Also write every column to this Parquet file"),
            wide: bool = WIDE, fmt: str = FORMAT) -> None:
    """Compare every cell with its baseline (or, with --against, with the same config in a stored run) on
    logits, text and perplexity, on the matrix's tasks (item by item), and on speed; print the verdicts."""
    import pandas as pd

    stop_if_no_cells(run_dir)

    from orchestrator.judge.cross_run import env_pairs
    from orchestrator.judge.verdicts import judge_run
    from orchestrator.matrix.baselines import parse_selector, parse_tolerances
    from orchestrator.report import compact
    from orchestrator.store.run_store import RunStore

    check_format(fmt)
    try:
        v = judge_run(run_dir, against=against, baseline=parse_selector(baseline) if baseline else None,
                      tolerances=parse_tolerances(tolerances) if tolerances else None, match=axes(match),
                      noise_run=noise_run, history=history)
    except ValueError as e:
        fail(str(e))
    df, tv, sv = v.cells, v.tasks, v.sampling
    if against:
        main = (against_table if wide else compact.against_compact)(df, str(run_dir), str(against))
        lines = [noise_line(df), *changes_lines(df)]
    else:
        main = (compare_table if wide else compact.compare_compact)(df)
        lines = env_pair_lines(env_pairs(run_dir, df))
    tables = [main, *([(task_table if wide else compact.task_compact)(tv)] if not tv.empty else []),
              *([(sampling_table if wide else compact.sampling_compact)(sv)] if not sv.empty else [])]
    compact.emit(fmt, {"cells": df, "tasks": tv, "sampling": sv, "layers_disagree": pd.DataFrame(
        {"cell_id": list(v.disagree), "line": list(v.disagree.values())})}, tables, lines, v.disagree_lines())
    if not against and fmt == "table":
        print_searches(RunStore(run_dir).read_cells())
    say_missing(run_dir)
    if output:
        df.to_parquet(output)


@app.command()
def gate(run_dir: Path = typer.Argument(..., exists=True, file_okay=False, callback=a_run),
         policy: Path = typer.Option(..., exists=True, dir_okay=False,
                                     help="YAML rules: match + must_be and/or speed bounds"),
         against: Optional[Path] = typer.Option(None, exists=True, file_okay=False, callback=a_run,
                                                help="A stored run: gate quality and speed against it"),
         match: Optional[str] = typer.Option(None, help="--against: pair cells on these axes instead of their ids"),
         noise_run: Optional[Path] = typer.Option(None, exists=True, file_okay=False, callback=a_run,
                                                  help="--against: a repeat of OLD, whose drift from OLD widens the "
                                                  "speed intervals by the run-to-run noise"),
         history: Optional[Path] = typer.Option(None, exists=True, file_okay=False,
                                                help="--against: a results root whose earlier runs repeat OLD's "
                                                "configurations (default: the folder holding OLD)"),
         junit: Optional[Path] = typer.Option(None, help="Also write the checks as JUnit XML here"),
         format: str = typer.Option("text", "--format", help="text, or md: a Markdown summary for a pull request")) -> None:
    """Exit 1 when a check fails: a cell the policy marks must-be-lossless (or identical, near-lossless)
    is not, or (with --against) a speed bound is crossed beyond the noise. Exit 2 for a usage error."""
    from orchestrator.judge.gate import PolicyError, check_line, evaluate, load_policy
    from orchestrator.judge.verdicts import judge_run

    if format not in ("text", "md"):
        fail(f"--format: expected text or md, got {format!r}")
    try:
        rules = load_policy(policy)
        v = judge_run(run_dir, against=against, match=axes(match), noise_run=noise_run, history=history,
                      tasks=any(r.task for r in rules.rules), sampling=any(r.sampling for r in rules.rules))
        checks = evaluate(v.cells, rules, against=against is not None, tasks=v.tasks, sampling=v.sampling)
    except (PolicyError, ValueError) as e:
        fail(str(e))
    failed = [c for c in checks if not c.passed]
    if junit:
        from orchestrator.report.gate_junit import write_junit

        write_junit(checks, junit)
    if format == "md":
        from orchestrator.report.gate_md import gate_markdown

        title = f"lossless-bench gate: {run_dir.name}" + (f" against {against.name}" if against else "")
        print(gate_markdown(checks, title), end="")
    else:
        for c in failed:
            out.print(check_line(c), highlight=False, markup=False, soft_wrap=True)   # one line a check
        for line in v.family_lines():   # the level the checks' words were decided at
            out.print(f"family: {line}", highlight=False, markup=False, soft_wrap=True)
        out.print("gate: pass" if not failed else f"gate: FAIL ({len(failed)} check(s))")
    raise typer.Exit(0 if not failed else 1)
