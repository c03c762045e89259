"""The task layer under the null: how many `improved` / `regressed` words chance alone says, per test and at the
family level (orchestrator/judge/families.py). The study: benchmarks/studies/task-null.md.

The items are real: a stored run's baseline items (default tests/data/golden/runs/new: the built-in tiny model's
tiny-ending, acc, and tiny-lastword, regex_match; 111 items each, read from its Parquet). Each repetition makes
a baseline and CELLS null cells, each a relabelled copy of the stored items: drawn from them with replacement (a
bootstrap resample), so every cell's expected figure equals the baseline's and only chance moves an item (the
baseline is one such draw too: with it held fixed, McNemar's test sees half the variance it assumes and almost
never calls). The judge's own task_verdicts then judges every (cell, task) against the one shared baseline, as
`bench compare` does (the tests are dependent through it, as a run's are), and the study counts the words:

    before   tests with p < task_alpha (the per-test rule the judge used until issue 40)
    after    the judge's verdicts: q < task_alpha, q adjusted over the run's task tests (Benjamini-Hochberg)

Under the complete null every call is false: the family's false discovery rate is the share of repetitions with
any call, and "after" must hold the mean share of the family called at most alpha.

    .venv/bin/python benchmarks/task_null.py                 # 30 cells x 2 tasks, 20 repetitions
    .venv/bin/python benchmarks/task_null.py --quick         # 30 cells x 2 tasks, 2 repetitions
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.judge.task_verdicts import task_verdicts  # noqa: E402
from orchestrator.matrix.models import AXES, Tolerances  # noqa: E402
from orchestrator.store.run_store import RunStore  # noqa: E402

COLUMNS = ["cell_id", "task", "metric", "item_index", "score", "score_weight", "aggregation", "higher_is_better"]


def baseline_items(run: Path) -> pd.DataFrame:
    """The first cell's stored items (every cell of the golden run scores them alike)."""
    t = RunStore(run).read_tasks(COLUMNS).to_pandas()
    t["aggregation"] = t["aggregation"].fillna("mean")
    t["higher_is_better"] = t["higher_is_better"].fillna(True).astype(bool)
    first = sorted(t.cell_id.unique())[0]
    return t[t.cell_id == first].assign(cell_id="base").reset_index(drop=True)


def null_cells(base: pd.DataFrame, n_cells: int, rng: np.random.Generator) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(cells, items): the baseline and n_cells cells, each a relabelled copy of the stored items (resampled with
    replacement): the baseline is one draw too, so each test is null over repetitions, and all share it."""
    cells, items = [], []
    for i in range(n_cells + 1):
        cid = "base" if i == 0 else f"null{i:03d}"
        cells.append({"cell_id": cid, **{a: None for a in AXES}, "framework": "hf", "model": "tiny",
                      "quantization": "fp32", "flags": f"f{i:03d}", "batch_size": 1, "mode": "offline",
                      "status": "ok", "missing": None, "baseline_cell_id": "base", "baseline_match": "exact",
                      "base_key": None})
        for _, g in base.groupby("task"):
            draw = g.iloc[rng.integers(0, len(g), len(g))]
            items.append(g.assign(cell_id=cid, score=draw.score.to_numpy()))
    return pd.DataFrame(cells), pd.concat(items, ignore_index=True)


def repetition(base: pd.DataFrame, n_cells: int, alpha: float, seed: int) -> dict:
    cells, items = null_cells(base, n_cells, np.random.default_rng(seed))
    tv = task_verdicts(cells, items, items, alpha)
    tested = tv[tv.cell_id != "base"]
    return {"seed": seed, "family": len(tested), "before": int((tested.p_value < alpha).sum()),
            "after": int(tested.task_verdict.isin(("improved", "regressed")).sum()),
            "min_p": float(tested.p_value.min()), "min_q": float(tested.q_value.min()),
            "level": float(tested.family_level.iloc[0])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 repetitions (CI's end-to-end check)")
    ap.add_argument("--cells", type=int, default=30, help="null cells per repetition (x the run's tasks)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--run", type=Path, default=ROOT / "tests" / "data" / "golden" / "runs" / "new")
    args = ap.parse_args()
    reps = 2 if args.quick else args.reps
    alpha = Tolerances().task_alpha
    base = baseline_items(args.run)
    rows = pd.DataFrame([repetition(base, args.cells, alpha, seed) for seed in range(reps)])
    m = int(rows.family.iloc[0])
    print(f"null task study: {args.cells} cells x {base.task.nunique()} tasks ({', '.join(sorted(base.task.unique()))}"
          f", {len(base) // base.task.nunique()} real items each from {args.run.name}) = {m} comparisons per "
          f"repetition, {reps} repetitions, alpha {alpha}")
    print(rows.to_string(index=False))
    print()
    print("words       | mean calls per repetition | mean share of the family | repetitions with any call")
    for col in ("before", "after"):
        share = (rows[col] / rows.family).mean()
        print(f"{col:<11} | {rows[col].mean():25.2f} | {share:24.4f} | {(rows[col] > 0).sum()} of {reps}")
    after = float((rows.after / rows.family).mean())
    if after > alpha:
        print(f"FAIL: the family's calls under the null, {after:.4f} of it, exceed alpha {alpha}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
