"""The `bench` application and what every command shares: one `error:` line and its exit code for a failure
that is no bug, the run-dir argument check, the output formats. The commands register on `app` in the modules
beside it (orchestrator/cli/__init__.py imports them)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from typer.core import TyperGroup

from orchestrator.environments.create import env_cmd
from orchestrator.explain.command import explain_cmd
from orchestrator.report.console import err, plain_failure


class _Bench(typer.Typer):
    """The `bench` process's entry point (the console script and `python -m orchestrator.cli` call the app;
    typer's CliRunner does not): a command that started a local Ray cluster ends it and exits at once."""

    def __call__(self, *args, **kwargs):
        from orchestrator.execution import stop

        stop.stop_on_sigterm()
        try:
            return super().__call__(*args, **kwargs)
        except SystemExit as e:   # how click ends every command, 0 included
            if stop.terminated():   # typer made the interrupt 130: say what stopped it, exit as SIGTERM asks
                print("bench: stopped by SIGTERM (what was stored is kept; `bench run` with the same run dir "
                      "resumes, the cells that were running rerun)", file=sys.stderr)
                e.code = stop.EXIT_CODE
            exit_now(e.code)
            raise


def exit_now(code) -> None:
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


def exit_code(e: BaseException, default: int = 2) -> int:
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
            fail(escape(known[0]), known[1])


app = _Bench(add_completion=False, no_args_is_help=True, cls=_Commands,
             help="Benchmark LLM engines for speed and prove whether their outputs changed.")
model_app = typer.Typer(no_args_is_help=True, help="Built-in models.")
app.add_typer(model_app, name="model")
app.command("explain")(explain_cmd)   # the culprit search; its body: orchestrator/explain/command.py
app.command("env")(env_cmd)   # orchestrator/environments/create.py


def fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


def a_run(path: Optional[Path]) -> Optional[Path]:
    """Every argument that names a run dir is one, or the command stops before reading it (exit 2): a
    mistyped --against path must never read as a run whose cells all vanished."""
    from orchestrator.store.run_store import is_run_dir

    if path is not None and not is_run_dir(path):
        raise typer.BadParameter(f"{path} is not a run directory: a run dir holds manifest.json and cells/ "
                                 f"or journal/ (what `bench run --run-dir DIR` writes)")
    return path


def stop_if_no_cells(run: Path) -> None:
    """A run dir with a manifest and no cell yet (stopped while Ray started): said in one line, exit 0."""
    from orchestrator.store.run_store import RunStore

    if RunStore(run).read_cells().empty:
        err.print(f"{run}: no cells stored yet (`bench run` into it resumes the run)", highlight=False, markup=False)
        raise typer.Exit(0)


WIDE = typer.Option(False, "--wide", help="Every column (the default fits 120 columns: one line per cell)")
FORMAT = typer.Option("table", "--format", help="table; csv (the cells, every column), json (every table, every "
                       "column) or md (the table as Markdown), for scripts")


def check_format(fmt: str) -> None:
    from orchestrator.report.compact import FORMATS

    if fmt not in FORMATS:
        fail(f"--format: expected one of {', '.join(FORMATS)}, got {fmt!r}")


def axes(text: str | None) -> list[str] | None:
    return [a.strip() for a in text.split(",") if a.strip()] if text else None
