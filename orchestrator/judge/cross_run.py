"""A new run against a stored one: `bench compare NEW --against OLD` (and the cross-run gate).

Cells pair by cell_id (ids are stable across runs), or with `match` by the named axes where the
matrices differ. Each pair is judged as a cell against its baseline within one run
(orchestrator/judge/analysis.py): NEW's logprobs against OLD's, on every layer both captured, with OLD's
own noise floor (its engine's run-to-run and batch-invariance pairs). Speed: NEW/OLD ratios of output
tokens/s and of TTFT and TPOT p50/p99, each with the Welch t interval on the log ratio of the two
runs' repeats (per timed batch: throughput, and each batch's own percentiles), widened by the
run-to-run noise, and a call (orchestrator/judge/speed.py: faster, slower, no difference, not
distinguishable). The repeats inside a run do not see how two runs of the same cells differ (a busy
host), so the noise comes from a repeat of OLD (`noise_run`) or from the history: the other runs of
the same configurations under a results root that started before NEW and recorded no change against
OLD's cells. Without either, every call is "cannot judge" (no run-to-run noise estimate). Peak memory as
a ratio without an interval (one peak per cell). A ratio is that of the two runs' geometric means over
their repeats (the interval's center), or of the cells' own figures where a side has one repeat.
What changed: the provenance of the two cells
(library versions, engine arguments as resolved, the model's fingerprint, the host: CPU, GPUs,
driver, the workload). A cell present in only one run is a row that says so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from adapters.contract.intervals import run_noise
from orchestrator.judge.analysis import cells_logprob_files, duckdb_connection, read_run_cells, run_settings
from orchestrator.matrix.baselines import CONFIG_AXES, axis_value, noise_pairs
from orchestrator.judge.logits import journal_layouts, judge, pair_metrics, reference_rows
from orchestrator.judge.speed import family_calls, speed_intervals, speed_p
from orchestrator.matrix.models import AXES, Tolerances
from orchestrator.store.run_store import RunStore
from orchestrator.store.schema import JSON_COLUMNS, json_value

# (name, cells column, its per-repeat samples, larger is better)
SPEED = (
    ("tok_s", "output_tok_s", "output_tok_s_runs", True),
    ("ttft_p50", "ttft_ms_p50", "ttft_ms_p50_runs", False),
    ("ttft_p99", "ttft_ms_p99", "ttft_ms_p99_runs", False),
    ("tpot_p50", "tpot_ms_p50", "tpot_ms_p50_runs", False),
    ("tpot_p99", "tpot_ms_p99", "tpot_ms_p99_runs", False),
)
# provenance compared between the two cells of a pair (JSON columns are compared key by key)
_PROVENANCE = ("model_fingerprint", "versions", "engine_args", "host", "workload_json", "flags_json", "device",
               "mem_source", "batch_mode", "env_facts")


# facts of how a run went rather than what ran (a conversion found in the cache or made anew)
_INCIDENTAL = ("cache_hit",)


class MatchError(ValueError):
    """--match names axes that do not identify one cell per run."""


def _flat(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}", v, out)
    else:
        out[prefix] = value


def provenance_changes(old: dict, new: dict) -> list[str]:
    """'key: old -> new' for every provenance fact that differs (JSON blobs key by key)."""
    a, b = {}, {}
    for col in _PROVENANCE:
        for side, row in ((a, old), (b, new)):
            v = row.get(col)
            if isinstance(v, float) and v != v:   # pandas' null
                v = None
            if col in JSON_COLUMNS:   # compared key by key
                parsed = json_value(v)
                v = v if parsed is None else parsed
            _flat(col, v, side)
    return [f"{k}: {a.get(k, '(none)')} -> {b.get(k, '(none)')}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and not k.endswith(_INCIDENTAL)]


def _pair_keys(cells: pd.DataFrame, match: list[str] | None, side: str) -> pd.Series:
    if not match:
        return cells.cell_id
    keys = pd.Series([tuple(axis_value(a, getattr(r, a)) for a in match)
                      for r in cells[match].itertuples(index=False)], index=cells.index)
    dup = keys[keys.duplicated(keep=False)]
    if len(dup):
        shown = ", ".join(f"{a}={v}" for a, v in zip(match, dup.iloc[0]))
        raise MatchError(f"--match {','.join(match)}: {int((keys == dup.iloc[0]).sum())} cells of {side} share "
                         f"{shown}; name more axes (known: {', '.join(AXES)})")
    return keys


def provenance_columns(root: Path) -> pd.DataFrame:
    cols = ["cell_id", *_PROVENANCE]
    return RunStore(root).read_cells_table(cols).to_pandas().set_index("cell_id")


def compare_runs(new_dir: str | Path, old_dir: str | Path, match: list[str] | None = None,
                 tolerances: Tolerances | None = None, noise_run: str | Path | None = None,
                 history: str | Path | None = None) -> pd.DataFrame:
    """One row per cell of either run: the pair's verdict (NEW against OLD), speed ratios with
    intervals and calls, and what changed. `only_in` names the run of a cell without a partner.

    The repeats inside a run do not see how two runs of the same cells differ (the machine's state
    drifts: 10-40% on a shared host). `noise_run`, a repeat of OLD (the same matrix run again), or else
    `history`, a results root whose other runs repeat OLD's configurations, measures that: the drift,
    pooled over the cells and runs, widens every speed interval (adapters.contract.intervals.run_noise);
    `run_noise` says where it came from. Without one the speed calls are "cannot judge"."""
    new_root, old_root = Path(new_dir), Path(old_dir)
    unknown = sorted(set(match or ()) - set(AXES))
    if unknown:
        raise MatchError(f"--match: unknown axis {', '.join(unknown)} (known: {', '.join(AXES)})")
    old_manifest = RunStore(old_root).read_manifest()
    _, tolerances = run_settings(old_manifest, None, tolerances)
    with duckdb_connection() as con:
        new, old = read_run_cells(con, new_root), read_run_cells(con, old_root)
        new_files, old_files = cells_logprob_files(new_root, new), cells_logprob_files(old_root, old)
        new["has_logprobs"], old["has_logprobs"] = new.cell_id.isin(new_files), old.cell_id.isin(old_files)
        new["key"], old["key"] = _pair_keys(new, match, "NEW"), _pair_keys(old, match, "OLD")
        old_by_key = old.set_index("key")
        paired = new.key.isin(old_by_key.index)
        new["baseline_cell_id"] = [old_by_key.cell_id[k] if p else None for k, p in zip(new.key, paired)]
        how = "same cell id in OLD" if not match else f"same {', '.join(match)} in OLD"
        new["baseline_match"] = [how if p else "no cell of this config in OLD" for p in paired]

        old_ok = old[(old.status == "ok") & old.has_logprobs]
        both = new[paired & (new.status == "ok") & new.has_logprobs]
        both = both[both.baseline_cell_id.isin(old_ok.cell_id)]
        noise = noise_pairs(old_ok)
        pairs = pd.concat([
            pd.DataFrame({"kind": "base", "key": both.cell_id, "a_cell": both.baseline_cell_id,
                          "a_file": both.baseline_cell_id.map(old_files), "a_rep": 0, "b_cell": both.cell_id,
                          "b_file": both.cell_id.map(new_files), "b_rep": 0}),
            noise.assign(a_file=noise.a_cell.map(old_files), b_file=noise.b_cell.map(old_files)),
        ], ignore_index=True).astype({"a_rep": "int16", "b_rep": "int16"})
        pairs["pair_id"] = np.arange(len(pairs), dtype=np.int64)
        # the reference rows all come from OLD: its compacted layout locates them
        located = {c: v for c, v in RunStore(old_root).layout().compacted_rows().items()
                   if old_files.get(c) == str(v[0])}
        pm = pair_metrics(con, pairs, {}, tolerances.atol, reference_rows(old_manifest.measure), located,
                           journal_layouts(new_root, old_root))
    pm["abs_ppl_rel"] = pm["ppl_rel"].abs()

    df = new.merge(pm[pm.kind == "base"][["key", *[c for c in pm.columns if c not in (
        "kind", "key", "a_cell", "a_rep", "a_file", "b_cell", "b_rep", "b_file", "pair_id")]]]
        .rename(columns={"key": "cell_id"}), on="cell_id", how="left")
    old_row = old.set_index("cell_id")
    judge(df, pm, df.baseline_cell_id.map(old_row.engine_key), tolerances, own_floors=False)
    df.loc[df.baseline_cell_id.isna(), "verdict_reason"] = "only in NEW: no cell of this config in OLD"
    df["only_in"] = np.where(df.baseline_cell_id.isna(), "new", None)
    df["old_status"] = df.baseline_cell_id.map(old_row.status)
    noise, source = None, None
    if noise_run is not None:
        noise, source = _repeats_of(old, [Path(noise_run)], match), f"the noise run {Path(noise_run).name}"
    elif history is not None:
        noise, source = _history_noise(old, new_root, old_root, Path(history), match)
    if noise is not None and noise.empty:
        noise, source = None, None     # no configuration in common: nothing measured
    df["run_noise"] = source
    _add_cross_speed(df, old_row, noise, tolerances.speed_tolerance)
    _add_changes(df, new_root, old_root)

    gone = old[~old.key.isin(new.key)]
    if len(gone):
        rows = gone[["cell_id", *AXES, "engine_key", "status"]].rename(columns={"status": "old_status"})
        rows = rows.assign(status=None, verdict="n/a", only_in="old", baseline_cell_id=rows.cell_id,
                           verdict_reason="only in OLD: this run has no cell of this config")
        df = pd.concat([df, rows], ignore_index=True)
    first = ["cell_id", *AXES, "only_in", "status", "old_status", "verdict", "verdict_reason", "baseline_cell_id",
             *(f"{n}_{x}" for n, *_ in SPEED for x in ("ratio", "lo", "hi", "call")), "mem_ratio", "changed"]
    rest = [c for c in df.columns if c not in first and c not in ("key", "abs_ppl_rel")]
    return df[first + rest].sort_values([*CONFIG_AXES, "batch_size", "cell_id"], kind="stable", ignore_index=True)


def _repeats_of(old: pd.DataFrame, runs: list[Path], match: list[str] | None) -> pd.DataFrame:
    """OLD's ok cells beside the same configuration's ok cells in each of `runs`: one row per pair."""
    frames = []
    with duckdb_connection() as con:
        for run in runs:
            rep = read_run_cells(con, run)
            rep["key"] = _pair_keys(rep, match, run.name)
            pair = old.merge(rep[["key", "cell_id", "status", *(r for *_, r, _ in SPEED)]], on="key",
                             suffixes=("", "_rep"))
            frames.append(pair[(pair.status == "ok") & (pair.status_rep == "ok")].assign(run_rep=str(run)))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _history_noise(old: pd.DataFrame, new_root: Path, old_root: Path, history: Path,
                   match: list[str] | None) -> tuple[pd.DataFrame | None, str | None]:
    """The pairs of OLD's cells with the same configuration in the other runs under `history` that
    started before NEW, where the two cells recorded no change of provenance (the same engine, model,
    arguments and host: what differs between them is the run-to-run noise); and where it came from."""
    from orchestrator.store.runs import list_runs

    runs = list_runs(history)
    mine = {new_root.resolve(), old_root.resolve()}
    new_started = next((r.started for r in list_runs(new_root).itertuples()), None)
    others = [Path(r.path) for r in runs.itertuples() if Path(r.path).resolve() not in mine
              and r.started and (new_started is None or r.started < new_started)]
    usable = []
    for run in others:
        try:
            usable.append((run, _repeats_of(old, [run], match)))
        except MatchError:
            continue   # a run whose cells --match cannot tell apart says nothing of these configurations
    prov_old = provenance_columns(old_root)
    frames = []
    for run, pairs in usable:
        prov = provenance_columns(run)
        same = [not provenance_changes(prov_old.loc[a].to_dict(), prov.loc[b].to_dict())
                for a, b in zip(pairs.cell_id, pairs.cell_id_rep)]
        if any(same):
            frames.append(pairs[same])
    if not frames:
        return None, None
    noise = pd.concat(frames, ignore_index=True)
    return noise, f"{noise.run_rep.nunique()} earlier run(s) under {history.name}/ ({len(noise)} cell pairs)"


def _add_cross_speed(df: pd.DataFrame, old: pd.DataFrame, noise: pd.DataFrame | None, tolerance: float) -> None:
    base = old.reindex(df.baseline_cell_id)
    ok = ((df.status == "ok") & (base.status == "ok").to_numpy()).to_numpy()
    for name, col, runs, higher_better in SPEED:
        new_v, old_v = df[col].to_numpy(dtype=float), base[col].to_numpy(dtype=float)
        num = [_samples(x) if k else _samples(None) for x, k in zip(df[runs], ok)]
        run_var, run_df = (0.0, float("inf")) if noise is None else run_noise(
            [_samples(x) for x in noise[runs]], [_samples(x) for x in noise[f"{runs}_rep"]])
        df[f"{name}_run_sd"] = np.sqrt(run_var) if noise is not None else np.nan   # log sd of a run's drift
        den = [_samples(x) for x in base[runs]]
        center, lo, hi, n_new, n_old = speed_intervals(num, den, run_var, run_df)
        p = speed_p(num, den, run_var, run_df)
        # the family: this metric's tests over the run's pairs (orchestrator/judge/families.py)
        q, calls, band_lo, band_hi = family_calls(num, den, center, lo, hi, p, ~ok, tolerance, run_var, run_df)
        # the ratio the interval is about (geometric means of the repeats); one repeat a side: the cells' own
        with np.errstate(divide="ignore", invalid="ignore"):
            whole = np.where(ok & (old_v > 0), new_v / old_v, np.nan)
        df[f"{name}_ratio"] = np.where(np.isfinite(center), center, whole)
        # without a run-to-run noise estimate the interval holds the repeats alone: no call across runs
        if noise is None:
            calls = [None if c is None else "cannot judge" for c in calls]
        if not higher_better:   # a latency ratio above 1 is slower
            calls = [{"faster": "slower", "slower": "faster"}.get(c, c) for c in calls]
        df[f"{name}_lo"], df[f"{name}_hi"], df[f"{name}_call"] = lo, hi, calls
        df[f"{name}_band_lo"], df[f"{name}_band_hi"] = band_lo, band_hi
        df[f"{name}_p"], df[f"{name}_q"] = p, q
        df[f"{name}_n"] = [f"{a}/{b}" if a else None for a, b in zip(n_new, n_old)]
    mem_new, mem_old = df.peak_mem_bytes.to_numpy(dtype=float), base.peak_mem_bytes.to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        df["mem_ratio"] = np.where(ok & (mem_old > 0), mem_new / mem_old, np.nan)


def _samples(x) -> np.ndarray:
    return np.asarray(x if hasattr(x, "__len__") else [], dtype=float)


def _add_changes(df: pd.DataFrame, new_root: Path, old_root: Path) -> None:
    pn, po = provenance_columns(new_root), provenance_columns(old_root)
    changed = []
    for cid, base in zip(df.cell_id, df.baseline_cell_id):
        if base is None or base not in po.index or cid not in pn.index:
            changed.append(None)
        else:
            changed.append("; ".join(provenance_changes(po.loc[base].to_dict(), pn.loc[cid].to_dict()))
                           or "nothing recorded changed")
    df["changed"] = changed


def env_pairs(run_dir: str | Path, df: pd.DataFrame) -> pd.DataFrame:
    """The env pairs among a run's verdicts (`analyse`): each cell judged against the same configuration in
    another env (e.g. baseline env: old), with its speed-up, interval, n and test (paired where the two took
    turns: orchestrator/judge/speed.py) and what changed between the two environments (provenance_changes:
    packages, env variables, library versions, engine arguments as resolved, the host and driver)."""
    if "env" not in df or not df.env.notna().any():
        return pd.DataFrame()
    env_of = df.set_index("cell_id").env
    rows = df[df.env.notna() & df.baseline_cell_id.notna() & (df.cell_id != df.baseline_cell_id)].copy()
    rows["baseline_env"] = rows.baseline_cell_id.map(env_of)
    rows = rows[rows.baseline_env.notna() & (rows.baseline_env != rows.env)]
    if rows.empty:
        return pd.DataFrame()
    prov = provenance_columns(Path(run_dir))
    rows["changed"] = [[c for c in provenance_changes(prov.loc[b].to_dict(), prov.loc[c].to_dict())
                        if not c.startswith("env_facts.name:")] for b, c in zip(rows.baseline_cell_id, rows.cell_id)]
    return rows[["cell_id", "baseline_cell_id", "framework", "model", "quantization", "flags", "batch_size",
                 "input_len", "output_len", "env", "baseline_env", "speedup", "speedup_lo", "speedup_hi",
                 "speedup_n_cell", "speedup_n_base", "speed_test", "speed_call", "changed"]].reset_index(drop=True)
