"""The speed figures of a cell against another: speedup = output_tok_s / the other's, with a 95% CI
(speedup_lo/hi): the Welch t interval on the log ratio of the per-repeat throughputs
(adapters/contract/intervals.py; the bootstrap under-covers at 3 repeats), over speedup_n_cell /
speedup_n_base repeats (0: none); speed_call = faster / slower where the interval excludes 1; where it
holds 1, "no difference" only when it also lies within 1 / (1 + speed_tolerance) .. 1 + speed_tolerance
(the test could have seen a change of the tolerance's size), else "not distinguishable" (a change of that
size may hide in the noise); null without an interval; ttft_ratio; mem_saving = 1 - peak_mem / the other's.

An env pair (a cell and its baseline the same configuration in two matrix envs, their timed repeats taken in
turns on one node: repeat_started_at / repeat_ended_at never overlap) is paired: the interval is the t
interval of the mean log ratio of repeat i to the baseline's repeat i (n pairs, n - 1 degrees of freedom), so
host drift that falls on both sides of a pair drops out. `speed_test` says which test each interval is.

Drift inside the run: a cell whose timed batch was measured a second time later in the run
(output_tok_s_recheck_runs: each group's drift check, adapters.worker.group) shows how far the host moved between the two; pooled
over the run's re-measured cells by run_noise (adapters/contract/intervals.py, the same estimate that widens
intervals across runs), that between-measurement variance widens every Welch interval of the run (a cell
and its baseline ran minutes apart, as two measurements of one batch did); speed_drift_sd / speed_drift say
by how much and from what. A paired interval is not widened: a drift shared by both sides falls out of it.

A call whose cell or baseline had more than MAX_DISTURBED of its timed repeats disturbed by the rest of the
host (per-repeat shares in host_busy_runs / gpu_busy_runs) is `cannot judge`, and speed_reason says why.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from adapters.contract.disturbance import DISTURBED_SHARE, disturbed_repeats  # noqa: F401 (the report's too)
from adapters.contract.intervals import log_mean_intervals, log_ratio_intervals, run_noise
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


PAIRED, WELCH = "paired t", "Welch t"


def took_turns(a_start, a_end, b_start, b_end) -> bool:
    """Whether two cells' timed repeats ran in turns: as many on each side, wall-clock times recorded, and no
    repeat of one overlapping a repeat of the other."""
    spans = [list(zip(_runs(s), _runs(e))) for s, e in ((a_start, a_end), (b_start, b_end))]
    if len(spans[0]) < 2 or len(spans[0]) != len(spans[1]):
        return False
    return not any(s1 < e2 and s2 < e1 for s1, e1 in spans[0] for s2, e2 in spans[1])


def paired_intervals(num_runs: list, den_runs: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(center, lo, hi) of the 95% t interval of the geometric mean of num_i / den_i, the paired ratio."""
    center, lo, hi = (np.full(len(num_runs), np.nan) for _ in range(3))
    groups: dict[int, list[int]] = {}
    for i, (n, d) in enumerate(zip(num_runs, den_runs)):
        if len(n) >= 2 and len(n) == len(d):
            groups.setdefault(len(n), []).append(i)
    for idx in groups.values():
        ratios = np.stack([num_runs[i] for i in idx]) / np.stack([den_runs[i] for i in idx])
        center[idx], lo[idx], hi[idx] = log_mean_intervals(ratios, 0.95)
    return center, lo, hi


def env_paired(df: pd.DataFrame, base: pd.DataFrame) -> np.ndarray:
    """Which rows and their baselines are an env pair that took turns (see the module's docstring)."""
    if "env" not in df or "repeat_started_at" not in df:
        return np.zeros(len(df), bool)
    return np.array([isinstance(e, str) and isinstance(be, str) and e != be and m == "exact"
                     and took_turns(s, t, bs, bt) for e, be, m, s, t, bs, bt in zip(
                         df.env, base.env, df.baseline_match, df.repeat_started_at, df.repeat_ended_at,
                         base.repeat_started_at, base.repeat_ended_at)], bool)


def run_drift(cells: pd.DataFrame) -> tuple[float, float, str | None]:
    """(variance, degrees of freedom, source) of the drift inside one run: the log throughput of each cell
    measured twice (output_tok_s_recheck_runs beside output_tok_s_runs), pooled by run_noise, the one
    estimate of a between-measurement variance. (0, inf, None) where no cell was measured twice."""
    if "output_tok_s_recheck_runs" not in cells:
        return 0.0, math.inf, None
    pairs = [(_runs(a), _runs(b)) for a, b in zip(cells.output_tok_s_runs, cells.output_tok_s_recheck_runs)]
    pairs = [(a, b) for a, b in pairs if len(a) >= 2 and len(b) >= 2]
    if not pairs:
        return 0.0, math.inf, None
    var, dof = run_noise([a for a, _ in pairs], [b for _, b in pairs])
    return var, dof, f"{len(pairs)} cell(s) measured twice in this run"


def add_speed(df: pd.DataFrame, cells: pd.DataFrame, tolerance: float) -> None:
    b = cells.set_index("cell_id").reindex(df.baseline_cell_id)
    df["speedup"] = [ratio(x, y) for x, y in zip(df.output_tok_s, b.output_tok_s)]
    df["ttft_ratio"] = [ratio(x, y) for x, y in zip(df.ttft_ms_p50, b.ttft_ms_p50)]
    df["mem_saving"] = [1 - ratio(x, y) for x, y in zip(df.peak_mem_bytes, b.peak_mem_bytes)]
    ok = df.speedup.notna().to_numpy()
    num = [_runs(x) if k else _runs(None) for x, k in zip(df.output_tok_s_runs, ok)]
    den = [_runs(x) for x in b.output_tok_s_runs]
    drift_var, drift_df, drift_from = run_drift(cells)
    _, lo, hi, n_cell, n_base = speed_intervals(num, den, drift_var, drift_df)
    paired = env_paired(df, b) & (n_cell > 0)
    if paired.any():   # the paired ratio (its center: the geometric mean of the ratios, the same as Welch's)
        at = np.flatnonzero(paired)
        _, p_lo, p_hi = paired_intervals([num[i] for i in at], [den[i] for i in at])
        lo[paired], hi[paired] = p_lo, p_hi
    df["speedup_lo"], df["speedup_hi"], df["speedup_n_cell"], df["speedup_n_base"] = lo, hi, n_cell, n_base
    df["speed_call"] = speed_call(lo, hi, tolerance)
    df["speed_test"] = [None if not (finite(a) and finite(z)) else PAIRED if p else WELCH
                        for a, z, p in zip(lo, hi, paired)]
    widened = (df.speed_test == WELCH).to_numpy() & (drift_from is not None)
    df["speed_drift_sd"] = np.where(widened, math.sqrt(drift_var), np.nan)
    df["speed_drift"] = [drift_from if w else None for w in widened]
    withhold_busy(df, b)


# a speed call is withheld ("cannot judge") where more than this share of a side's timed repeats were disturbed
# (adapters/contract/disturbance.py: other processes took more than DISTURBED_SHARE of the engine cores or GPU):
# one disturbed repeat in six widens a t interval; more move its center, which the interval cannot show
MAX_DISTURBED = 0.25


def host_busy_reason(cell_cpu, cell_gpu, base_cpu, base_gpu) -> str | None:
    """Why the host's load leaves a speed call unjudgeable ('host busy during 4 of 6 repeats'), or None."""
    parts = []
    for side, cpu, gpu in (("", cell_cpu, cell_gpu), (" of the baseline", base_cpu, base_gpu)):
        counted = disturbed_repeats(cpu, gpu)
        if counted and counted[0] > MAX_DISTURBED * counted[1]:
            parts.append(f"host busy during {counted[0]} of {counted[1]} repeats{side}")
    return "; ".join(parts) or None


def withhold_busy(df: pd.DataFrame, base: pd.DataFrame) -> None:
    """speed_call = 'cannot judge' where the host was busy (host_busy_reason), speed_reason says so."""
    def col(frame, name):
        return frame[name].tolist() if name in frame else [None] * len(frame)
    reasons = [host_busy_reason(*x) for x in zip(col(df, "host_busy_runs"), col(df, "gpu_busy_runs"),
                                                  col(base, "host_busy_runs"), col(base, "gpu_busy_runs"))]
    df["speed_reason"] = reasons
    df["speed_call"] = [c if c is None or why is None else "cannot judge" for c, why in zip(df.speed_call, reasons)]
