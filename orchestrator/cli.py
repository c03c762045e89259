"""The `bench` command."""

from __future__ import annotations

import json
import logging
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from typer.core import TyperGroup

from orchestrator.environments.create import env_cmd
from orchestrator.explain.command import explain_cmd
from orchestrator.matrix.models import MatrixError
from orchestrator.report.console import (
    against_table,
    changes_lines,
    compare_table,
    env_pair_lines,
    err,
    history_table,
    matrix_table,
    noise_line,
    out,
    plain_failure,
    plan_table,
    print_searches,
    print_table,
    runs_table,
    sampling_table,
    summary_table,
    task_table,
)


class _Bench(typer.Typer):
    """The `bench` process's entry point (the console script and `python -m orchestrator.cli` call the app;
    typer's CliRunner does not): a command that started a local Ray cluster ends it and exits at once."""

    def __call__(self, *args, **kwargs):
        try:
            return super().__call__(*args, **kwargs)
        except SystemExit as e:   # how click ends every command, 0 included
            _exit_now(e.code)
            raise


def _exit_now(code) -> None:
    """After a command that started its own local cluster (`bench run` without an address): SIGKILL it and
    os._exit, instead of Ray's atexit shutdown (0.5 s of sleep, SIGTERM and polling: 1.4 s) and the
    interpreter's teardown (1-2 s more after Ray, pyarrow, pandas and DuckDB). Safe here: every result file was written
    atomically and closed, the run dir's lock released, the manifest written; stdout and stderr are
    flushed below. Returns (a normal exit follows) when this process started no cluster."""
    reaper = sys.modules.get("orchestrator.execution.reaper")   # imported where a local cluster is started
    try:
        if reaper is None or not reaper.end():
            return
    except Exception:   # never turn a finished run's exit code into a traceback: Ray's own shutdown follows
        return
    if isinstance(code, str):   # sys.exit("message"): Python prints it and exits 1
        print(code, file=sys.stderr)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code if isinstance(code, int) else 0 if code is None else 1)


def _exit_code(e: BaseException, default: int = 2) -> int:
    """An error's own exit code (`bench_exit_code`: DamagedJournal 4, a cluster that did not start 3), else `default`."""
    code = getattr(e, "bench_exit_code", None)
    return code if isinstance(code, int) else default


class _Commands(TyperGroup):
    """Every command: a failure that is no bug (report/console.plain_failure) is one `error:` line and its exit code,
    not a traceback."""

    def invoke(self, ctx):
        import click

        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort, typer.Exit, typer.Abort):
            raise
        except Exception as e:
            known = plain_failure(e)
            if known is None:
                raise
            _fail(escape(known[0]), known[1])


app = _Bench(add_completion=False, no_args_is_help=True, cls=_Commands,
             help="Benchmark LLM engines for speed and prove whether their outputs changed.")
model_app = typer.Typer(no_args_is_help=True, help="Built-in models.")
app.add_typer(model_app, name="model")
app.command("explain")(explain_cmd)   # the culprit search; its body: orchestrator/explain/command.py
app.command("env")(env_cmd)   # orchestrator/environments/create.py


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


def _a_run(path: Optional[Path]) -> Optional[Path]:
    """Every argument that names a run dir is one, or the command stops before reading it (exit 2): a
    mistyped --against path must never read as a run whose cells all vanished."""
    from orchestrator.store.run_store import is_run_dir

    if path is not None and not is_run_dir(path):
        raise typer.BadParameter(f"{path} is not a run directory: a run dir holds manifest.json and cells/ "
                                 f"or journal/ (what `bench run --run-dir DIR` writes)")
    return path


@app.command()
def validate(matrix: Path = typer.Argument(..., exists=True, dir_okay=False)) -> None:
    """Expand and check a matrix; runs nothing."""
    from orchestrator.matrix.cells import expand, group
    from orchestrator.matrix.validate import deferred_checks, load_matrix

    try:
        m, _ = load_matrix(matrix)
        cells = expand(m)
    except MatrixError as e:
        _fail(str(e))
    groups = group(cells)
    out.print(matrix_table(f"{m.name}: {len(cells)} cells in {len(groups)} engine groups", cells))
    for line in deferred_checks(m):   # what only the node can check: said, not passed over
        out.print(f"not checked here: {line}", highlight=False)


@app.command()
def schema() -> None:
    """Print the matrix JSON Schema (for editors)."""
    from orchestrator.matrix.validate import json_schema

    print(json.dumps(json_schema(), indent=2))


@app.command()
def run(matrix: Path = typer.Argument(..., exists=True, dir_okay=False),
        run_dir: Optional[Path] = typer.Option(None, help="Default: results/<matrix name>"),
        address: Optional[str] = typer.Option(None, help="Ray cluster address (default: RAY_ADDRESS, else a local cluster)"),
        rerun_failed: bool = typer.Option(False, help="Run again the stored cells that are not ok"),
        history: Optional[Path] = typer.Option(None, exists=True, file_okay=False,
                                               help="A results root (or run): groups are estimated from its durations"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines (Ray's log: RUN_DIR/run.log)")) -> None:
    """Run a matrix; resumes into an existing run dir, skipping cells already stored. Live progress on a terminal."""
    from orchestrator.execution.runner import run_matrix

    try:
        store = run_matrix(matrix, run_dir, address, rerun_failed, console=err, history=history, quiet=quiet)
    except MatrixError as e:
        _fail(str(e))
    print_table(summary_table(store.read_cells(), title=f"{store.root}"))


@contextmanager
def _cluster_auth(address: str):
    """A cluster with Ray's token authentication that refuses this client: what to set, exit 2, no traceback."""
    from ray.exceptions import AuthenticationError

    from orchestrator.execution.jobs import auth_help

    try:
        yield
    except AuthenticationError as e:
        _fail(escape(auth_help(e, address)))


@app.command()
def submit(matrix: Path = typer.Argument(..., exists=True, dir_okay=False),
           address: str = typer.Option(..., help="Ray dashboard address, e.g. http://HEAD:8265"),
           run_dir: str = typer.Option(..., help="Results path on the head node (a shared file system)"),
           rerun_failed: bool = typer.Option(False),
           history: Optional[str] = typer.Option(None, help="A results root on the head: `bench run --history`"),
           follow: bool = typer.Option(False, help="Print the job's output until it ends")) -> None:
    """Run a matrix on a remote Ray cluster through the Ray Jobs API; prints the job id."""
    from orchestrator.execution import jobs

    with _cluster_auth(address):
        try:
            job_id = jobs.submit(matrix, address, run_dir, rerun_failed, history)
        except MatrixError as e:
            _fail(str(e))
        print(job_id)
        if follow:
            state = jobs.follow(job_id, address, echo=err.out)
            raise typer.Exit(0 if state == "SUCCEEDED" else 1)


@app.command()
def status(job_id: str, address: str = typer.Option(..., help="Ray dashboard address, e.g. http://HEAD:8265"),
           follow: bool = typer.Option(False, help="Print new output until the job ends")) -> None:
    """The state and output of a job started by `bench submit`; exits 1 when it failed."""
    from orchestrator.execution import jobs

    with _cluster_auth(address):
        if follow:
            state = jobs.follow(job_id, address, echo=err.out)
        else:
            state, logs = jobs.status(job_id, address)
            err.out(logs[-5000:])
    print(state)
    raise typer.Exit(1 if state in ("FAILED", "STOPPED") else 0)


@app.command("report")
def report_cmd(run: Path = typer.Argument(..., exists=True, file_okay=False, callback=_a_run, help="A run directory"),
               output: Optional[Path] = typer.Option(None, "-o", "--output",
                                                     help="The HTML file (default: RUN/report.html); report.md goes beside it"),
               against: Optional[Path] = typer.Option(None, exists=True, file_okay=False, callback=_a_run,
                                                      help="A stored run OLD: also show each config's move from OLD on "
                                                           "the quality plot, and this run against OLD cell by cell"),
               match: Optional[str] = typer.Option(None, help="--against: pair cells on these axes (comma-separated) "
                                                   "instead of their ids, for matrices that differ")) -> None:
    """Write one self-contained HTML report (plots, sortable cells table, provenance) and a Markdown summary;
    with --against OLD_RUN, also this run against OLD_RUN."""
    from orchestrator.report.write import write_report

    if match and not against:
        _fail("--match pairs cells of two runs: give --against OLD_RUN")
    try:
        html_path, md_path = write_report(run, output, against=against, match=_axes(match))
    except (FileNotFoundError, ValueError) as e:   # ValueError: a --match that does not pair cells one to one
        _fail(str(e))
    print(html_path)
    print(md_path)


@app.command("ls")
def ls_cmd(results: Path = typer.Argument(Path("results"), help="A results root (or one run directory)")) -> None:
    """The runs in a results root: cells ok/total, frameworks, when they started and ended."""
    from orchestrator.store.runs import list_runs

    if not results.exists():
        _fail(f"no such directory: {results}")
    out.print(runs_table(list_runs(results), f"runs in {results}"))


_WIDE = typer.Option(False, "--wide", help="Every column (the default fits 120 columns: one line per cell)")
_FORMAT = typer.Option("table", "--format", help="table; csv (the cells, every column), json (every table, every "
                       "column) or md (the table as Markdown), for scripts")


def _check_format(fmt: str) -> None:
    from orchestrator.report.compact import FORMATS

    if fmt not in FORMATS:
        _fail(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")


@app.command("show")
def show_cmd(run: Path = typer.Argument(..., exists=True, file_okay=False, callback=_a_run, help="A run directory"),
             wide: bool = _WIDE, fmt: str = _FORMAT) -> None:
    """The run's cells in a table."""
    from orchestrator.judge import searches
    from orchestrator.report.compact import emit, summary_compact
    from orchestrator.store.run_store import RunStore

    _check_format(fmt)
    store = RunStore(run)
    everything = store.read_cells()
    cells = everything[~searches.is_probe(everything)]    # the probes get a table of their own
    name = store.read_manifest().name
    counts = ", ".join(f"{n} {s}" for s, n in cells.status.value_counts().items())
    title = f"{store.root}" + (f" (matrix {name})" if name else "") + f": {len(cells)} cells" + (f", {counts}" if counts else "")
    emit(fmt, {"cells": cells}, [(summary_table if wide else summary_compact)(cells, title=title)])
    if fmt == "table":
        print_searches(everything)


@app.command("plan")
def plan_cmd(run: Path = typer.Argument(..., exists=True, file_okay=False, callback=_a_run, help="A run directory"),
             qps: float = typer.Option(..., help="Requests per second to serve"),
             input_len: int = typer.Option(..., help="Prompt tokens per request"),
             output_len: int = typer.Option(..., help="Output tokens per request"),
             slo_ttft_p99: Optional[float] = typer.Option(None, help="TTFT p99 SLO, ms"),
             slo_tpot_p99: Optional[float] = typer.Option(None, help="TPOT p99 SLO, ms"),
             gpu_hour_cost: Optional[float] = typer.Option(None, help="USD per GPU-hour (per node-hour on a CPU run)"),
             max_replicas: Optional[int] = typer.Option(None, help="At most this many replicas: a larger batch is "
                                                         "extrapolated where needed")) -> None:
    """Per engine config: the cheapest batch size meeting the SLOs, replicas and GPUs for QPS, cost per million tokens."""
    from orchestrator.judge.plan import plan
    from orchestrator.store.run_store import RunStore

    try:
        df = plan(run, qps, input_len, output_len, slo_ttft_p99, slo_tpot_p99, gpu_hour_cost, max_replicas)
    except ValueError as e:
        _fail(str(e))
    if df.empty:
        _fail(f"no cells stored in {run}")
    out.print(plan_table(df, qps, input_len, output_len, RunStore(run).read_manifest().host or None, gpu_hour_cost))


@app.command("export")
def export_cmd(run: Path = typer.Argument(..., exists=True, file_okay=False, callback=_a_run, help="A run directory"),
               fmt: str = typer.Option("csv", "--format", help="csv or jsonl"),
               output: Optional[Path] = typer.Option(None, "-o", "--output", help="Directory (default: RUN/export)"),
               logprobs: bool = typer.Option(False, help="Also the logprobs table (one row per scored token: large)"),
               verdicts: bool = typer.Option(True, help="Also the verdicts bench compare computes: per cell (logits, "
                                             "text, speed), per cell and task, per cell's samples")) -> None:
    """Write every table of a run as CSV or JSONL: cells, tasks, samples (logprobs on request), and the
    verdicts computed from them (verdicts, task_verdicts, sampling_verdicts)."""
    from orchestrator.store.export import check_format, export_dir, export_run, write_frame

    try:
        check_format(fmt)
        written = export_run(run, fmt, output, logprobs)
        if verdicts:
            from orchestrator.judge.analysis import analyse
            from orchestrator.judge.sampling_verdicts import analyse_sampling
            from orchestrator.judge.task_verdicts import analyse_tasks

            out_dir = export_dir(run, output)
            for name, df in (("verdicts", analyse(run)), ("task_verdicts", analyse_tasks(run)),
                             ("sampling_verdicts", analyse_sampling(run))):
                if len(df):
                    path = out_dir / f"{name}.{fmt}"
                    written[path] = write_frame(df, path, fmt)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    for path, n in written.items():
        print(f"{path}\t{n} rows")


@app.command("compact")
def compact_cmd(run: Path = typer.Argument(..., exists=True, file_okay=False, callback=_a_run, help="A run directory"),
                salvage: bool = typer.Option(False, help="First replace each journal file that does not verify whole "
                                                          "by the records of it that do; say what was not kept")) -> None:
    """Fold a run's journal (and per-cell files of earlier versions) into one cells file and one file
    per side table per framework (bench run does this when it ends); atomic, and a no-op when there
    is nothing to fold. A journal that does not verify whole is never folded or deleted: --salvage."""
    from orchestrator.store.compaction import compact
    from orchestrator.store.run_store import RunStore

    if not ((run / "cells").is_dir() or (run / "journal").is_dir()):
        _fail(f"{run} is not a run directory (no cells/ and no journal/)")
    try:
        if salvage:
            from orchestrator.store.salvage import report_lines
            from orchestrator.store.salvage import salvage as salvage_run

            for line in report_lines(run, salvage_run(RunStore(run))):
                print(line)
        stats = compact(RunStore(run))
    except RuntimeError as e:  # another writer holds the run dir, or its compacted files lack their record
        _fail(escape(str(e)), _exit_code(e))
    if stats["cells_folded"]:
        print(f"{run}: folded {stats['cells_folded']} per-cell files into compaction {stats['generation']} "
              f"({', '.join(stats['frameworks'])}) in {stats['seconds']:.1f}s")
    else:
        print(f"{run}: nothing to compact (compaction {stats['generation']})")


@app.command("diff-endpoints")
def diff_endpoints_cmd(url_a: str = typer.Argument(..., help="Base URL of endpoint A, e.g. http://127.0.0.1:8000"),
                       url_b: str = typer.Argument(..., help="Base URL of endpoint B"),
                       prompts: Path = typer.Option(..., "--prompts", exists=True, dir_okay=False,
                                                    help="Text lines, or JSONL with a \"prompt\" field"),
                       repeats: int = typer.Option(2, "--repeats", min=1, help="Times each prompt is sent to each endpoint"),
                       max_tokens: int = typer.Option(32, "--max-tokens", min=1),
                       seed: int = typer.Option(0, "--seed"),
                       temperature: float = typer.Option(0.0, "--temperature", min=0.0,
                                                         help="Above 0: seeded samples (--seeds per prompt) at this "
                                                         "temperature, compared seed by seed and as a distribution"),
                       top_p: float = typer.Option(1.0, "--top-p", min=0.0, max=1.0),
                       top_k: int = typer.Option(0, "--top-k", min=0, help="0: off"),
                       seeds: int = typer.Option(16, "--seeds", min=2, help="With --temperature: seeds per prompt"),
                       seed_offset: int = typer.Option(0, "--seed-offset", min=0,
                                                       help="With --temperature: B's seeds start here (A's at 0); "
                                                       "two identical servers on other seeds measure the tests' "
                                                       "false alarms"),
                       sampler_order: str = typer.Option("", "--sampler-order",
                                                         help="With --temperature: the framework whose sampler B runs "
                                                         "(hf, llamacpp, vllm): the order of its filters, for the "
                                                         "first-token test against A's next-token logprobs"),
                       next_top_k: int = typer.Option(100, "--next-top-k", min=1,
                                                      help="With --temperature: next-token candidates asked of A"),
                       timeout_s: float = typer.Option(120.0, "--timeout", help="Per-request timeout (s)"),
                       as_json: bool = typer.Option(False, "--json", help="Print the report as JSON")) -> None:
    """Send each prompt to two /v1/completions endpoints N times at temperature 0 and report differing outputs;
    with --temperature, N seeds per prompt at the given sampler: differing outputs per seed, and whether the
    two samples come from the same distribution."""
    from orchestrator.judge.endpoint_diff import (
        diff_endpoints,
        diff_sampled,
        format_diff_report,
        format_sampled_report,
        read_prompts,
    )

    items = read_prompts(prompts)
    if not items:
        _fail(f"no prompts in {prompts}")
    from adapters import ADAPTERS

    order = getattr(ADAPTERS.get(sampler_order), "sampler_order", None) if sampler_order else None
    if sampler_order and order is None:
        known = ", ".join(k for k, a in ADAPTERS.items() if a.sampler_order)
        _fail(f"--sampler-order: unknown or unchecked framework '{sampler_order}' (known: {known})", code=2)
    try:
        if temperature > 0:
            report = diff_sampled(url_a, url_b, items, seeds=seeds, max_tokens=max_tokens, temperature=temperature,
                                  top_p=top_p, top_k=top_k, timeout_s=timeout_s, sampler_order=order,
                                  next_top_k=next_top_k, first_seed=(0, seed_offset))
        else:
            report = diff_endpoints(url_a, url_b, items, repeats=repeats, max_tokens=max_tokens, seed=seed,
                                    timeout_s=timeout_s)
    except Exception as e:  # connection refused, HTTP errors: one line, exit 1
        _fail(f"diff-endpoints: {type(e).__name__}: {e}")
    print(json.dumps(report, indent=2) if as_json else (format_sampled_report(report) if temperature > 0
                                                         else format_diff_report(report)))


@app.command()
def compare(run_dir: Path = typer.Argument(..., exists=True, file_okay=False, callback=_a_run),
            against: Optional[Path] = typer.Option(None, exists=True, file_okay=False, callback=_a_run,
                                                   help="A stored run: compare every cell with the same config there"),
            match: Optional[str] = typer.Option(None, help="--against: pair cells on these axes (comma-separated) "
                                                "instead of their ids, for matrices that differ"),
            noise_run: Optional[Path] = typer.Option(None, exists=True, file_okay=False, callback=_a_run,
                                                     help="--against: a repeat of OLD; its drift from OLD widens the "
                                                     "speed intervals by the run-to-run noise"),
            history: Optional[Path] = typer.Option(None, exists=True, file_okay=False,
                                                   help="--against: a results root whose earlier runs repeat OLD's "
                                                   "configurations: their drift is the run-to-run noise (default: "
                                                   "the folder holding OLD)"),
            baseline: Optional[str] = typer.Option(None, help="Axis values of the baseline, e.g. framework=hf,quantization=fp32 (default: the matrix's)"),
            tolerances: Optional[str] = typer.Option(None, help="Override tolerances, e.g. atol=1e-4,kl_near=0.02"),
            output: Optional[Path] = typer.Option(None, "-o", "--output", help="Also write every column to this Parquet file"),
            wide: bool = _WIDE, fmt: str = _FORMAT) -> None:
    """Compare every cell with its baseline (or, with --against, with the same config in a stored run) on
    logits, text and perplexity, on the matrix's tasks (item by item), and on speed; print the verdicts."""
    import pandas as pd

    from orchestrator.judge.analysis import analyse
    from orchestrator.matrix.baselines import parse_selector, parse_tolerances
    from orchestrator.judge.sampling_verdicts import analyse_sampling, compare_sampling_runs
    from orchestrator.judge.task_verdicts import analyse_tasks, compare_task_runs, summarize_tasks
    from orchestrator.report import compact
    from orchestrator.report.reconcile import reconcile, reconcile_lines
    from orchestrator.store.run_store import RunStore

    _check_format(fmt)
    try:
        tol = parse_tolerances(tolerances) if tolerances else None
        if against:
            from orchestrator.judge.cross_run import compare_runs

            if baseline:
                _fail("--baseline and --against exclude each other: with --against, OLD's cell is the baseline")
            df = compare_runs(run_dir, against, _axes(match), tol, noise_run, history or against.parent)
            tv = compare_task_runs(run_dir, against, df, tol)
            sv = compare_sampling_runs(run_dir, against, df, tol)
            df = df.merge(summarize_tasks(tv), on="cell_id", how="left")
            df = df.merge(sv[["cell_id", "sampling_verdict"]], on="cell_id", how="left")
            main = (against_table if wide else compact.against_compact)(df, str(run_dir), str(against))
            lines = [noise_line(df), *changes_lines(df)]
        else:
            if match or noise_run or history:
                _fail("--match, --noise-run and --history are for two runs: give --against OLD_RUN")
            selector = parse_selector(baseline) if baseline else None
            df = analyse(run_dir, baseline=selector, tolerances=tol)
            tv = analyse_tasks(run_dir, baseline=selector, tolerances=tol)
            sv = analyse_sampling(run_dir, baseline=selector, tolerances=tol)
            df = df.merge(summarize_tasks(tv), on="cell_id", how="left")
            df = df.merge(sv[["cell_id", "sampling_verdict"]], on="cell_id", how="left")
            from orchestrator.judge.cross_run import env_pairs

            main = (compare_table if wide else compact.compare_compact)(df)
            lines = env_pair_lines(env_pairs(run_dir, df))
        tables = [main, *([(task_table if wide else compact.task_compact)(tv)] if not tv.empty else []),
                  *([(sampling_table if wide else compact.sampling_compact)(sv)] if not sv.empty else [])]
        alpha = (tol or RunStore(run_dir).read_manifest().tolerances).task_alpha
        notes = reconcile_lines(df, tv, sv, alpha)
        disagree = reconcile(df, tv, sv, alpha)
        compact.emit(fmt, {"cells": df, "tasks": tv, "sampling": sv, "layers_disagree": pd.DataFrame(
            {"cell_id": list(disagree), "line": list(disagree.values())})}, tables, lines, notes)
        if not against and fmt == "table":
            print_searches(RunStore(run_dir).read_cells())
    except ValueError as e:
        _fail(str(e))
    if output:
        df.to_parquet(output)


def _axes(text: str | None) -> list[str] | None:
    return [a.strip() for a in text.split(",") if a.strip()] if text else None


@app.command()
def gate(run_dir: Path = typer.Argument(..., exists=True, file_okay=False, callback=_a_run),
         policy: Path = typer.Option(..., exists=True, dir_okay=False,
                                     help="YAML rules: match + must_be and/or speed bounds"),
         against: Optional[Path] = typer.Option(None, exists=True, file_okay=False, callback=_a_run,
                                                help="A stored run: gate quality and speed against it"),
         match: Optional[str] = typer.Option(None, help="--against: pair cells on these axes instead of their ids"),
         noise_run: Optional[Path] = typer.Option(None, exists=True, file_okay=False, callback=_a_run,
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

    if format not in ("text", "md"):
        _fail(f"--format: expected text or md, got {format!r}")
    try:
        rules = load_policy(policy)
        if against:
            from orchestrator.judge.cross_run import compare_runs
            from orchestrator.judge.sampling_verdicts import compare_sampling_runs
            from orchestrator.judge.task_verdicts import compare_task_runs

            df = compare_runs(run_dir, against, _axes(match), noise_run=noise_run, history=history or against.parent)
            tasks = compare_task_runs(run_dir, against, df) if any(r.task for r in rules.rules) else None
            sampling = compare_sampling_runs(run_dir, against, df) if any(r.sampling for r in rules.rules) else None
        else:
            from orchestrator.judge.analysis import analyse
            from orchestrator.judge.task_verdicts import analyse_tasks

            if match or noise_run or history:
                _fail("--match, --noise-run and --history are for two runs: give --against OLD_RUN")
            from orchestrator.judge.sampling_verdicts import analyse_sampling

            df = analyse(run_dir)
            tasks = analyse_tasks(run_dir) if any(r.task for r in rules.rules) else None
            sampling = analyse_sampling(run_dir) if any(r.sampling for r in rules.rules) else None
        checks = evaluate(df, rules, against=against is not None, tasks=tasks, sampling=sampling)
    except (PolicyError, ValueError) as e:
        _fail(str(e))
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
        out.print("gate: pass" if not failed else f"gate: FAIL ({len(failed)} check(s))")
    raise typer.Exit(0 if not failed else 1)


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
        _fail(str(e))
    if df.empty:
        _fail(f"no runs (or no cells matching --config) under {results}")
    print_table(history_table(df, f"history of {results}: {df.run.nunique()} runs"))
    path = write_history_html(df, html or results / "history.html", f"lossless-bench history: {results.name}")
    err.print(f"wrote {path}")


@model_app.command("tiny")
def model_tiny(variant: str = typer.Option("tiny", help="tiny (llama) or tiny-qwen2")) -> None:
    """Build (or find in the cache) the built-in tiny checkpoint and print its path."""
    from orchestrator.execution.runner import cache_root
    from orchestrator.inputs.tiny_model import resolve_builtin

    try:
        print(resolve_builtin(variant, cache_root()))
    except ValueError as e:
        _fail(str(e))


if __name__ == "__main__":
    app()
