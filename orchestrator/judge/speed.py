"""The speed figures of a cell against another: speedup = output_tok_s / the other's, with a 95% CI
(speedup_lo/hi): the Welch t interval on the log ratio of the per-repeat throughputs
(adapters/contract/intervals.py; the bootstrap under-covers at 3 repeats), over speedup_n_cell /
speedup_n_base repeats (0: none); speed_call = faster / slower where the interval excludes 1; where it
holds 1, "no difference" only when it also lies within 1 / (1 + speed_tolerance) .. 1 + speed_tolerance
(the test could have seen a change of the tolerance's size), else "not distinguishable" (a change of that
size may hide in the noise); null without an interval; ttft_ratio; mem_saving = 1 - peak_mem / the other's.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from adapters.contract.intervals import log_ratio_intervals
from orchestrator.values import finite


def ratio(a, b) -> float:
    return float(a) / float(b) if finite(a) and finite(b) and b else math.nan


def _runs(x) -> np.ndarray:
    return np.asarray(x if hasattr(x, "__len__") else [], dtype=float)   # None, NaN and pd.NA: no runs


def speed_intervals(num_runs: list, den_runs: list, run_var: float = 0.0, run_df: float = math.inf) -> tuple[np.ndarray, ...]:
    """(center, lo, hi, n_num, n_den) of the 95% Welch t interval on the log ratio of each cell's runs
    to its baseline's (adapters/contract/intervals.py says why not the bootstrap); the center is the ratio of
    the runs' geometric means. Cells with the same repeat counts stack into one array, so 100k cells
    are a few vectorised calls."""
    center, lo, hi = (np.full(len(num_runs), np.nan) for _ in range(3))
    n_num = np.array([len(n) if len(d) else 0 for n, d in zip(num_runs, den_runs)], dtype=np.int64)
    n_den = np.array([len(d) if len(n) else 0 for n, d in zip(num_runs, den_runs)], dtype=np.int64)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, key in enumerate(zip(n_num.tolist(), n_den.tolist())):
        if key[0] and key[1]:
            groups.setdefault(key, []).append(i)
    for idx in groups.values():
        center[idx], lo[idx], hi[idx] = log_ratio_intervals(np.stack([num_runs[i] for i in idx]),
                                                            np.stack([den_runs[i] for i in idx]), 0.95, run_var, run_df)
    return center, lo, hi, n_num, n_den


def speed_call(lo: np.ndarray, hi: np.ndarray, tolerance: float) -> list:
    """'faster' / 'slower' where the interval excludes 1 above / below; where it holds 1, 'no difference'
    if it lies within 1 / (1 + tolerance) .. 1 + tolerance, else 'not distinguishable': the test could
    not have seen a change of the tolerance's size. None where there is no interval."""
    return [None if not (finite(a) and finite(b)) else "faster" if a > 1 else "slower" if b < 1
            else "no difference" if a >= 1 / (1 + tolerance) and b <= 1 + tolerance else "not distinguishable"
            for a, b in zip(lo, hi)]


def add_speed(df: pd.DataFrame, cells: pd.DataFrame, tolerance: float) -> None:
    b = cells.set_index("cell_id").reindex(df.baseline_cell_id)
    df["speedup"] = [ratio(x, y) for x, y in zip(df.output_tok_s, b.output_tok_s)]
    df["ttft_ratio"] = [ratio(x, y) for x, y in zip(df.ttft_ms_p50, b.ttft_ms_p50)]
    df["mem_saving"] = [1 - ratio(x, y) for x, y in zip(df.peak_mem_bytes, b.peak_mem_bytes)]
    ok = df.speedup.notna().to_numpy()
    num = [_runs(x) if k else _runs(None) for x, k in zip(df.output_tok_s_runs, ok)]
    _, lo, hi, n_cell, n_base = speed_intervals(num, [_runs(x) for x in b.output_tok_s_runs])
    df["speedup_lo"], df["speedup_hi"], df["speedup_n_cell"], df["speedup_n_base"] = lo, hi, n_cell, n_base
    df["speed_call"] = speed_call(lo, hi, tolerance)
