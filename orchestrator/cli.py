"""The `bench` command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from orchestrator.matrix import MatrixError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Benchmark LLM engines for speed and prove whether their outputs changed.")
model_app = typer.Typer(no_args_is_help=True, help="Built-in models.")
app.add_typer(model_app, name="model")
# rich falls back to 80 columns when not on a terminal (CI logs, pipes): tables need more
_width = None if Console().is_terminal else 180
out = Console(width=_width)
err = Console(stderr=True, width=_width)


def _fail(message: str, code: int = 2) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


@app.command()
def validate(matrix: Path = typer.Argument(..., exists=True, dir_okay=False)) -> None:
    """Expand and check a matrix; runs nothing."""
    from orchestrator.cells import expand, group
    from orchestrator.matrix import load_matrix

    try:
        m, _ = load_matrix(matrix)
        cells = expand(m)
    except MatrixError as e:
        _fail(str(e))
    groups = group(cells)
    table = Table(title=f"{m.name}: {len(cells)} cells in {len(groups)} engine groups")
    for col in ("cell_id", "framework", "model", "quant", "flags", "batch", "in", "out"):
        table.add_column(col)
    for c in cells:
        table.add_row(c.cell_id, c.framework, c.model, c.quantization, c.flags, str(c.batch_size),
                      str(c.input_len), str(c.output_len))
    out.print(table)


@app.command()
def schema() -> None:
    """Print the matrix JSON Schema (for editors)."""
    from orchestrator.matrix import json_schema

    print(json.dumps(json_schema(), indent=2))


@app.command()
def run(matrix: Path = typer.Argument(..., exists=True, dir_okay=False),
        run_dir: Optional[Path] = typer.Option(None, help="Default: results/<matrix name>"),
        address: Optional[str] = typer.Option(None, help="Ray cluster address (default: RAY_ADDRESS, else a local cluster)"),
        rerun_failed: bool = typer.Option(False, help="Run again the stored cells that are not ok")) -> None:
    """Run a matrix; resumes into an existing run dir, skipping cells already stored."""
    from orchestrator.runner import run_matrix

    try:
        store = run_matrix(matrix, run_dir, address, rerun_failed, console=err)
    except MatrixError as e:
        _fail(str(e))
    out.print(summary_table(store.read_cells(), title=f"{store.root}"))


@app.command()
def submit(matrix: Path = typer.Argument(..., exists=True, dir_okay=False),
           address: str = typer.Option(..., help="Ray dashboard address, e.g. http://HEAD:8265"),
           run_dir: str = typer.Option(..., help="Results path on the head node (a shared file system)"),
           rerun_failed: bool = typer.Option(False),
           follow: bool = typer.Option(False, help="Print the job's output until it ends")) -> None:
    """Run a matrix on a remote Ray cluster through the Ray Jobs API; prints the job id."""
    from orchestrator import jobs

    try:
        job_id = jobs.submit(matrix, address, run_dir, rerun_failed)
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
    from orchestrator import jobs

    if follow:
        state = jobs.follow(job_id, address, echo=err.out)
    else:
        state, logs = jobs.status(job_id, address)
        err.out(logs[-5000:])
    print(state)
    raise typer.Exit(1 if state in ("FAILED", "STOPPED") else 0)


def _fmt(v, spec: str = ".1f") -> str:
    if v is None or v != v:  # None or NaN (pandas turns missing numbers into NaN)
        return "-"
    return format(v, spec)


def summary_table(df, title: str) -> Table:
    table = Table(title=title)
    for col in ("framework", "model", "quant", "flags", "batch", "status", "load s", "TTFT p50 ms",
                "TPOT p50 ms", "e2e p50 ms", "out tok/s", "peak MiB", "reason"):
        table.add_column(col, overflow="fold")
    df = df.sort_values(["framework", "model", "quantization", "flags", "batch_size"])
    for r in df.itertuples():
        color = "green" if r.status == "ok" else ("yellow" if r.status == "unsupported" else "red")
        reason = r.reason.splitlines()[0][:80] if isinstance(r.reason, str) and r.reason else ""
        table.add_row(r.framework, r.model, r.quantization, r.flags, str(r.batch_size),
                      f"[{color}]{r.status}[/{color}]", _fmt(r.load_s, ".2f"), _fmt(r.ttft_ms_p50, ".2f"),
                      _fmt(r.tpot_ms_p50, ".2f"), _fmt(r.e2e_ms_p50, ".1f"), _fmt(r.output_tok_s),
                      _fmt(r.peak_mem_bytes / 2**20, ".0f"),
                      reason)
    return table


@model_app.command("tiny")
def model_tiny(variant: str = typer.Option("tiny", help="tiny (llama) or tiny-qwen2")) -> None:
    """Build (or find in the cache) the built-in tiny checkpoint and print its path."""
    from orchestrator.runner import cache_root
    from orchestrator.tiny_model import resolve_builtin

    try:
        print(resolve_builtin(variant, cache_root()))
    except ValueError as e:
        _fail(str(e))


if __name__ == "__main__":
    app()
