"""What both report formats share: one run loaded for reporting (stored cells joined with the
analysis), the caps on what one page holds, the cells a table shows, the Pareto frontier, and the
number formatting and counts both print."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from orchestrator.cells import load_label
from orchestrator.store import STATUSES, RunStore

VERDICT_ORDER = ("identical", "lossless", "near-lossless", "lossy", "n/a")
_METRICS = ("verdict", "reason", "kl_mean", "max_abs", "greedy_match", "greedy_close", "top1", "ppl_rel",
            "noise_kl_mean", "noise_max_abs", "noise_greedy_match", "speedup", "speedup_lo", "speedup_hi",
            "baseline_cell_id", "baseline_match")
# What one HTML page holds and a browser still opens: a larger run is aggregated or capped, and
# the page says so (the numbers of every cell: `bench compare RUN -o cells.parquet`, `bench export`).
# report_html.py and report_md.py read them as report_data.MAX_* on each call, so they can be lowered.
MAX_POINTS = 2000       # quality-vs-speed: above this, a density of all cells plus the Pareto frontier
MAX_SERIES = 24         # throughput/latency lines: the engine configs with the highest throughput
MAX_TABLE_CELLS = 2000  # cells table (and report.md): the Pareto frontier, then the fastest cells
MAX_LISTED = 50         # cells not ok, cells not placed: listed one by one up to this, else grouped


# ------------------------------------------------------------------ data

def _finite(v: Any) -> bool:
    return isinstance(v, (int, float, np.number)) and not isinstance(v, bool) and math.isfinite(v)


def first_line(text: Any, limit: int = 200) -> str:
    if not isinstance(text, str):
        return ""
    line = next((s.strip() for s in text.splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def load(run_dir: str | Path) -> tuple[pd.DataFrame, dict, str | None]:
    """(one row per cell: stored columns + analysis columns, manifest, why the analysis failed or None)."""
    store = RunStore(run_dir)
    manifest = store.read_manifest()
    raw = store.read_cells()
    analysis_error = None
    try:
        from orchestrator.analysis import analyse

        df = analyse(store.root)
        extra = [c for c in raw.columns if c not in df.columns or c == "cell_id"]
        df = df.merge(raw[extra], on="cell_id", how="left")
    except Exception as e:  # the report must still show the speed numbers
        analysis_error = f"{type(e).__name__}: {first_line(str(e), 400)}"
        df = raw.rename(columns={"reason": "status_reason"})
        df["verdict"], df["reason"] = "n/a", "analysis unavailable"
    for col in _METRICS:
        if col not in df.columns:
            df[col] = "n/a" if col == "verdict" else np.nan
    if "status_reason" not in df.columns:
        df["status_reason"] = None
    df = df.sort_values(["framework", "model", "quantization", "flags", "batch_size", "input_len", "output_len"],
                        ignore_index=True)
    # column-wise, not a row-wise join (that alone took 18 s at 100k cells)
    df["config"] = (df["framework"].astype(str) + "/" + df["model"].astype(str) + "/"
                    + df["quantization"].astype(str) + "/" + df["flags"].astype(str)) if len(df) else ""
    df["config"] += np.where(df["mode"] == "serve", "/serve", "") if len(df) else ""
    df["load_label"] = [load_label(m, b, r, a) for m, b, r, a in zip(df["mode"], df.batch_size, df.request_rate, df.load)]
    multi_len = df[["input_len", "output_len"]].drop_duplicates().shape[0] > 1
    df["label"] = [f"{c} {lo}" + (f" in{i}/out{o}" if multi_len else "")
                   for c, lo, i, o in zip(df.config, df.load_label, df.input_len, df.output_len)]
    return df, manifest, analysis_error


def pareto_front(speedup: np.ndarray, kl: np.ndarray) -> np.ndarray:
    """Mask of the points no other point dominates (speedup >= and kl <=, one of them strictly)."""
    speedup, kl = np.asarray(speedup, dtype=float), np.asarray(kl, dtype=float)
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
    placed = df.speedup.map(_finite) & df.kl_mean.map(_finite)
    front = pd.Series(False, index=df.index)
    if placed.any():
        front[placed] = pareto_front(df.speedup[placed].to_numpy(), df.kl_mean[placed].to_numpy())
    speed = df.speedup.where(df.speedup.map(_finite), -np.inf)
    order = pd.DataFrame({"f": ~front, "s": -speed}).sort_values(["f", "s"], kind="stable").index
    shown = df.loc[sorted(order[:MAX_TABLE_CELLS])]
    note = (f"This run has {len(df):,} cells, more than one page can hold: the table shows {len(shown):,} of them, "
            f"the {int(front.sum())} on the Pareto frontier and then the fastest by speedup; the engine-config table "
            f"aggregates every cell, and every cell's numbers are in `bench compare RUN -o cells.parquet` "
            f"or `bench export RUN`.")
    return shown, note


# ------------------------------------------------------------------ formatting

def _num(v: Any, spec: str = ".3g") -> str:
    return format(v, spec) if _finite(v) else ""


def _sci(v: Any) -> str:
    if not _finite(v):
        return ""
    return "0" if v == 0 else (f"{v:.3g}" if 1e-2 <= abs(v) < 1e4 else f"{v:.2e}")


def _speed(r: dict) -> str:
    if not _finite(r["speedup"]):
        return ""
    ci = f" [{_num(r['speedup_lo'], '.2f')}, {_num(r['speedup_hi'], '.2f')}]" if _finite(r["speedup_lo"]) else ""
    return f"{r['speedup']:.2f}x{ci}"


def _ttft_disagrees(r: dict) -> bool:
    """Our TTFT and the engine's own differ by more than the contract's margin (1 ms or 10%)."""
    v = r.get("engine_ttft_agrees")
    return v is not None and not pd.isna(v) and not bool(v)


def _ttft(r: dict) -> str:
    return _num(r["ttft_ms_p50"], ".1f") + (" ⚑" if _ttft_disagrees(r) else "")


def _why(r: dict) -> str:
    if r["status"] != "ok":
        return first_line(r.get("status_reason")) or str(r["status"])
    return str(r["reason"]) if isinstance(r["reason"], str) else ""


def _status_counts(df: pd.DataFrame) -> dict[str, int]:
    counts = df.status.value_counts().to_dict()
    return {s: int(counts.pop(s, 0)) for s in STATUSES} | {str(k): int(v) for k, v in counts.items()}


def _verdict_counts(df: pd.DataFrame) -> dict[str, int]:
    counts = df.verdict.value_counts().to_dict()
    return {v: int(counts.get(v, 0)) for v in VERDICT_ORDER}
