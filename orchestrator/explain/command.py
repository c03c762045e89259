"""`bench explain RUN CELL` / `bench explain RUN --all-lossy`: the culprit search for cells that are not lossless
against their baseline, its stored result (RUN/explain/<cell_id>/explain.json) and its terminal output.
orchestrator/cli/app.py registers `explain_cmd`; everything else of the command is here."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from orchestrator.matrix.models import Tolerances
from orchestrator.store.explain_file import ExplainResult, explain_path, write_result

if TYPE_CHECKING:   # `bench --help` and the other commands do not load pandas for this one
    import pandas as pd

LOSSY = ("near-lossless", "lossy")    # what --all-lossy explains; identical and lossless need no explaining


def _config(row: Any) -> str:
    return f"{row['framework']}/{row['model']}/{row['quantization']}/{row['flags']}/b{int(row['batch_size'])}"


def pick_cells(df: pd.DataFrame, cell: str | None, all_lossy: bool, any_verdict: bool = False) -> list[dict[str, Any]]:
    """The cells to explain: the one named (its id, or a prefix naming one cell), or every near-lossless and lossy
    cell; refuses cells that cannot be explained, saying why."""
    if all_lossy:
        rows = df[df.verdict.isin(LOSSY) & (df.cell_id != df.baseline_cell_id) & (df["mode"] != "serve")]
        return [r for _, r in rows.iterrows()]
    if not cell:
        raise ValueError("name a cell (its id, or a prefix of it) or give --all-lossy")
    found = df[df.cell_id.str.startswith(cell)].drop_duplicates("cell_id")
    if len(found) != 1:
        raise ValueError(f"{len(found)} cells of the run have an id starting {cell!r}; `bench show RUN` lists them"
                         if len(found) else f"no cell of the run has an id starting {cell!r}")
    row = found.iloc[0]
    if row["verdict"] not in LOSSY and not any_verdict:
        raise ValueError(f"cell {row['cell_id']} ({_config(row)}) is {row['verdict']}"
                         + (f" ({row['verdict_reason']})" if isinstance(row.get("verdict_reason"), str) else "")
                         + ": only a near-lossless or lossy cell has something to explain")
    if row.get("mode") == "serve":
        raise ValueError(f"cell {row['cell_id']} is a serve cell: the culprit search probes offline and stream cells")
    return [row]


def _plain(row: Any) -> dict[str, Any]:
    """A cells-frame row as a dict, NaN as None."""
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}


def _env(row) -> str | None:
    """The row's engine environment (the env axis), None without one."""
    env = row.get("env") if hasattr(row, "get") else None
    return env if isinstance(env, str) else None


def explain_cell(run_dir: Path, df: pd.DataFrame, row: Any, max_probes: int, address: str | None,
                 console: Console, quiet: bool, tolerances: Tolerances | None = None) -> ExplainResult:
    """Search one cell's culprits (judged with `tolerances`, default the run's); stores and returns the result."""
    import pandas as pd

    from orchestrator.explain.probes import GOAL, ProbeRunner
    from orchestrator.explain.search import search
    from orchestrator.explain.suspects import find_suspects
    from orchestrator.store.run_store import RunStore

    started = time.monotonic()
    matrix = RunStore(run_dir).read_manifest().matrix
    if matrix is None:
        raise ValueError(f"{run_dir}'s stored matrix is not one this version reads: the probes cannot be built")
    base_id = row["baseline_cell_id"]
    base = df[df.cell_id == base_id].iloc[0]
    # the baseline's configuration at the cell's lengths: its cells at every batch size the run had (its noise floor)
    same = df[(df.engine_key == base["engine_key"]) & (df.status == "ok") & (df.input_len == base["input_len"])
              & (df.output_len == base["output_len"])]
    same = same[same.workload.fillna("") == (base.get("workload") or "")] if "workload" in same else same
    baseline_rows = pd.concat([same[same.cell_id == base_id], same[same.cell_id != base_id]]).drop_duplicates("cell_id")
    cell = _plain(row)
    options = matrix.engine_options(cell["framework"], cell["flags"])
    suspects, skipped = find_suspects(cell["framework"], options, cell["quantization"], int(cell["batch_size"]),
                                      {"framework": base["framework"], "quantization": base["quantization"],
                                       "options": matrix.engine_options(base["framework"], base["flags"]),
                                       "env": _env(base)}, _env(cell))
    if tolerances is not None:   # the probes are judged as the cell was (their ids do not depend on it: reused)
        matrix = matrix.model_copy(update={"tolerances": tolerances})
    runner = ProbeRunner(run_dir, matrix, cell, baseline_rows, suspects, address, console, quiet)
    found = search([s.name for s in suspects], runner.run, max_probes)
    result = ExplainResult(
        run=str(run_dir), cell_id=cell["cell_id"], config=_config(cell), framework=cell["framework"],
        verdict=cell["verdict"], verdict_reason=cell.get("verdict_reason"), baseline_cell_id=base_id,
        baseline_config=_config(base), goal=list(GOAL), tolerances=matrix.tolerances.model_dump(mode="json"), suspects=suspects, skipped=skipped, probes=runner.probes,
        outcome=found.outcome, culprits=found.culprits, summary=found.summary, probe_run=str(runner.run_dir),
        wall_s=round(time.monotonic() - started, 1))
    write_result(result, explain_path(run_dir, cell["cell_id"]), run_dir)
    return result


def probes_table(result: ExplainResult) -> Table:
    t = Table(title=f"explain {result.cell_id}: {result.config} ({result.verdict}) against {result.baseline_config}",
              title_justify="left")
    for col in ("#", "phase", "moved to the baseline's side", "verdict", "max_abs", "kl_mean", "why"):
        t.add_column(col, justify="right" if col in ("#", "max_abs", "kl_mean") else "left")
    for p in result.probes:
        verdict = (p.verdict or "-") if p.status == "ok" else p.status
        t.add_row(str(p.index) + (" (stored)" if p.reused else ""), p.phase, escape(" + ".join(p.moved) or "(nothing: the cell as it is)"),
                  ("[green]" if p.restores else "") + escape(verdict),
                  *(f"{v:.3g}" if v is not None else "-" for v in (p.max_abs, p.kl_mean)),
                  escape((p.verdict_reason if p.status == "ok" else p.reason) or ""))
    return t


def print_result(result: ExplainResult, console: Console) -> None:
    if result.probes:
        console.print(probes_table(result))
    for name, why in result.skipped.items():
        console.print(f"  not probed: {escape(name)}: {escape(why)}")
    colour = {"culprit": "green", "engine": "yellow"}.get(result.outcome, "red")
    console.print(f"[{colour}]{result.outcome}[/{colour}]: {escape(result.summary)}")
    console.print(f"  {len(result.probes)} probes, {result.wall_s:.0f} s; the probes: {escape(result.probe_run)} "
                  f"(`bench compare` it); the result: {escape(str(explain_path(result.run, result.cell_id)))}")


def sensitivity_cmd(run: Path, rows: list[Any], address: str | None, out: Console, err: Console, quiet: bool,
                    budget: float | None = None, imatrix: bool = False) -> None:
    """`--sensitivity`: the tensor-group table of each picked cell; with a `budget` (`--recipe`) also the recipe
    search, with `imatrix` quantized with the run's own importance matrix (a cell that cannot have them: said, exit 2)."""
    from orchestrator.explain.recipe import print_recipe, search_recipe
    from orchestrator.explain.sensitivity import print_sensitivity, run_sensitivity

    for row in rows:
        cell = {k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}
        try:
            print_sensitivity(run_sensitivity(run, cell, _config(cell), address, err, quiet), out)
            if budget is not None:
                print_recipe(search_recipe(run, cell, _config(cell), budget, address, err, quiet, imatrix), out)
        except ValueError as e:
            err.print(f"[red]error:[/red] {escape(str(e))}")
            if len(rows) == 1:
                raise typer.Exit(2)


def explain_cmd(run: Path = typer.Argument(..., exists=True, file_okay=False, help="A run directory"),
                cell: Optional[str] = typer.Argument(None, help="The cell's id (or a prefix naming one cell)"),
                all_lossy: bool = typer.Option(False, "--all-lossy", help="Every near-lossless and lossy cell"),
                max_probes: int = typer.Option(32, min=2, help="At most this many probes per cell"),
                tolerances: Optional[str] = typer.Option(None, help="Override the run's tolerances, e.g. 'atol=1e-6' "
                                                         "(as `bench compare --tolerances`); probes are reused"),
                layers: bool = typer.Option(False, "--layers", help="Instead of the culprit search: where along the "
                                            "depth the cell leaves its baseline's noise floor (per-layer hidden states)"),
                sensitivity: bool = typer.Option(False, "--sensitivity", help="llama.cpp quantized cells: the KL of each "
                                                 "tensor group quantized alone, the rest F32 (explain/sensitivity.py)"),
                recipe: bool = typer.Option(False, "--recipe", help="llama.cpp quantized cells: the smallest per-tensor "
                                            "mix within --kl-budget, timed beside the presets; writes RUN/explain/CELL/recipe.yaml, which a matrix names as "
                                            "quantization: [{recipe: path}] (explain/recipe.py)"),
                kl_budget: float = typer.Option(0.01, "--kl-budget", min=0.0, help="--recipe: the largest mean KL "
                                                "against fp32 the mix may have, read from its 95% interval's upper end"),
                imatrix: bool = typer.Option(False, "--imatrix", help="--recipe: quantize the candidates and the presets "
                                             "with an importance matrix from the run's own scoring prompts"),
                address: Optional[str] = typer.Option(None, help="Ray cluster address (default: a local cluster)"),
                quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines")) -> None:
    """Why is a cell not lossless? Re-runs its configuration with each suspect (the engine's numerics flags,
    batch size 1, the quantization) moved to the baseline's side, one at a time, then by delta debugging, and
    names the smallest set of changes that restores lossless, or says none does (the engine itself differs).
    With --layers: the residual stream after every block, the cell's against its baseline's on the run's scoring
    prompts, and the first layer whose error leaves the baseline's own floor (RUN/explain/CELL/layers.json)."""
    from orchestrator.judge.verdicts import judge_run
    from orchestrator.store.run_store import is_run_dir

    wide = None if Console().is_terminal else 160   # a pipe or a file: rows on one line, not folded at 80
    out, err = Console(width=wide), Console(stderr=True, width=wide)
    if not is_run_dir(run):
        raise typer.BadParameter(f"{run} is not a run directory")
    if imatrix and not recipe:
        raise typer.BadParameter("--imatrix is an option of the recipe search: give --recipe too")
    try:
        tol = None
        if tolerances:
            from orchestrator.matrix.baselines import parse_tolerances
            from orchestrator.store.run_store import RunStore

            tol = parse_tolerances(tolerances, RunStore(run).read_manifest().tolerances)
        df = judge_run(run, tolerances=tol, tasks=False, sampling=False).cells
        rows = pick_cells(df, cell, all_lossy, any_verdict=sensitivity or recipe)
    except ValueError as e:
        err.print(f"[red]error:[/red] {escape(str(e))}")
        raise typer.Exit(2)
    if not rows:
        out.print(f"no near-lossless or lossy cell in {run}: nothing to explain")
        return
    if sensitivity or recipe:
        sensitivity_cmd(run, rows, address, out, err, quiet, kl_budget if recipe else None, imatrix)
        return
    for row in rows:
        if layers:
            print_layers(explain_layers(run, df, row, address), out)
            continue
        print_result(explain_cell(run, df, row, max_probes, address, err, quiet, tol), out)


def explain_layers(run_dir: Path, df: pd.DataFrame, row: Any, address: str | None) -> dict[str, Any]:
    from orchestrator.explain.layer_run import layers_for

    base = df[df.cell_id == row["baseline_cell_id"]].iloc[0]
    cell = _plain(row)
    return layers_for(run_dir, cell, _config(base), address) | {"config": _config(cell)}


def print_layers(report: dict[str, Any], console: Console) -> None:
    if report.get("layers"):
        t = Table(title=f"layers of {report['cell_id']}: {report['config']} against {report['baseline_config']}",
                  title_justify="left")
        for col in ("layer", "relative error", "floor", "beyond"):
            t.add_column(col, justify="left" if col == "layer" else "right")
        for r in report["layers"]:
            t.add_row(r["name"], f"{r['rel_error']:.3g}", f"{r['floor']:.3g}", "yes" if r["beyond_floor"] else "")
        console.print(t)
    colour = "yellow" if report.get("reason") else "green"
    console.print(f"[{colour}]{report['cell_id']}[/{colour}]: {escape(report['line'])}"
                  + (f" ({report['prompts']} prompts, {report['positions']} positions)" if report.get("prompts") else ""))
    if report.get("prompts"):
        console.print(f"  floor: {escape(report['floor_from'])}; stored: {escape(str(report.get('path', '')))}")
