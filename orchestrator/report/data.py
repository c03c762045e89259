"""What both report formats share: one run loaded for reporting (stored cells joined with the
analysis), the caps on what one page holds, the cells a table shows, the Pareto frontier, and the
number formatting and counts both print. With `--against OLD`: the pairs of NEW and OLD
(orchestrator/judge/cross_run.py) and each configuration's move between the two runs' quality-vs-speed
points (`load_against`). The task layer (orchestrator/judge/task_verdicts.py) comes with both: its long
table (one row per cell and task) for the task panel and the task quality axes, and its per-cell
summary (task_verdict, task_reason) merged into the cells."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.matrix.cells import load_label
from orchestrator.store.manifest import Manifest
from orchestrator.store.run_store import RunStore
from orchestrator.store.schema import STATUSES
from orchestrator.values import finite

VERDICT_ORDER = ("identical", "lossless", "near-lossless", "lossy", "n/a")
_METRICS = ("verdict", "verdict_reason", "kl_mean", "max_abs", "greedy_match", "greedy_close", "top1", "ppl", "ppl_base",
            "ppl_rel", "noise_ppl_rel", "noise_kl_mean", "noise_max_abs", "noise_greedy_match", "speedup",
            "speedup_lo", "speedup_hi", "baseline_cell_id", "baseline_match")
# What one HTML page holds and a browser still opens: a larger run is aggregated or capped, and
# the page says so (the numbers of every cell: `bench compare RUN -o cells.parquet`, `bench export`).
# report_html.py and report_md.py read them as report_data.MAX_* on each call, so they can be lowered.
MAX_POINTS = 2000       # quality-vs-speed: above this, a density of all cells plus the Pareto frontier
MAX_SERIES = 24         # throughput/latency lines: the engine configs with the highest throughput
MAX_TABLE_CELLS = 2000  # cells table (and report.md): the Pareto frontier, then the fastest cells
MAX_LISTED = 50         # cells not ok, cells not placed: listed one by one up to this, else grouped
MAX_ARROWS = 500        # --against: moves drawn on the quality plot (the longest ones above this)


# ------------------------------------------------------------------ data



def first_line(text: Any, limit: int = 200) -> str:
    if not isinstance(text, str):
        return ""
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


@dataclass
class TaskLayer:
    """The task layer as the report shows it (orchestrator/judge/task_verdicts.py)."""
    table: pd.DataFrame         # one row per (cell, task): analyse_tasks or compare_task_runs, plus each
                                # cell's config, load_label and label as the cells frame has them
    error: str | None = None    # why the task analysis could not run (the table is then empty)

    @property
    def tasks(self) -> list[str]:
        return sorted(self.table.task.dropna().unique()) if len(self.table) else []


TASK_VERDICT_ORDER = ("regressed", "improved", "not distinguishable", "no change", "n/a")   # worst first: the order tables list them in


def no_task_layer(error: str | None = None) -> TaskLayer:
    return TaskLayer(pd.DataFrame(columns=["cell_id", "task", "task_verdict", "task_reason", "label"]), error)


def _task_layer(table: pd.DataFrame | None, error: str | None, cells: pd.DataFrame) -> TaskLayer:
    """The judged task table (judge_run's), labelled from `cells`; or why it could not be judged."""
    if table is None:
        return no_task_layer(first_line(error, 400) if error else None)
    tv = table.reset_index(drop=True)
    at = cells.drop_duplicates("cell_id").set_index("cell_id")
    for col in ("config", "load_label", "label"):
        tv[col] = tv.cell_id.map(at[col]) if col in at and len(tv) else None
    return TaskLayer(tv)


def load(run_dir: str | Path, tasks: bool = True) -> tuple[pd.DataFrame, Manifest, str | None, TaskLayer,
                                                          tuple[pd.DataFrame | None, str | None]]:
    """(one row per cell: stored columns + the verdicts of judge_run + the task summary, manifest, why the analysis
    failed or None, the task layer, (the sampling table or None, why not)). tasks=False skips the task analysis."""
    store = RunStore(run_dir)
    manifest = store.read_manifest()
    raw = store.read_cells()
    analysis_error = None
    verdicts = None
    try:
        from orchestrator.judge.verdicts import judge_run

        verdicts = judge_run(store.root, tasks=tasks, sampling=bool(manifest.sampling), keep_going=True)
        df = verdicts.cells
        extra = [c for c in raw.columns if c not in df.columns or c == "cell_id"]
        df = df.merge(raw[extra], on="cell_id", how="left")
    except Exception as e:  # the report must still show the speed numbers
        analysis_error = f"{type(e).__name__}: {first_line(str(e), 400)}"
        df = raw.copy()
        df["verdict"], df["verdict_reason"] = "n/a", "analysis unavailable"
    for col in _METRICS:
        if col not in df.columns:
            df[col] = "n/a" if col == "verdict" else np.nan
    for col in ("reason", "task_verdict", "task_reason"):
        if col not in df.columns:
            df[col] = None
    df = df.sort_values(["framework", "model", "quantization", "flags", *(["workload"] if "workload" in df else []),
                         "batch_size", "input_len", "output_len"], ignore_index=True, na_position="first")
    # column-wise, not a row-wise join (that alone took 18 s at 100k cells)
    df["config"] = (df["framework"].astype(str) + "/" + df["model"].astype(str) + "/"
                    + df["quantization"].astype(str) + "/" + df["flags"].astype(str)) if len(df) else ""
    df["config"] += np.where(df["mode"].isin(["serve", "stream"]), "/" + df["mode"].astype(str), "") if len(df) else ""
    df["config"] += _workload_suffix(df)
    df["load_label"] = [load_label(m, b, r, a) for m, b, r, a in zip(df["mode"], df.batch_size, df.request_rate, df.load)]
    multi_len = df[["input_len", "output_len"]].drop_duplicates().shape[0] > 1
    df["label"] = [f"{c} {lo}" + (f" in{i}/out{o}" if multi_len else "")
                   for c, lo, i, o in zip(df.config, df.load_label, df.input_len, df.output_len)]
    if verdicts is None:
        return df, manifest, analysis_error, no_task_layer(analysis_error if tasks else None), (None, analysis_error)
    layer = _task_layer(verdicts.tasks, verdicts.errors.get("tasks"), df) if tasks else no_task_layer()
    return df, manifest, analysis_error, layer, (verdicts.sampling, verdicts.errors.get("sampling"))


@dataclass
class Against:
    """NEW against OLD for the report (`bench report NEW --against OLD`)."""
    name: str                   # OLD's run name
    pairs: pd.DataFrame         # compare_runs(NEW, OLD): one row per cell of either run, plus config,
                                # load_label, label and each side's in-run speedup (old_/new_speedup)
    moves: pd.DataFrame         # the pairs placed in both runs: label, new_/old_ cell, speedup, kl_mean, verdict
    not_drawn: list[tuple[str, str]] = field(default_factory=list)   # (label, why) of pairs with no arrow
    error: str | None = None    # why compare_runs could not run (pairs is then empty)
    old_error: str | None = None  # why analyse(OLD) could not run (no moves then)
    tasks: TaskLayer | None = None  # compare_task_runs: each NEW cell's tasks against its partner in OLD


def _workload_suffix(df: pd.DataFrame) -> Any:
    """' [name]' for a cell of a named workload (matrix workloads): each workload is its own config,
    since its speed is its own; '' for the single workload section."""
    if not len(df) or "workload" not in df:
        return ""
    name = df["workload"]
    return np.where(name.notna(), " [" + name.astype(str) + "]", "")


def _labels(df: pd.DataFrame) -> None:
    """config, load_label and label columns, as `load` makes them, on a frame with the axes."""
    mode = df["mode"].fillna("offline") if "mode" in df else pd.Series("offline", index=df.index)
    df["config"] = (df["framework"].astype(str) + "/" + df["model"].astype(str) + "/" + df["quantization"].astype(str)
                    + "/" + df["flags"].astype(str) + np.where(mode.isin(["serve", "stream"]), "/" + mode.astype(str), "")) if len(df) else ""
    df["config"] += _workload_suffix(df)
    arrival = df["load"] if "load" in df else pd.Series(None, index=df.index)
    df["load_label"] = [load_label(m, int(b), r if finite(r) else None, a if isinstance(a, str) else None)
                        for m, b, r, a in zip(mode, df.batch_size, df.request_rate, arrival)]
    multi_len = df[["input_len", "output_len"]].drop_duplicates().shape[0] > 1
    df["label"] = [f"{c} {lo}" + (f" in{i}/out{o}" if multi_len else "")
                   for c, lo, i, o in zip(df.config, df.load_label, df.input_len, df.output_len)]


def load_against(new_df: pd.DataFrame, new_root: str | Path, old_root: str | Path,
                 match: list[str] | None = None) -> Against:
    """NEW (already loaded: `new_df`) against OLD: compare_runs' pairs, and for every pair placed on
    the quality plot in both runs (a speedup and a KL against its own run's baseline, from
    analyse(OLD) and analyse(NEW)) the move from its OLD point to its NEW one. A --match that does
    not pair cells one to one raises cross_run.MatchError; any other failure is said in the report."""
    from orchestrator.judge.cross_run import MatchError
    from orchestrator.judge.verdicts import judge_run

    old_df, old_manifest, old_error, *_ = load(old_root, tasks=False)   # OLD's own task verdicts are not shown
    name = str(old_manifest.run_id or Path(old_root).name)
    error, verdicts = None, None
    try:   # what `bench compare NEW --against OLD` judges, every layer
        verdicts = judge_run(new_root, against=old_root, match=match, keep_going=True)
        pairs = verdicts.cells
    except MatchError:
        raise
    except Exception as e:  # the rest of the report still stands
        error = f"{type(e).__name__}: {first_line(str(e), 400)}"
        pairs = pd.DataFrame(columns=["cell_id", "only_in", "baseline_cell_id", "verdict", "verdict_reason", "load"])
    if len(pairs):
        _labels(pairs)
        pairs["only_in"] = pairs.only_in.where(pairs.only_in.notna(), None)
        links = pairs.loc[pairs.only_in.isna(), ["cell_id", "baseline_cell_id"]]
        new_ids, old_ids = links.cell_id.tolist(), links.baseline_cell_id.tolist()
    elif match:  # no pairs to go by: with --match the cell ids do not pair either
        new_ids, old_ids = [], []
    else:  # compare_runs failed: the arrows still pair by cell id
        new_ids = old_ids = sorted(set(new_df.cell_id) & set(old_df.cell_id))
    new_at, old_at = new_df.set_index("cell_id"), old_df.set_index("cell_id")
    if len(pairs):
        is_new = pairs.only_in.isna() | (pairs.only_in == "new")
        pairs["new_speedup"] = pairs.cell_id.map(new_at.speedup).where(is_new)
        pairs["old_speedup"] = pairs.baseline_cell_id.map(old_at.speedup).where(pairs.only_in != "new")

    # column-wise: a large run has 100k pairs
    cols = ["label", "speedup", "speedup_lo", "speedup_hi", "kl_mean", "verdict", "verdict_reason"]
    j = pd.concat([pd.DataFrame({"new_cell": new_ids, "old_cell": old_ids}),
                   new_at.reindex(new_ids)[cols].reset_index(drop=True).add_prefix("new_"),
                   old_at.reindex(old_ids)[cols].reset_index(drop=True).add_prefix("old_")], axis=1)
    for side in ("new", "old"):
        for c in ("speedup", "speedup_lo", "speedup_hi", "kl_mean"):
            j[f"{side}_{c}"] = pd.to_numeric(j[f"{side}_{c}"], errors="coerce").astype(float)
    in_new, in_old = ((np.isfinite(j[f"{s}_speedup"]) & (j[f"{s}_speedup"] > 0) & np.isfinite(j[f"{s}_kl_mean"]))
                      for s in ("new", "old"))
    moves = j[in_new & in_old].rename(columns={"new_label": "label", "new_kl_mean": "new_kl", "old_kl_mean": "old_kl"})
    moves = moves[["label", "new_cell", "old_cell", "new_speedup", "new_kl", "new_verdict", "old_speedup",
                   "old_speedup_lo", "old_speedup_hi", "old_kl", "old_verdict"]].reset_index(drop=True)
    not_drawn = [(label, f"no speedup or KL in {name}" + (f" ({first_line(why, 120)})" if isinstance(why, str) else ""))
                 for label, why in zip(j.new_label[in_new & ~in_old], j.old_verdict_reason[in_new & ~in_old])]
    not_drawn += [(label, "no speedup or KL in this run") for label in j.new_label[in_old & ~in_new]]
    if len(pairs):
        lone = pairs[pairs.only_in.notna()]
        not_drawn += [(label, "only in this run" if side == "new" else f"only in {name}")
                      for label, side in zip(lone.label, lone.only_in)]
    tasks = _task_layer(verdicts.tasks, verdicts.errors.get("tasks"), new_df) if verdicts is not None else \
        no_task_layer(f"no pairs ({error})")
    for col in ("task_verdict", "task_reason", "sampling_verdict"):
        if len(pairs):   # a row of a cell in OLD only carries OLD's cell id, which is no NEW cell
            pairs[col] = pairs[col].where(pairs.only_in != "old", None) if col in pairs else None
    return Against(name, pairs, moves, not_drawn, error, old_error, tasks)


def pareto_front(speedup: np.ndarray, quality: np.ndarray, higher_is_better: bool = False) -> np.ndarray:
    """Mask of the points no other point dominates: speedup >= and quality at least as good (KL: <=,
    the default; a task score: >=, higher_is_better), one of them strictly."""
    speedup, quality = np.asarray(speedup, dtype=float), np.asarray(quality, dtype=float)
    kl = -quality if higher_is_better else quality   # below, lower is better
    on = np.zeros(len(speedup), dtype=bool)
    best_kl, best_s = math.inf, math.nan
    for i in np.lexsort((kl, -speedup)):  # fastest first; equal speed: lowest KL first
        if kl[i] < best_kl:
            on[i], best_kl, best_s = True, kl[i], speedup[i]
        elif kl[i] == best_kl and speedup[i] == best_s:  # an exact tie with a frontier point
            on[i] = True
    return on


def table_cells(df: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The cells the per-cell tables show, and what was left out (empty when every cell is shown):
    at most MAX_TABLE_CELLS, the Pareto frontier first, then the fastest cells by speedup."""
    if len(df) <= MAX_TABLE_CELLS:
        return df, ""
    placed = df.speedup.map(finite) & df.kl_mean.map(finite)
    front = pd.Series(False, index=df.index)
    if placed.any():
        front[placed] = pareto_front(df.speedup[placed].to_numpy(), df.kl_mean[placed].to_numpy())
    speed = df.speedup.where(df.speedup.map(finite), -np.inf)
    order = pd.DataFrame({"f": ~front, "s": -speed}).sort_values(["f", "s"], kind="stable").index
    shown = df.loc[sorted(order[:MAX_TABLE_CELLS])]
    note = (f"This run has {len(df):,} cells, more than one page can hold: the table shows {len(shown):,} of them, "
            f"the {int(front.sum())} on the Pareto frontier and then the fastest by speedup; the engine-config table "
            f"aggregates every cell, and every cell's numbers are in `bench compare RUN -o cells.parquet` "
            f"or `bench export RUN`.")
    return shown, note


# ------------------------------------------------------------------ formatting

def num(v: Any, spec: str = ".3g") -> str:
    return format(v, spec) if finite(v) else ""


def sci(v: Any) -> str:
    if not finite(v):
        return ""
    return "0" if v == 0 else (f"{v:.3g}" if 1e-2 <= abs(v) < 1e4 else f"{v:.2e}")


def ttft_disagrees(r: dict) -> bool:
    """Our TTFT and the engine's own differ by more than the contract's margin (1 ms or 10%)."""
    v = r.get("engine_ttft_agrees")
    return v is not None and not pd.isna(v) and not bool(v)


def ttft_text(r: dict) -> str:
    return num(r["ttft_ms_p50"], ".1f") + (" ⚑" if ttft_disagrees(r) else "")


def why_text(r: dict) -> str:
    if r["status"] != "ok":
        return first_line(r.get("reason")) or str(r["status"])
    return str(r["verdict_reason"]) if isinstance(r["verdict_reason"], str) else ""


def ratio_text(r: dict, name: str) -> str:
    """A NEW/OLD ratio of compare_runs with its 95% interval: '1.15x [0.81, 1.65]'."""
    v, lo, hi = r.get(f"{name}_ratio"), r.get(f"{name}_lo"), r.get(f"{name}_hi")
    if not finite(v):
        return ""
    return f"{v:.3g}x" + (f" [{lo:.3g}, {hi:.3g}]" if finite(lo) and finite(hi) else " [no interval]")




def call_text(r: dict, name: str) -> str:
    c = r.get(f"{name}_call")
    return c if isinstance(c, str) else ""


def moved_text(r: dict) -> str:
    """A pair's in-run speedup, OLD -> NEW: '0.90x → 1.20x'."""
    a, b = r.get("old_speedup"), r.get("new_speedup")
    if not (finite(a) or finite(b)):
        return ""
    return " → ".join(f"{v:.2f}x" if finite(v) else "-" for v in (a, b))


def against_rows(pairs: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The pairs the against tables show, and what was left out: at most MAX_TABLE_CELLS, the worst
    first (verdict, then a slowdown in tok/s, TTFT p99 or TPOT p50, then cells in one run only)."""
    if len(pairs) <= MAX_TABLE_CELLS:
        return pairs, ""
    rank = {"lossy": 0, "n/a": 1, "near-lossless": 2, "lossless": 3, "identical": 4}
    slower = sum((pairs[f"{n}_call"] == "slower").astype(int) for n in ("tok_s", "ttft_p99", "tpot_p50"))
    order = pd.DataFrame({"v": pairs.verdict.map(rank).fillna(1), "s": -slower, "o": pairs.only_in.isna()}) \
        .sort_values(["v", "s", "o"], kind="stable").index
    shown = pairs.loc[sorted(order[:MAX_TABLE_CELLS])]
    return shown, (f"{len(pairs):,} pairs are more than one page can hold: the table shows {len(shown):,}, the "
                   "worst verdicts and the slowdowns first; every pair is in "
                   "`bench compare NEW --against OLD -o pairs.parquet`.")


def against_counts(pairs: pd.DataFrame, name: str) -> str:
    """'3 pairs: 2 identical, 1 lossless; tok/s 1 faster, 2 no difference; 1 only in this run'."""
    both = pairs[pairs.only_in.isna()]
    verdicts = ", ".join(f"{n} {v}" for v, n in count_verdicts(both).items() if n) if len(both) else ""
    calls = both.tok_s_call.dropna().value_counts() if "tok_s_call" in both else pd.Series(dtype=int)
    text = f"{len(both):,} pair(s)" + (f": {verdicts}" if verdicts else "")
    if len(calls):
        text += "; tok/s " + ", ".join(f"{int(n)} {c}" for c, n in calls.items())
    for side, who in (("new", "this run"), ("old", name)):
        n = int((pairs.only_in == side).sum())
        if n:
            text += f"; {n} only in {who}"
    return text


def count_statuses(df: pd.DataFrame) -> dict[str, int]:
    counts = df.status.value_counts().to_dict()
    return {s: int(counts.pop(s, 0)) for s in STATUSES} | {str(k): int(v) for k, v in counts.items()}


def count_verdicts(df: pd.DataFrame) -> dict[str, int]:
    counts = df.verdict.value_counts().to_dict()
    return {v: int(counts.get(v, 0)) for v in VERDICT_ORDER}


# ------------------------------------------------------------------ the task layer

TEST_NAMES = {"mcnemar-exact": "McNemar exact", "paired-bootstrap": "paired bootstrap",
              "paired-permutation": "paired permutation"}


def ci_text(r: dict, name: str, spec: str) -> str:
    """A task figure with its 95% interval: '0.568 [0.475, 0.656]' (no interval: the figure alone)."""
    v, lo, hi = r.get(name), r.get(f"{name}_lo"), r.get(f"{name}_hi")
    if not finite(v):
        return ""
    return f"{format(v, spec)} [{format(lo, spec)}, {format(hi, spec)}]" if finite(lo) and finite(hi) \
        else format(v, spec)


def is_judged(r: dict) -> bool:
    return r.get("task_verdict") in ("no change", "not distinguishable", "improved", "regressed")


def p_text(r: dict) -> str:
    return format(r["p_value"], ".3g") if is_judged(r) and finite(r.get("p_value")) else ""


def q_text(r: dict) -> str:
    """A task row's q (its p adjusted over the run's task tests, orchestrator/judge/families.py), as printed."""
    return format(r["q_value"], ".3g") if is_judged(r) and finite(r.get("q_value")) else ""


def speed_q_text(r: dict) -> str:
    """A speed row's q (its p adjusted over the run's speed tests, orchestrator/judge/speed.py) and, where its
    interval is the paired t (repeats taken in turns with its baseline's), `paired`: `q=0.003 paired `; empty for
    the baseline against itself and where there is no test."""
    if not finite(r.get("speed_q")) or r.get("cell_id") == r.get("baseline_cell_id"):
        return ""
    return f"q={r['speed_q']:.2g} " + ("paired " if r.get("speed_test") == "paired t" else "")


def moved_items_text(r: dict) -> str:
    """Items that moved against the baseline: '20 worse / 0 better of 111'."""
    if not is_judged(r) or not finite(r.get("n_paired")):
        return ""
    return f"{int(r['worse'])} worse / {int(r['better'])} better of {int(r['n_paired'])}"


def task_rows(tv: pd.DataFrame, task: str) -> tuple[pd.DataFrame, str]:
    """One task's rows as the tables list them: the regressions first, then the improvements, no
    change and n/a, each by cell label; at most MAX_TABLE_CELLS, and what was left out."""
    g = tv[tv.task == task].copy()
    rank = {v: i for i, v in enumerate(TASK_VERDICT_ORDER)}
    g["_rank"] = g.task_verdict.map(rank).fillna(len(rank))
    g = g.sort_values(["_rank", "label"], kind="stable").drop(columns="_rank")
    if len(g) <= MAX_TABLE_CELLS:
        return g, ""
    return g.head(MAX_TABLE_CELLS), (f"{len(g):,} cells ran {task}, more than one page can hold: the table shows "
                                     f"{MAX_TABLE_CELLS:,}, the regressions first; every row is in "
                                     "`bench compare RUN` (its task table).")


def task_counts(tv: pd.DataFrame, task: str) -> str:
    """'acc, n=111 items: 1 regressed, 2 no change' (n as a range where cells scored different counts)."""
    g = tv[tv.task == task]
    metrics = ", ".join(sorted(str(m) for m in g["metric"].dropna().unique())) if "metric" in g else ""
    n = pd.to_numeric(g["n"], errors="coerce").dropna() if "n" in g else pd.Series(dtype=float)
    items = "" if n.empty else (f"n={int(n.min())}" if n.min() == n.max() else f"n={int(n.min())}–{int(n.max())}")
    counts = g.task_verdict.value_counts()
    verdicts = ", ".join(f"{int(counts[v])} {v}" for v in TASK_VERDICT_ORDER if counts.get(v, 0))
    head = ", ".join(x for x in (metrics, f"{items} items" if items else "") if x)
    return f"{head}; {len(g):,} cell(s): {verdicts}" if head else f"{len(g):,} cell(s): {verdicts}"


def count_task_verdicts(df: pd.DataFrame) -> dict[str, int]:
    """Cells per summarised task verdict (cells without task rows are not counted)."""
    counts = df["task_verdict"].value_counts().to_dict() if "task_verdict" in df else {}
    return {v: int(counts.get(v, 0)) for v in TASK_VERDICT_ORDER}


def no_tasks_text(manifest: Manifest) -> str:
    """What the report says where a run has no task rows."""
    if manifest.tasks:
        return "The matrix has a tasks section, but no cell stored task rows."
    return "No task rows: the matrix had no tasks section (add `tasks:` to it to score task sets in every cell)."
