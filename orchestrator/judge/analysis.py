"""`bench compare RUN`: every cell of a run against its baseline cell, computed from the stored
Parquet alone (no engine is involved, so it can be re-run with other settings):

    bench compare RUN [--baseline "framework=hf,quantization=fp32"] [--tolerances "atol=1e-4,kl_near=0.02"]
        df = analyse(RUN, baseline=parse_selector(sel) if sel else None,
                     tolerances=parse_tolerances(tol, base=None) if tol else None)
        rich.print(compare_table(df))          # orchestrator/report/console.py; df.to_parquet(...) keeps every column

Which cell is whose baseline: orchestrator/matrix/baselines.py; the logit and text metrics and the
verdict words: orchestrator/judge/logits.py; the speed figures: orchestrator/judge/speed.py.
`bench gate` checks these verdicts against a policy file: orchestrator/judge/gate.py.
Without arguments the baseline selector and the tolerances come from manifest.json ("matrix").
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd

from orchestrator.matrix.baselines import CONFIG_AXES, noise_pairs, resolve_baselines
from orchestrator.judge.logits import NOISE_METRICS, journal_layouts, judge, pair_metrics, reference_rows
from orchestrator.judge.speed import add_speed
from orchestrator.matrix.models import AXES, Matrix, Tolerances
from orchestrator.store.manifest import Manifest
from orchestrator.store.run_store import RunStore
from orchestrator.store.schema import CELLS_SCHEMA

_DUCKDB_MEMORY = "3GB"       # the whole analysis must stay under 4 GiB


def run_settings(manifest: Manifest, baseline: dict | None, tolerances: Tolerances | None) -> tuple[dict, Tolerances]:
    """The baseline selector and the tolerances: the ones given, else the run's matrix's."""
    if baseline is None:
        baseline = manifest.baseline or Matrix.model_fields["baseline"].default_factory()
    if tolerances is None:
        tolerances = manifest.tolerances
    unknown = sorted(set(baseline) - set(AXES))
    if unknown:
        raise ValueError(f"baseline: unknown axis {unknown} (known: {', '.join(AXES)})")
    return baseline, tolerances


# The cells columns the analysis returns; per-request lists and JSON blobs stay in the store.
_CELL_COLUMNS = [c for c in CELLS_SCHEMA.names if c not in (
    "flags_json", "workload_json", "ttft_ms", "tpot_ms", "e2e_ms", "engine_ttft_ms", "versions", "engine_args",
    "env_facts")]


@contextlib.contextmanager
def duckdb_connection():
    with tempfile.TemporaryDirectory(prefix="bench-analysis-") as tmp:
        con = duckdb.connect(config={"memory_limit": _DUCKDB_MEMORY, "temp_directory": tmp,
                                     "preserve_insertion_order": False})
        # the hand-written join order is the cheap one; estimates over many small files are not
        con.execute("SET disabled_optimizers = 'join_order'")
        con.execute("SET enable_progress_bar = false")   # it would draw on the terminal of bench compare
        try:
            yield con
        finally:
            con.close()


def read_run_cells(con, root: Path) -> pd.DataFrame:
    # the store picks each cell's newest copy, per-cell or compacted (a few files once compacted)
    cells = con.from_arrow(RunStore(root).read_cells_table(_CELL_COLUMNS)).df()   # DuckDB's pandas types
    for col in cells.columns[cells.dtypes == "str"]:  # Python strings: the per-cell loops below iterate them
        cells[col] = cells[col].astype(object).where(cells[col].notna(), None)
    # an SLO search's probes are load points without outputs: its own row carries them (orchestrator/judge/searches.py)
    cells = cells[cells["search_probe"].isna()]
    cells = cells.sort_values("cell_id", ignore_index=True)
    # rows from before serving mode (and hand-made ones) are offline cells
    cells["mode"] = cells["mode"].fillna("offline")
    cells["load"] = cells["load"].fillna("batch")
    missing = cells["engine_key"].isna()
    if missing.any():  # only where none was stored (a row-wise join is slow at 100k cells)
        cells.loc[missing, "engine_key"] = cells.loc[missing, list(CONFIG_AXES)].astype(str).fillna("None") \
            .agg("/".join, axis=1)
    return cells


def cells_logprob_files(root: Path, cells: pd.DataFrame) -> dict[str, str]:
    """cell_id -> the file with its logprobs (its own, or a compacted one shared with other cells:
    rows are then selected by cell_id and file, since a compacted file may also hold an older copy
    of a cell stored again since). Only cells that captured rows have one."""
    files = RunStore(root).logprob_files()
    return {cid: str(files[cid]) for cid in cells.cell_id if cid in files}


def analyse(run_dir: str | Path, baseline: dict | None = None, tolerances: Tolerances | None = None) -> pd.DataFrame:
    """One row per cell: axes, status, verdict, reason, quality metrics, noise floors and speed."""
    root = Path(run_dir)
    manifest = RunStore(root).read_manifest()
    baseline, tolerances = run_settings(manifest, baseline, tolerances)
    with duckdb_connection() as con:
        cells = read_run_cells(con, root)
        files = cells_logprob_files(root, cells)
        cells["has_logprobs"] = cells.cell_id.isin(files)
        comparable = cells[(cells.status == "ok") & cells.has_logprobs]
        cells["baseline_cell_id"], cells["baseline_match"] = resolve_baselines(cells, comparable, baseline)

        # one pairs table, so each logprobs file is read about once for all comparisons
        base = cells[cells.cell_id.isin(comparable.cell_id) & cells.baseline_cell_id.notna()]
        pairs = pd.concat([
            pd.DataFrame({"kind": "base", "key": base.cell_id, "a_cell": base.baseline_cell_id, "a_rep": 0,
                          "b_cell": base.cell_id, "b_rep": 0}),
            noise_pairs(comparable),
        ], ignore_index=True).astype({"a_rep": "int16", "b_rep": "int16"})
        pairs["pair_id"] = np.arange(len(pairs), dtype=np.int64)
        located = {c: v for c, v in RunStore(root).layout().compacted_rows().items() if files.get(c) == str(v[0])}
        pm = pair_metrics(con, pairs, files, tolerances.atol, reference_rows(manifest.measure), located,
                          journal_layouts(root))
    pm["abs_ppl_rel"] = pm["ppl_rel"].abs()

    df = cells.merge(pm[pm.kind == "base"].drop(columns=["kind", "a_cell", "a_rep", "a_file", "b_cell", "b_rep", "b_file",
                                                         "pair_id"])
                     .rename(columns={"key": "cell_id"}), on="cell_id", how="left")
    add_speed(df, cells, tolerances.speed_tolerance)
    judge(df, pm, df.baseline_cell_id.map(cells.set_index("cell_id").engine_key), tolerances, own_floors=True)
    return _order(df)


KL_INTERVAL = ("bootstrap percentile 95% over the scoring prompts (10,000 resamples, seeded; each prompt one item: "
               "its KL sum over the mean positions per prompt, whose mean is the position-weighted KL mean)")


def kl_intervals(run_dir: str | Path, baselines: dict[str, str]) -> dict[str, dict]:
    """cell_id -> the KL mean of that cell against its cell in `baselines` (another cell of the same run; repeat 0 of
    each, as analyse pairs them) with its 95% interval over the scoring prompts, every pair read in one pass: each
    prompt's positions are one item (positions within a prompt are not independent), the figure is the
    position-weighted mean, and the interval is the judge's one for a task figure (task_stats.score_interval: the
    bootstrap percentile interval, 10,000 resamples of the prompts, seeded; the denominator held at the run's
    positions per prompt, which the scoring prompts share unless one is short).
    Each: {kl_mean, kl_lo, kl_hi, n_prompts, n_positions, kl_interval}; the bounds None with fewer than 2 prompts."""
    from orchestrator.judge.task_stats import score_interval

    root = Path(run_dir)
    manifest = RunStore(root).read_manifest()
    per_prompt: list[pd.DataFrame] = []
    asked = list(baselines.items())
    with duckdb_connection() as con:
        files = cells_logprob_files(root, read_run_cells(con, root))
        found = [(i, c, b) for i, (c, b) in enumerate(asked) if c in files and b in files]
        pairs = pd.DataFrame({"pair_id": [i for i, _, _ in found], "a_cell": [b for *_, b in found],
                              "a_rep": 0, "b_cell": [c for _, c, _ in found], "b_rep": 0}
                             ).astype({"pair_id": "int64", "a_rep": "int16", "b_rep": "int16"})
        located = {c: v for c, v in RunStore(root).layout().compacted_rows().items() if files.get(c) == str(v[0])}
        if found:
            pair_metrics(con, pairs, files, 0.0, reference_rows(manifest.measure), located, journal_layouts(root),
                         per_prompt=per_prompt)
    rows = pd.concat(per_prompt, ignore_index=True) if per_prompt else pd.DataFrame(
        columns=["pair_id", "n_common", "sum_kl"])
    rows = rows[rows.n_common > 0]
    out = {}
    for i, (cell_id, _) in enumerate(asked):
        mine = rows[rows.pair_id == i]
        one = {"kl_mean": None, "kl_lo": None, "kl_hi": None, "n_prompts": len(mine),
               "n_positions": int(mine.n_common.sum()) if len(mine) else 0, "kl_interval": KL_INTERVAL}
        if len(mine):
            # each prompt's KL sum over the mean positions per prompt: their mean is the position-weighted KL mean
            per = (mine.sum_kl * len(mine) / mine.n_common.sum()).to_numpy(dtype=float)
            one["kl_mean"] = float(mine.sum_kl.sum() / mine.n_common.sum())
            if len(mine) >= 2:
                lo, hi = score_interval(per, binary=False, aggregation="mean")
                one["kl_lo"], one["kl_hi"] = float(lo), float(hi)
        out[cell_id] = one
    return out


def _order(df: pd.DataFrame) -> pd.DataFrame:
    first = ["cell_id", *AXES, "engine_key", "status", "verdict", "verdict_reason", "baseline_cell_id", "baseline_match",
             "max_abs", "mean_abs", "frac_over_atol", "kl_mean", "kl_max", "top1", "greedy_match", "greedy_close",
             "first_div_min", "first_div_mean", "ppl", "ppl_base", "ppl_rel", "identical",
             *[f"noise_{c}" for c in NOISE_METRICS], "rr_max_abs", "rr_kl_mean", "rr_identical",
             "bi_max_abs", "bi_kl_mean", "bi_identical", "speedup", "speedup_lo", "speedup_hi", "speed_call",
             "speedup_n_cell", "speedup_n_base", "ttft_ratio",
             "mem_saving", "n_positions", "n_gen_prompts", "n_gen_tokens", "token_mismatch"]
    rest = [c for c in df.columns if c not in first and c != "abs_ppl_rel"]
    return df[first + rest].sort_values([*AXES, "cell_id"], kind="stable", ignore_index=True)
