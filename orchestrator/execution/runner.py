"""`bench run`, top to bottom: matrix -> cells -> preflight -> schedule -> run -> store."""

from __future__ import annotations

import contextlib
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

from orchestrator.execution.estimate import History
from orchestrator.execution.node_check import check_nodes
from orchestrator.execution.preflight import preflight, resolve_models
from orchestrator.execution.progress import RunProgress
from orchestrator.execution.spec import GroupJob, pair_jobs
from orchestrator.execution.supervisor import PROJECT_ROOT
from orchestrator.matrix.cells import Cell, expand, group
from orchestrator.matrix.models import Matrix
from orchestrator.matrix.validate import load_matrix
from orchestrator.store import compaction, manifest
from orchestrator.store.run_store import RunStore


def cache_root() -> Path:
    return Path(os.environ.get("LOSSLESS_BENCH_CACHE", Path.home() / ".cache" / "lossless-bench"))


def framework_python(m: Matrix, framework: str, env: str | None = None) -> str:
    """The env's interpreter for a framework (env axis), else the matrix's, else its project venv
    (.venvs/<fw>), else this one. A relative path is taken from here (the driver's working directory)."""
    own = m.envs[env].python_for(framework) if env is not None and m.envs else None
    if own:
        return str(Path(own).absolute()) if Path(own).exists() else own   # (absolute, not resolved: a venv's link)
    if framework in m.run.python:
        return m.run.python[framework]
    venv = PROJECT_ROOT / ".venvs" / framework / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def cells_to_run(cells: list[Cell], store: RunStore, rerun_failed: bool) -> list[Cell]:
    stored = store.stored_status()
    return [c for c in cells if c.cell_id not in stored or (rerun_failed and stored[c.cell_id] != "ok")]


def run_matrix(matrix_path: str | Path, run_dir: str | Path | None = None, address: str | None = None,
               rerun_failed: bool = False, console: Console | None = None,
               history: str | Path | None = None, quiet: bool = False) -> RunStore:
    """Run a matrix into its run dir. What the user sees meanwhile (orchestrator/execution/progress.py) goes
    to `console` (default: stderr): a live bar on a terminal, one line per finished cell elsewhere, nothing
    with `quiet`. Ray's own log lines go to the run dir's run.log, not the terminal."""
    console = console or Console(stderr=True)
    m, text = load_matrix(matrix_path)            # every matrix mistake is raised here, before Ray
    cells = expand(m)
    store = RunStore(run_dir or Path("results") / m.name)
    with store.writing():                         # the driver is the only writer of its run dir
        _run(m, text, cells, store, address, rerun_failed, console, history, quiet)
    return store


RUN_LOG = "run.log"   # in the run dir: Ray's own log lines (its warnings included), kept off the terminal


def _run(m: Matrix, text: str, cells: list[Cell], store: RunStore, address: str | None, rerun_failed: bool,
         console: Console, history: str | Path | None = None, quiet: bool = False) -> None:
    compaction.remove_partial_writes(store)
    todo = cells_to_run(cells, store, rerun_failed)
    skipped = len(cells) - len(todo)
    if skipped and not quiet:
        console.print(f"resuming {store.root}: {skipped} of {len(cells)} cells already stored")

    from orchestrator.execution.scheduler import cluster_device, init_ray, schedule, status_rows  # Ray only with work

    started = datetime.now(timezone.utc).isoformat()
    manifest.write(store, m, text, cells, started=started)
    if todo:
        measured = None
        if history:   # durations earlier runs measured: the scheduler's estimates (orchestrator/execution/estimate.py)
            measured = History.read(history)
            if not quiet:
                console.print(f"estimates from {measured.runs} run{'' if measured.runs == 1 else 's'} under {history}: {len(measured.cell_s)} cells and "
                              f"{len(measured.load_s)} engine loads measured")
        groups = group(todo)
        models = resolve_models(m, [g.model for g in groups], str(cache_root()))   # each model once, before Ray
        ray_started = any(why is None for _, why in models.values())
        if ray_started:
            spinner = console.status("starting Ray", refresh_per_second=4) if not quiet and console.is_terminal \
                else contextlib.nullcontext()   # Ray takes seconds to start: say so rather than show nothing
            with spinner:
                init_ray(address, log_file=store.root / RUN_LOG)
            device = cluster_device() if m.run.device == "auto" else m.run.device
        else:   # no model can be had: nothing to start Ray for
            device = "cpu" if m.run.device == "auto" else m.run.device
        jobs = [GroupJob(run_id=store.run_id, group=g, matrix=m, device=device,
                         python=framework_python(m, g.framework, g.env), cache_dir=str(cache_root()),
                         env_vars=dict(m.envs[g.env].env_vars) if g.env else {})
                for g in groups]
        checked = preflight(jobs, models)         # the pairs no engine can run: rows now, before any engine
        on_nodes = check_nodes(checked, models) if ray_started else []   # paths only the nodes can have
        for line in [*checked.messages(), *on_nodes]:
            console.print(f"[yellow]preflight: {line}[/yellow]")
        with RunProgress.for_console(console, m.name, todo, quiet) as progress:

            def on_done(job: GroupJob, rows) -> None:
                for row, logprobs, tasks, samples in rows:
                    row.setdefault("started_at", started)
                    store.write_cell(row, logprobs, tasks, samples)
                    if row.get("search_probe") is None:   # a search's probes are rows, not planned cells
                        progress.stored(row["cell_id"], row["status"])

            for job, status, reason in checked.excluded:
                on_done(job, status_rows(job, status, reason))
            if checked.runnable:   # an env pair runs as one job (orchestrator/execution/spec.py: pair_jobs)
                schedule(pair_jobs(checked.runnable), on_done, measured, progress)
    stop = None
    try:  # a few large files instead of two per cell (orchestrator/store/compaction.py); crash-safe
        compaction.compact(store)
    except Exception as e:  # the journal is intact and readable; `bench compact` tries again
        if isinstance(e, OSError) or getattr(e, "bench_exit_code", None):   # a full disk, damaged data: the run's error
            stop = e
        else:
            console.print(f"[yellow]compaction of {store.root} failed ({type(e).__name__}: {e}); the results are "
                          f"complete in its journal, `bench compact {store.root}` tries again[/yellow]")
    manifest.write(store, m, text, cells, started=started, ended=datetime.now(timezone.utc).isoformat())
    if stop is not None:
        raise stop
