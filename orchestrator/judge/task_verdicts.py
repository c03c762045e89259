"""The task layer's verdicts: per cell and task, the metric with its interval and the paired change
against a baseline cell, computed from the stored tasks table alone (orchestrator/judge/task_stats.py says how).

    analyse_tasks(RUN)                 each cell against the run's baseline config (as the logit layer
                                       picks it: orchestrator/judge/analysis.py), item by item
    compare_task_runs(NEW, OLD, pairs) each NEW cell against its partner in a stored run (the pairs of
                                       orchestrator/cross_run.compare_runs)
    summarize_tasks(tv)                one line per cell: the worst task verdict, and the reasons

One row per (cell, task): n, score (the task's figure: its items aggregated as lm-eval aggregates the
metric: a mean, or a perplexity), score_lo/hi, the baseline's score over the paired items, change,
change_lo/hi, ratio, ratio_lo/hi (MLPerf's accuracy ratio), the test, p_value, worse/better (items that
moved each way), noise_items (items the baseline's engine scores differently at its smallest and largest
batch: its own noise floor; a significant change that moves no more items than that is 'no change'),
task_verdict (no change | regressed | improved | n/a) and task_reason. A task a cell could not run is
n/a with the reason its row stored; so is a task whose items carry no per-item score.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from orchestrator.inputs.task_metrics import aggregate
from orchestrator.inputs.task_sets import BINARY_METRICS
from orchestrator.judge.analysis import run_settings
from orchestrator.judge.families import BH, family
from orchestrator.matrix.baselines import resolve_baselines
from orchestrator.judge.task_stats import TOLERANCE, paired_change, score_interval
from orchestrator.matrix.models import AXES, Tolerances
from orchestrator.store.run_store import RunStore
from orchestrator.store.schema import json_object

TASK_VERDICTS = ("no change", "not distinguishable", "improved", "regressed")
_ITEM_COLUMNS = ["cell_id", "task", "metric", "item_index", "score", "score_weight", "aggregation", "higher_is_better"]
_TESTS = {"mcnemar-exact": "McNemar exact", "paired-bootstrap": "paired bootstrap",
          "paired-permutation": "paired permutation"}


def layer_cells(root: Path) -> pd.DataFrame:
    """The cells a layer judges (its id, engine, axes, status, missing), as a layer module reads them."""
    t = RunStore(root).read_cells_table(["cell_id", "engine_key", *AXES, "status", "missing"]).to_pandas()
    t["mode"] = t["mode"].fillna("offline")
    return t


def with_baselines(cells: pd.DataFrame, has_rows: pd.Series, selector: dict, what: str) -> pd.DataFrame:
    """`cells` with baseline_cell_id / baseline_match: the selector's cell among the ok ones with rows."""
    comparable = cells[(cells.status == "ok") & cells.cell_id.isin(has_rows)]
    cells["baseline_cell_id"], cells["baseline_match"] = resolve_baselines(cells, comparable, selector)
    cells["baseline_match"] = cells["baseline_match"].str.replace("with logprobs", f"with {what}")
    return cells


def with_old_partners(new_root: Path, old_root: Path, pairs: pd.DataFrame) -> pd.DataFrame:
    """NEW's cells with their partners in OLD (cell_id -> baseline_cell_id, as compare_runs pairs them)."""
    cells = layer_cells(new_root).merge(pairs[["cell_id", "baseline_cell_id"]].drop_duplicates("cell_id"),
                                        on="cell_id", how="left")
    cells["baseline_cell_id"] = cells["baseline_cell_id"].astype(object).where(cells["baseline_cell_id"].notna(), None)
    cells["baseline_match"] = f"no partner in {old_root.name}"
    return cells


def _items(root: Path) -> pd.DataFrame:
    """Every stored item row; runs written before the aggregation columns read as means, higher better."""
    t = RunStore(root).read_tasks(_ITEM_COLUMNS).to_pandas()
    t["aggregation"] = t["aggregation"].fillna("mean")
    t["higher_is_better"] = t["higher_is_better"].fillna(True).astype(bool)
    return t


def _not_run(cells: pd.DataFrame) -> dict[str, dict[str, str]]:
    """cell_id -> {task: why it has no rows} from the cells' `missing` (task:<name> keys)."""
    out = {}
    for cid, missing in zip(cells.cell_id, cells.missing):
        stored = json_object(missing)   # null (NaN): a cell not ok
        why = {k[len("task:"):]: v for k, v in stored.items() if k.startswith("task:")}
        if why:
            out[cid] = why
    return out


def _is_binary(metric: str, aggregation: str, scores: np.ndarray) -> bool:
    return aggregation == "mean" and (metric in BINARY_METRICS or bool(np.isin(scores, (0.0, 1.0)).all()))


def _weights(items: pd.DataFrame) -> np.ndarray | None:
    """A perplexity's per-item words or bytes (None: a mean's items weigh alike)."""
    w = items.score_weight
    return None if w.isna().all() else w.to_numpy(dtype=np.float64)


def _fmt(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.3f}"


def _reason(r: dict, base: str, tolerance: float) -> str:
    dropped = f" ({r['ratio_dropped']} resamples with a baseline of 0 left out)" if r.get("ratio_dropped") else ""
    seen = "any change" if r["mde"] == 0 else f"a change of {r['mde']:.3g} ({_pct(r['mde_rel'])} of the baseline's)"
    power = f"; at n={r['n_paired']} it could see {seen} at 80% power"
    if r["verdict"] == "not distinguishable":
        need = f"; about {r['items_needed']} items would" if r.get("items_needed") else ""
        power += f", over the {tolerance:.0%} tolerance{need}"
    return (f"{r['metric']} {_fmt(r['score'])} [95% CI {_fmt(r['score_lo'])}, {_fmt(r['score_hi'])}] vs "
            f"{_fmt(r['base_score'])} on {base}: change {r['change']:+.3f} [{r['change_lo']:+.3f}, {r['change_hi']:+.3f}], "
            f"ratio {_fmt(r['ratio'])}{dropped}; {_TESTS[r['test']]} p={r['p_value']:.3g} q={r['q_value']:.3g} "
            f"({r['worse']} items worse, "
            f"{r['better']} better of {r['n_paired']} paired){power}")


def _pct(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{x:.1%}"


def _noise(cells: pd.DataFrame, items: pd.DataFrame) -> dict[tuple[str, str], int]:
    """(engine_key, task) -> items whose score differs between the engine's smallest- and largest-batch
    cells: the flips an engine shows against itself, which no optimisation can be blamed for."""
    items = items.dropna(subset=["score"])
    ok = cells[(cells.status == "ok") & cells.cell_id.isin(items.cell_id)].sort_values(["batch_size", "cell_id"])
    out = {}
    for key, g in ok.groupby("engine_key"):
        if g.batch_size.nunique() < 2:
            continue
        small, big = (items[items.cell_id == c].set_index(["task", "item_index"]).score for c in
                      (g.cell_id.iloc[0], g.cell_id.iloc[-1]))
        both = small.index.intersection(big.index)
        differ = (small.reindex(both) != big.reindex(both)).groupby(level="task").sum()
        out.update({(key, task): int(n) for task, n in differ.items()})
    return out


def task_verdicts(cells: pd.DataFrame, items: pd.DataFrame, base_items: pd.DataFrame, alpha: float,
                  base_label: str = "the baseline", noise: dict | None = None,
                  tolerance: float = TOLERANCE) -> pd.DataFrame:
    """`cells`: cell_id, the axes, status, missing, baseline_cell_id (a cell of `base_items`' run, or
    None), baseline_match (why none) and base_key (the baseline's engine_key, for `noise`: see _noise).
    One row per (cell, task) the cell ran or could not run."""
    by_cell = {cid: g for cid, g in items.groupby("cell_id", sort=False)}
    by_base = {cid: g for cid, g in base_items.groupby("cell_id", sort=False)}
    noise = noise or {}
    not_run = _not_run(cells)
    rows, tested = [], []
    for c in cells.to_dict("records"):
        if c["status"] != "ok":
            continue
        own = by_cell.get(c["cell_id"])
        tasks = sorted(set(own.task) if own is not None else set()) + sorted(not_run.get(c["cell_id"], {}))
        for task in tasks:
            row = {k: c[k] for k in ("cell_id", *AXES)} | {"task": task, "baseline_cell_id": c["baseline_cell_id"]}
            if task in not_run.get(c["cell_id"], {}):
                rows.append(row | {"task_verdict": "n/a", "task_reason": f"not run: {not_run[c['cell_id']][task]}"})
                continue
            stored = own[own.task == task].set_index("item_index")
            metric, aggregation = str(stored.metric.iloc[0]), str(stored.aggregation.iloc[0])
            mine = stored.dropna(subset=["score"])
            if mine.empty:
                rows.append(row | {"metric": metric, "n": 0, "task_verdict": "n/a",
                                   "task_reason": f"no per-item score: the {len(stored)} stored items have no {metric}"})
                continue
            scores, weights = mine.score.to_numpy(dtype=np.float64), _weights(mine)
            binary = _is_binary(metric, aggregation, scores)
            lo, hi = score_interval(scores, binary, aggregation=aggregation, weights=weights)
            row |= {"metric": metric, "aggregation": aggregation, "n": len(scores),
                    "score": float(aggregate(aggregation, scores, weights)), "score_lo": lo, "score_hi": hi}
            base = by_base.get(c["baseline_cell_id"])
            base = None if base is None else base[base.task == task].set_index("item_index").dropna(subset=["score"])
            if base is None or base.empty:
                why = c.get("baseline_match") if c["baseline_cell_id"] is None else \
                    f"{base_label} {c['baseline_cell_id']} has no rows for task {task}"
                rows.append(row | {"task_verdict": "n/a", "task_reason": why or "no baseline"})
                continue
            if str(base.metric.iloc[0]) != metric:
                rows.append(row | {"task_verdict": "n/a", "task_reason": f"the baseline scored {task} with "
                                                                           f"{base.metric.iloc[0]}, this cell with {metric}"})
                continue
            common = mine.index.intersection(base.index)
            change = paired_change(base.score.reindex(common).to_numpy(), mine.score.reindex(common).to_numpy(),
                                   binary, alpha, aggregation=aggregation, base_weights=_weights(base.reindex(common)),
                                   cell_weights=_weights(mine.reindex(common)),
                                   higher_is_better=bool(mine.higher_is_better.iloc[0]), tolerance=tolerance)
            row["noise_items"] = noise.get((c.get("base_key"), task))
            rows.append(row)
            tested.append((row, change, f"{base_label} {c['baseline_cell_id']}"))
    _decide(tested, alpha, tolerance)
    out = pd.DataFrame(rows)
    if out.empty:
        return pd.DataFrame(columns=["cell_id", *AXES, "task", "baseline_cell_id", "task_verdict", "task_reason"])
    return out.sort_values([*AXES, "task", "cell_id"], kind="stable", ignore_index=True)


def _decide(tested: list, alpha: float, tolerance: float) -> None:
    """Each tested row's verdict and reason, decided within the family of all of them (the run's task tests:
    orchestrator/judge/families.py, Benjamini-Hochberg); then a call that moves no more items than the baseline's
    engine flips between its own batch sizes is 'no change'."""
    own = [row["cell_id"] == row["baseline_cell_id"] for row, _, _ in tested]   # the baseline against itself: no test
    fam = family([None if o else change.p_value for (_, change, _), o in zip(tested, own)], alpha, BH)
    for (row, change, base), q, o in zip(tested, fam.q, own):
        decided = change.at_level(change.p_value if o else float(q), fam.level, alpha, tolerance)
        row |= decided.as_dict() | {"family_level": fam.level, "family_size": fam.size}
        row["task_verdict"] = decided.verdict
        row["task_reason"] = _reason(row, base, tolerance) + f"; {fam.summary()}"
        floor = row["noise_items"]
        if floor is not None:
            row["task_reason"] += f"; the baseline's engine flips {floor} items between its batch sizes"
            if decided.verdict in ("regressed", "improved") and decided.worse + decided.better <= floor:
                row["task_verdict"] = "no change"
                row["task_reason"] = "within the baseline's own noise: " + row["task_reason"]


def analyse_tasks(run_dir: str | Path, baseline: dict | None = None, tolerances: Tolerances | None = None) -> pd.DataFrame:
    """Every cell's tasks against the run's baseline config (the selector of analysis.analyse)."""
    root = Path(run_dir)
    selector, tol = run_settings(RunStore(root).read_manifest(), baseline, tolerances)
    items = _items(root)
    cells = with_baselines(layer_cells(root), items.cell_id, selector, "task rows")
    cells["base_key"] = cells.baseline_cell_id.map(cells.set_index("cell_id").engine_key)
    return task_verdicts(cells, items, items, tol.task_alpha, noise=_noise(cells, items), tolerance=tol.task_tolerance)


def compare_task_runs(new_dir: str | Path, old_dir: str | Path, pairs: pd.DataFrame,
                      tolerances: Tolerances | None = None) -> pd.DataFrame:
    """NEW's cells against their partners in OLD; `pairs`: cell_id (NEW) -> baseline_cell_id (OLD),
    as compare_runs gives them."""
    new_root, old_root = Path(new_dir), Path(old_dir)
    _, tol = run_settings(RunStore(new_root).read_manifest(), {}, tolerances)
    cells = with_old_partners(new_root, old_root, pairs)
    old_cells, old_items = layer_cells(old_root), _items(old_root)
    cells["base_key"] = cells.baseline_cell_id.map(old_cells.set_index("cell_id").engine_key)
    return task_verdicts(cells, _items(new_root), old_items, tol.task_alpha, base_label=f"{old_root.name}'s",
                         noise=_noise(old_cells, old_items), tolerance=tol.task_tolerance)


def summarize_tasks(tv: pd.DataFrame) -> pd.DataFrame:
    """Per cell: task_verdict (regressed if any task regressed, else improved if any did, else not
    distinguishable if any task's test could not see a change of the tolerance's size, else no change; n/a
    only when no task was judged) and task_reason (the tasks that moved, or why none could be judged)."""
    rows = []
    for cid, g in tv.groupby("cell_id", sort=False):
        judged = g[g.task_verdict != "n/a"]
        verdict = next((v for v in ("regressed", "improved", "not distinguishable", "no change")
                        if (judged.task_verdict == v).any()), "n/a")
        shown = g[g.task_verdict.isin(("regressed", "improved"))] if verdict in ("regressed", "improved") else g
        reason = "; ".join(f"{t}: {v} ({r})" if v != "no change" else f"{t}: no change"
                           for t, v, r in zip(shown.task, shown.task_verdict, shown.task_reason))
        rows.append({"cell_id": cid, "task_verdict": verdict, "task_reason": reason})
    return pd.DataFrame(rows, columns=["cell_id", "task_verdict", "task_reason"])
