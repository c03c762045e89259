"""`judge_run`: the one place a stored run is judged on every layer. `bench compare`, `bench gate`, `bench export`
and the verdict summary `bench run` ends with render what it returns, so two commands never judge the same run
two ways.

    judge_run(RUN)                         every cell against the run's baseline (or `baseline=`, a selector)
    judge_run(RUN, against=OLD)            every cell against the same configuration in a stored run

The layers themselves are computed where they are defined: logits, text and speed in analysis.py (one run) and
cross_run.py (two runs), tasks in task_verdicts.py, samples in sampling_verdicts.py; where the layers disagree,
reconcile.py. Here they are only put side by side."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from orchestrator.matrix.models import Tolerances
from orchestrator.store.run_store import RunStore


@dataclass(frozen=True)
class Verdicts:
    """What a run's judgement holds. `cells`: one row per cell, the logit, text and speed verdicts with the figures
    behind them, plus each cell's task summary (`task_verdict`, `task_reason`) and `sampling_verdict` where those
    layers were judged; `tasks`: one row per (cell, task), None where the task layer was not asked for;
    `sampling`: one row per cell with samples, likewise; `disagree`: cell_id -> the line that says how its
    layers' disagreeing verdicts are both true; `alpha`: the task layer's level; `against`: OLD, or None;
    `errors`: layer ("tasks", "sampling") -> why it could not be judged (with keep_going; the layer is then None)."""
    cells: pd.DataFrame
    tasks: pd.DataFrame | None
    sampling: pd.DataFrame | None
    disagree: dict[str, str] = field(default_factory=dict)
    alpha: float = 0.05
    against: Path | None = None
    errors: dict[str, str] = field(default_factory=dict)

    def disagree_lines(self) -> list[str]:
        """'layers disagree:' and one line per such cell, named by what tells it apart from the others."""
        from orchestrator.judge.reconcile import disagree_lines

        return disagree_lines(self.cells, self.disagree)


def judge_run(run: str | Path, *, against: str | Path | None = None, baseline: dict | None = None,
              tolerances: Tolerances | None = None, match: list[str] | None = None,
              noise_run: str | Path | None = None, history: str | Path | None = None,
              tasks: bool = True, sampling: bool = True, keep_going: bool = False) -> Verdicts:
    """Judge `run` on every layer (tasks=False / sampling=False leave a layer out: the gate asks only for what its
    rules read). With `against`, every cell against the same configuration in OLD (`match`: pair on these axes;
    `noise_run` / `history`: the run-to-run noise of the speed calls, default the folder holding OLD). Raises
    ValueError for arguments that do not go together. keep_going: a task or sampling layer that fails is left out
    with its reason in `errors` (the report still shows the rest); the logit, text and speed layers always raise."""
    from orchestrator.judge.reconcile import reconcile

    errors: dict[str, str] = {}

    def layer(name: str, wanted: bool, compute):
        if not wanted:
            return None
        try:
            return compute()
        except Exception as e:   # noqa: BLE001 - said in `errors` where the caller asked to keep going
            if not keep_going:
                raise
            errors[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            return None

    if against is not None:
        if baseline:
            raise ValueError("--baseline and --against exclude each other: with --against, OLD's cell is the baseline")
        from orchestrator.judge.cross_run import compare_runs
        from orchestrator.judge.sampling_verdicts import compare_sampling_runs
        from orchestrator.judge.task_verdicts import compare_task_runs

        old = Path(against)
        cells = compare_runs(run, old, match, tolerances, noise_run, history or old.parent)
        tv = layer("tasks", tasks, lambda: compare_task_runs(run, old, cells, tolerances))
        sv = layer("sampling", sampling, lambda: compare_sampling_runs(run, old, cells, tolerances))
    else:
        if match or noise_run or history:
            raise ValueError("--match, --noise-run and --history are for two runs: give --against OLD_RUN")
        from orchestrator.judge.analysis import analyse
        from orchestrator.judge.sampling_verdicts import analyse_sampling
        from orchestrator.judge.task_verdicts import analyse_tasks

        old = None
        cells = analyse(run, baseline=baseline, tolerances=tolerances)
        tv = layer("tasks", tasks, lambda: analyse_tasks(run, baseline=baseline, tolerances=tolerances))
        sv = layer("sampling", sampling, lambda: analyse_sampling(run, baseline=baseline, tolerances=tolerances))
    if tv is not None:
        from orchestrator.judge.task_verdicts import summarize_tasks

        cells = cells.merge(summarize_tasks(tv), on="cell_id", how="left")
    if sv is not None:
        cells = cells.merge(sv[["cell_id", "sampling_verdict"]], on="cell_id", how="left")
    alpha = (tolerances or RunStore(run).read_manifest().tolerances).task_alpha
    return Verdicts(cells, tv, sv, reconcile(cells, tv, sv, alpha), alpha, old, errors)
