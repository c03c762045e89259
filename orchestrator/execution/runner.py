"""`bench run`, top to bottom: matrix -> cells -> preflight -> schedule -> run -> store."""

from __future__ import annotations

import contextlib
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console

from orchestrator.execution.scheduling.estimate import History
from orchestrator.execution.preflight import check_nodes, preflight, resolve_models
from orchestrator.execution.progress import RunProgress
from orchestrator.execution.engine_child.spec import GroupJob, pair_jobs, timing_twins
from orchestrator.execution.engine_child.supervisor import PROJECT_ROOT
from orchestrator.matrix.cells import Cell, EngineGroup, expand, group
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


def group_job(m: Matrix, store: RunStore, g: EngineGroup, device: str) -> GroupJob:
    return GroupJob(run_id=store.run_id, group=g, matrix=m, device=device, python=framework_python(m, g.framework, g.env),
                    cache_dir=str(cache_root()), env_vars=dict(m.envs[g.env].env_vars) if g.env else {})


def rescore_run(run_dir: str | Path, selector: dict, address: str | None = None, console: Console | None = None) -> None:
    """A stored run's samples scored by the engine of another baseline than its matrix's (`selector`, as
    `bench compare --baseline` takes it), so the sampling layer judged against that baseline compares both
    sides under one model too; rows beside the run's own (rescored.parquet holds any number of scorers)."""
    store = RunStore(run_dir)
    m = store.read_manifest().matrix
    if m is None:
        raise ValueError(f"{run_dir}: its stored matrix does not load with this version; it cannot be rescored")
    with store.writing():
        _rescore(m, store, expand(m), address, console or Console(stderr=True), False, selector)


def _rescore(m: Matrix, store: RunStore, cells: list[Cell], address: str | None, console: Console, quiet: bool,
             selector: dict | None = None) -> None:
    """The baseline's engines score the cells' samples (orchestrator/execution/rescore.py): after every cell,
    also on a resumed run whose cells were all stored before (Ray starts only where something is to score)."""
    if m.measure.sampling is None or (selector is None and not m.measure.sampling.rescore):
        return
    from orchestrator.execution.rescore import plan, rescore_samples
    from orchestrator.execution.scheduling.scheduler import cluster_device, init_ray

    todo = plan(store, m.baseline if selector is None else selector)
    if not todo:
        return
    init_ray(address, log_file=store.root / RUN_LOG)
    device = cluster_device() if m.run.device == "auto" else m.run.device
    if not quiet:
        console.print(f"rescoring {sum(len(t) for t in todo.values())} samples with the baseline's engine "
                      f"({len(todo)} engine load{'s' if len(todo) > 1 else ''})")
    for line in rescore_samples(m, store, todo, cells, lambda c: group_job(m, store, group([c])[0], device)):
        console.print(f"[yellow]{line}[/yellow]")


RUN_LOG = "run.log"   # in the run dir: Ray's own log lines (its warnings included), kept off the terminal


def _run(m: Matrix, text: str, cells: list[Cell], store: RunStore, address: str | None, rerun_failed: bool,
         console: Console, history: str | Path | None = None, quiet: bool = False) -> None:
    compaction.remove_partial_writes(store)
    todo = cells_to_run(cells, store, rerun_failed)
    skipped = len(cells) - len(todo)
    if skipped and not quiet:
        console.print(f"resuming {store.root}: {skipped} of {len(cells)} cells already stored")

    from orchestrator.execution.scheduling.scheduler import cluster_device, init_ray, schedule, status_rows  # Ray only with work

    started = datetime.now(timezone.utc).isoformat()
    manifest.write(store, m, text, cells, started=started)
    if todo:
        measured = None
        if history:   # durations earlier runs measured: the scheduler's estimates (orchestrator/execution/scheduling/estimate.py)
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
        jobs = [group_job(m, store, g, device) for g in groups]
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
            if checked.runnable:   # an env pair, and a group with its baseline's timing twin, run as one job (spec.py)
                schedule(timing_twins(pair_jobs(checked.runnable)), on_done, measured, progress)
    try:
        _rescore(m, store, cells, address, console, quiet)
    except Exception as e:   # the cells stand; the sampling layer judges each sample by its own engine, and says so
        console.print(f"[yellow]rescoring the samples failed ({type(e).__name__}: {e}); the sampling layer scores "
                      f"each sample by the engine that drew it[/yellow]")
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
