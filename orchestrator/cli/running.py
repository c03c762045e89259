"""`bench validate`, `schema`, `run`, `submit`, `status` and `model tiny`: checking a matrix and running it."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from orchestrator.cli.app import app, fail, model_app
from orchestrator.matrix.models import MatrixError
from orchestrator.report.console import err, matrix_table, out, print_table, summary_table


@app.command()
def validate(matrix: Path = typer.Argument(..., help="The matrix file (checked as the matrix is: one line)")) -> None:
    """Expand and check a matrix; runs nothing."""
    from orchestrator.inputs.task_sets import notes
    from orchestrator.matrix.cells import expand, group
    from orchestrator.matrix.validate import deferred_checks, load_matrix

    try:
        m, _ = load_matrix(matrix)
        cells = expand(m)
    except MatrixError as e:
        fail(str(e))
    groups = group(cells)
    out.print(matrix_table(f"{m.name}: {len(cells)} cells in {len(groups)} engine groups", cells))
    for line in deferred_checks(m):   # what only the node can check: said, not passed over
        out.print(f"not checked here: {line}", highlight=False)
    for line in notes(m.tasks):   # how an item file was read, where it is not plain
        out.print(f"note: {line}", highlight=False)


@app.command()
def schema() -> None:
    """Print the matrix JSON Schema (for editors)."""
    from orchestrator.matrix.validate import json_schema

    print(json.dumps(json_schema(), indent=2))


@app.command()
def run(matrix: Path = typer.Argument(..., help="The matrix file (checked as the matrix is: one line)"),
        run_dir: Optional[Path] = typer.Option(None, help="Default: results/<matrix name>"),
        address: Optional[str] = typer.Option(None, help="Ray cluster address (default: RAY_ADDRESS, else a local cluster)"),
        rerun_failed: bool = typer.Option(False, help="Run again the stored cells that are not ok"),
        history: Optional[Path] = typer.Option(None, exists=True, file_okay=False,
                                               help="A results root (or run): groups are estimated from its durations"),
        quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines (Ray's log: RUN_DIR/run.log)")) -> None:
    """Run a matrix; resumes into an existing run dir, skipping cells already stored. Live progress on a terminal."""
    from orchestrator.execution.runner import run_matrix
    from orchestrator.store.run_store import RunLocked

    try:
        store = run_matrix(matrix, run_dir, address, rerun_failed, console=err, history=history, quiet=quiet)
    except (MatrixError, RunLocked) as e:
        fail(str(e))
    _first_screen(store)


def _first_screen(store) -> None:
    """The answer, where the run ends: every cell against its baseline and the verdict summary
    (orchestrator/report/run_summary.py); the speed table alone where the run cannot be judged."""
    from orchestrator.judge.verdicts import judge_run
    from orchestrator.report.run_summary import print_run_summary

    try:
        verdicts = judge_run(store.root)
    except Exception as e:   # noqa: BLE001 - the run is stored; `bench compare` says the rest
        print_table(summary_table(store.read_cells(), title=f"{store.root}"))
        err.print(f"verdicts: not judged here ({escape(type(e).__name__)}: {escape(str(e).splitlines()[0] if str(e) else '')}); "
                  f"bench compare {store.root}", highlight=False)
        return
    print_run_summary(verdicts, store.root)


@contextmanager
def _cluster_auth(address: str):
    """A cluster with Ray's token authentication that refuses this client: what to set, exit 2, no traceback."""
    from ray.exceptions import AuthenticationError

    from orchestrator.execution.jobs import auth_help

    try:
        yield
    except AuthenticationError as e:
        fail(escape(auth_help(e, address)))


@app.command()
def submit(matrix: Path = typer.Argument(..., help="The matrix file (checked as the matrix is: one line)"),
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
            fail(str(e))
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


@model_app.command("tiny")
def model_tiny(variant: str = typer.Option("tiny", help="tiny (llama) or tiny-qwen2")) -> None:
    """Build (or find in the cache) the built-in tiny checkpoint and print its path."""
    from orchestrator.execution.runner import cache_root
    from orchestrator.inputs.tiny_model import resolve_builtin

    try:
        print(resolve_builtin(variant, cache_root()))
    except ValueError as e:
        fail(str(e))
